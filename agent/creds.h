/* Who a request acts as: the uid, gid and supplementary groups the host resolved from the
 * sandbox's own /etc/passwd and /etc/group. Commands and file calls run with them, so the kernel's
 * own checks apply to every path. */
#ifndef SANDGYM_CREDS_H
#define SANDGYM_CREDS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "msgpack.h"

/* More than any real /etc/group gives one user; a request with more is refused. */
#define CREDS_MAX_GROUPS 256

typedef struct {
  int64_t uid, gid; /* -1: the agent's own (root): the platform's calls */
  gid_t groups[CREDS_MAX_GROUPS];
  uint32_t ngroups;
} creds;

/* Reads a request's `groups` array into c; false (the reader past the array) when it is bad. */
bool creds_read_groups(mp_reader *r, const mp_item *array, creds *c);
/* Makes this process (a child forked for one file call) c's user, with no capabilities; false
 * (with errno) when it cannot. There is no way back. */
bool creds_become(const creds *c);

#endif
