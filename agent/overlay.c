/* Overlay mounts of any depth. The classic mount(2) option string "lowerdir=A:B:..." must fit one
 * page (4096 bytes), which a stack of ~40 layer mounts with 100-byte paths exceeds, and the new
 * mount API's fsconfig takes a string of at most 256 bytes, so even 3 layers fail there with
 * EINVAL. Linux >= 6.8 takes one lower dir per fsconfig call ("lowerdir+"), with no length limit
 * on the stack (overlayfs still caps it at 500 layers). That is used where the kernel has it; on
 * older kernels the classic string is used, with an error naming its length when it is too long. */
#define _GNU_SOURCE
#include "overlay.h"
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

/* mount(2) copies at most one page of option data */
#define CLASSIC_LIMIT 4096

static int failed(char *error, size_t size, const char *format, ...) {
  int saved = errno;
  va_list args;
  va_start(args, format);
  vsnprintf(error, size, format, args);
  va_end(args);
  errno = saved;
  return -1;
}

static int set(int fs, const char *key, const char *value) {
  return fsconfig(fs, FSCONFIG_SET_STRING, key, value, 0);
}

/* Adds each lower dir with "lowerdir+": 0, 1 when the kernel has no "lowerdir+", -1 on error. */
static int add_lowers(int fs, const char *lowers, char *error, size_t size) {
  int count = 0;
  for (const char *p = lowers; *p;) {
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    char dir[4096];
    if (len == 0 || len >= sizeof dir) return errno = EINVAL, failed(error, size, "bad lower dir in %.200s", lowers);
    memcpy(dir, p, len);
    dir[len] = 0;
    if (set(fs, "lowerdir+", dir) < 0) {
      if (count == 0 && errno == EINVAL && set(fs, "lowerdir+", "/") < 0 && errno == EINVAL) return 1;
      return failed(error, size, "bad lower dir %s (layer %d): %s", dir, count + 1, strerror(errno));
    }
    count++;
    p = colon ? colon + 1 : p + len;
  }
  if (count == 0) return errno = EINVAL, failed(error, size, "an overlay needs at least one lower dir");
  return 0;
}

/* The classic path: one option string, which must fit a page. */
static int classic_mount(const char *target, const char *lowers, const char *upper, const char *work, char *error,
                         size_t size) {
  char options[CLASSIC_LIMIT];
  int n = upper ? snprintf(options, sizeof options, "lowerdir=%s,upperdir=%s,workdir=%s", lowers, upper, work)
                : snprintf(options, sizeof options, "ro,lowerdir=%s", lowers);
  if (n < 0 || n >= CLASSIC_LIMIT)
    return errno = E2BIG,
           failed(error, size,
                  "overlay options are %d bytes, over the %d a mount takes, and this kernel has no lowerdir+ "
                  "(Linux >= 6.8): use fewer layers (flatten the stack) or shorter layer paths",
                  n, CLASSIC_LIMIT);
  if (mount("overlay", target, "overlay", 0, options) < 0)
    return failed(error, size, "cannot mount the overlay on %s: %s", target, strerror(errno));
  return 0;
}

/* -2: the kernel has no "lowerdir+" (the caller falls back to the classic string). */
static int open_with_lowerdir_plus(const char *lowers, const char *upper, const char *work, char *error,
                                   size_t size) {
  int fs = fsopen("overlay", FSOPEN_CLOEXEC);
  if (fs < 0) return errno == ENOSYS ? -2 : failed(error, size, "cannot open an overlay context: %s", strerror(errno));
  int added = add_lowers(fs, lowers, error, size);
  if (added != 0) {
    int saved = errno;
    close(fs);
    errno = saved;
    return added == 1 ? -2 : -1;
  }
  if (upper && set(fs, "upperdir", upper) < 0) {
    failed(error, size, "bad upper dir %s: %s", upper, strerror(errno));
    goto out;
  }
  if (work && set(fs, "workdir", work) < 0) {
    failed(error, size, "bad work dir %s: %s", work, strerror(errno));
    goto out;
  }
  if (fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) {
    failed(error, size, "cannot create the overlay: %s", strerror(errno));
    goto out;
  }
  int mnt = fsmount(fs, FSMOUNT_CLOEXEC, upper ? 0 : MOUNT_ATTR_RDONLY);
  if (mnt < 0) failed(error, size, "cannot mount the overlay: %s", strerror(errno));
  close(fs);
  return mnt;
out: {
  int saved = errno;
  close(fs);
  errno = saved;
  return -1;
}
}

int overlay_open(const char *lowers, const char *upper, const char *work, char *error, size_t error_size) {
  int mnt = open_with_lowerdir_plus(lowers, upper, work, error, error_size);
  if (mnt != -2) return mnt;
  /* no lowerdir+: a detached mount can still take the classic string, up to fsconfig's limit */
  int fs = fsopen("overlay", FSOPEN_CLOEXEC);
  if (fs < 0) return failed(error, error_size, "cannot open an overlay context: %s", strerror(errno));
  if (set(fs, "lowerdir", lowers) < 0 || (upper && set(fs, "upperdir", upper) < 0) ||
      (work && set(fs, "workdir", work) < 0) || fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) {
    int saved = errno;
    close(fs);
    errno = saved;
    return failed(error, error_size,
                  "cannot create the overlay of %zu bytes of lower dirs: %s (this kernel has no lowerdir+, "
                  "Linux >= 6.8, and fsconfig takes at most 255 bytes)",
                  strlen(lowers), strerror(errno));
  }
  mnt = fsmount(fs, FSMOUNT_CLOEXEC, upper ? 0 : MOUNT_ATTR_RDONLY);
  int saved = errno;
  close(fs);
  errno = saved;
  return mnt < 0 ? failed(error, error_size, "cannot mount the overlay: %s", strerror(errno)) : mnt;
}

int overlay_mount(const char *target, const char *lowers, const char *upper, const char *work, char *error,
                  size_t error_size) {
  int mnt = open_with_lowerdir_plus(lowers, upper, work, error, error_size);
  if (mnt == -2) return classic_mount(target, lowers, upper, work, error, error_size);
  if (mnt < 0) return -1;
  if (move_mount(mnt, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
    failed(error, error_size, "cannot attach the overlay at %s: %s", target, strerror(errno));
    int saved = errno;
    close(mnt);
    errno = saved;
    return -1;
  }
  close(mnt);
  return 0;
}
