/* Overlay mounts of any depth. The classic mount(2) option string "lowerdir=A:B:..." must fit one
 * page (4096 bytes), which a stack of ~40 layer mounts with 100-byte paths exceeds, and the new
 * mount API's fsconfig takes a string of at most 256 bytes, so even 3 layers fail there with
 * EINVAL. Linux >= 6.8 takes one lower dir per fsconfig call ("lowerdir+"), with no length limit
 * on the stack (overlayfs still caps it at 500 layers). That is tried first; where the kernel
 * lacks it (a microvm's Debian 6.1 guest kernel) the classic string is used, with an error naming
 * its length when it is too long. */
#define _GNU_SOURCE
#include "overlay.h"
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

/* mount(2) copies at most one page of option data; fsconfig at most 256 bytes with the NUL */
#define CLASSIC_LIMIT 4096
#define FSCONFIG_LIMIT 255

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

/* An overlay made with one "lowerdir+" per layer, or -1 with `error` filled. *untried is set when
 * the kernel may lack "lowerdir+": overlayfs before 6.5 takes options the legacy way (fsconfig
 * accepts any key, the create refuses it with EINVAL), 6.5 to 6.7 refuse the key itself. */
static int open_with_lowerdir_plus(const char *lowers, const char *upper, const char *work, char *error,
                                   size_t size, int *untried) {
  *untried = 0;
  int fs = fsopen("overlay", FSOPEN_CLOEXEC);
  if (fs < 0) {
    *untried = errno == ENOSYS;
    return failed(error, size, "cannot open an overlay context: %s", strerror(errno));
  }
  int count = 0, result = -1;
  for (const char *p = lowers; *p;) {
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    char dir[4096];
    if (len == 0 || len >= sizeof dir) {
      errno = EINVAL;
      failed(error, size, "bad lower dir in %.200s", lowers);
      goto out;
    }
    memcpy(dir, p, len);
    dir[len] = 0;
    if (set(fs, "lowerdir+", dir) < 0) {
      *untried = count == 0 && errno == EINVAL;
      failed(error, size, "bad lower dir %s (layer %d): %s", dir, count + 1, strerror(errno));
      goto out;
    }
    count++;
    p = colon ? colon + 1 : p + len;
  }
  if (count == 0) {
    errno = EINVAL;
    failed(error, size, "an overlay needs at least one lower dir");
    goto out;
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
    *untried = errno == EINVAL;
    failed(error, size, "cannot create the overlay: %s", strerror(errno));
    goto out;
  }
  result = fsmount(fs, FSMOUNT_CLOEXEC, upper ? 0 : MOUNT_ATTR_RDONLY);
  if (result < 0) failed(error, size, "cannot mount the overlay: %s", strerror(errno));
out: {
  int saved = errno;
  close(fs);
  errno = saved;
  return result;
}
}

/* The classic path: one option string, which must fit a page. */
static int classic_mount(const char *target, const char *lowers, const char *upper, const char *work, char *error,
                         size_t size) {
  char options[CLASSIC_LIMIT];
  int n = upper ? snprintf(options, sizeof options, "lowerdir=%s,upperdir=%s,workdir=%s", lowers, upper, work)
                : snprintf(options, sizeof options, "ro,lowerdir=%s", lowers);
  if (n < 0 || n >= CLASSIC_LIMIT)
    return errno = E2BIG, failed(error, size,
                                 "overlay options are %d bytes, over the %d a mount takes: use fewer layers (flatten "
                                 "the stack) or shorter layer paths",
                                 n, CLASSIC_LIMIT);
  if (mount("overlay", target, "overlay", 0, options) < 0)
    return failed(error, size, "cannot mount the overlay on %s: %s", target, strerror(errno));
  return 0;
}

/* The classic path for a detached mount: the lower dirs as one fsconfig string. */
static int classic_open(const char *lowers, const char *upper, const char *work, char *error, size_t size) {
  if (strlen(lowers) > FSCONFIG_LIMIT)
    return errno = E2BIG, failed(error, size, "the lower dirs are %zu bytes, over the %d fsconfig takes: use fewer layers",
                                 strlen(lowers), FSCONFIG_LIMIT);
  int fs = fsopen("overlay", FSOPEN_CLOEXEC), mnt = -1;
  if (fs < 0) return failed(error, size, "cannot open an overlay context: %s", strerror(errno));
  if (set(fs, "lowerdir", lowers) < 0 || (upper && set(fs, "upperdir", upper) < 0) ||
      (work && set(fs, "workdir", work) < 0) || fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
    failed(error, size, "cannot create the overlay: %s", strerror(errno));
  else if ((mnt = fsmount(fs, FSMOUNT_CLOEXEC, upper ? 0 : MOUNT_ATTR_RDONLY)) < 0)
    failed(error, size, "cannot mount the overlay: %s", strerror(errno));
  int saved = errno;
  close(fs);
  errno = saved;
  return mnt;
}

/* After a classic retry failed too: both errors, since either may be the one that matters. */
static int both_failed(char *error, size_t size, const char *plus, const char *classic) {
  return failed(error, size, "with lowerdir+ (Linux >= 6.8): %s; with one option string: %s", plus, classic);
}

int overlay_open(const char *lowers, const char *upper, const char *work, char *error, size_t error_size) {
  int untried;
  int mnt = open_with_lowerdir_plus(lowers, upper, work, error, error_size, &untried);
  if (mnt >= 0 || !untried) return mnt;
  char plus[256];
  snprintf(plus, sizeof plus, "%s", error);
  mnt = classic_open(lowers, upper, work, error, error_size);
  if (mnt >= 0) return mnt;
  char classic[256];
  snprintf(classic, sizeof classic, "%s", error);
  return both_failed(error, error_size, plus, classic);
}

int overlay_mount(const char *target, const char *lowers, const char *upper, const char *work, char *error,
                  size_t error_size) {
  int untried;
  int mnt = open_with_lowerdir_plus(lowers, upper, work, error, error_size, &untried);
  if (mnt < 0 && untried) {
    char plus[256];
    snprintf(plus, sizeof plus, "%s", error);
    if (classic_mount(target, lowers, upper, work, error, error_size) == 0) return 0;
    char classic[256];
    snprintf(classic, sizeof classic, "%s", error);
    return both_failed(error, error_size, plus, classic);
  }
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
