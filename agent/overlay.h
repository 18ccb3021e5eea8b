/* Overlay mounts of any depth (overlay.c). */
#ifndef SANDGYM_OVERLAY_H
#define SANDGYM_OVERLAY_H
#include <stddef.h>

/* A detached overlay mount (an fd for move_mount), or -1 with errno set and `error` saying what
 * failed. LOWERS is a colon-separated list of lower dirs, top first; UPPER and WORK may both be
 * NULL for a read-only overlay. */
int overlay_open(const char *lowers, const char *upper, const char *work, char *error, size_t error_size);

/* The same overlay mounted at TARGET: 0, or -1 with errno set and `error` filled. */
int overlay_mount(const char *target, const char *lowers, const char *upper, const char *work, char *error,
                  size_t error_size);

#endif
