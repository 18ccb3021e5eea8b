/* File requests: read, write and list inside the sandbox root. Paths are absolute, contain no
 * ".." component, and are resolved with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) so that
 * neither a symlink nor a /proc magic link can lead out of the root. The agent serves every
 * request from one thread, so nothing here may block on what the sandbox planted: every open is
 * non-blocking (a FIFO opens at once and is then refused as not a regular file), and a write's
 * temp file is a fresh random name created exclusively, never an existing node. */
#define _GNU_SOURCE
#include "files.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "channel.h"

static int root_fd = -1;

void files_init(void) { root_fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC); }

/* Whether root_fd is still the agent's own root. The host may swap the sandbox's root under the
 * agent at any time between requests (see helper.c): pivot_root moves the agent's root, not this
 * handle. The mount id tells two mounts of one folder apart (a shell's empty root is bind-mounted
 * afresh on every scrub). */
static bool root_is_current(void) {
  struct statx now, held;
  if (root_fd < 0) return false;
  if (statx(AT_FDCWD, "/", 0, STATX_INO | STATX_MNT_ID, &now) < 0) return false;
  if (statx(root_fd, "", AT_EMPTY_PATH, STATX_INO | STATX_MNT_ID, &held) < 0) return false;
  if (!(now.stx_mask & held.stx_mask & STATX_MNT_ID)) return false;
  return now.stx_mnt_id == held.stx_mnt_id && now.stx_ino == held.stx_ino;
}

/* Paths resolve in the agent's current root: a file request right after a swap finds the new one
 * without the host asking for it (what saves a create a round trip). */
static void follow_root(void) {
  if (!root_is_current()) files_reopen_root();
}

bool files_reopen_root(void) {
  int fd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  if (root_fd >= 0) close(root_fd);
  root_fd = fd;
  return true;
}

/* Copies the path into buf without its leading slashes, or explains why it is refused. */
static const char *checked_path(const mp_item *path, char *buf, size_t size) {
  if (path->type != MP_STR || path->len == 0) return "path must be a non-empty string";
  if (path->len >= size) return "path is too long";
  if (path->ptr[0] != '/') return "path must be absolute";
  if (memchr(path->ptr, 0, path->len)) return "path contains a NUL byte";
  memcpy(buf, path->ptr, path->len);
  buf[path->len] = 0;
  for (char *c = buf; *c;) {
    char *end = strchr(c, '/');
    size_t n = end ? (size_t)(end - c) : strlen(c);
    if (n == 2 && c[0] == '.' && c[1] == '.') return "path must not contain a '..' component";
    c += n;
    while (*c == '/') c++;
  }
  size_t skip = strspn(buf, "/");
  memmove(buf, buf + skip, strlen(buf + skip) + 1);
  if (buf[0] == 0) strcpy(buf, ".");
  return NULL;
}

static int open_in_root(const char *rel, int flags, mode_t mode) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = (uint64_t)(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  return (int)syscall(SYS_openat2, root_fd, rel, &how, sizeof how);
}

void file_read(uint32_t id, const mp_item *path, uint64_t max_bytes) {
  follow_root();
  char rel[4096];
  const char *why = checked_path(path, rel, sizeof rel);
  if (why) return send_error(id, "invalid_path", why);
  int fd = open_in_root(rel, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, 0);
  if (fd < 0) return send_errno(id, errno, "cannot open file");
  struct stat st;
  if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return send_error(id, S_ISDIR(st.st_mode) ? "is_directory" : "not_regular_file",
                      S_ISDIR(st.st_mode) ? "path is a directory" : "path is not a regular file (a FIFO, socket or device)");
  }
  if ((uint64_t)st.st_size > max_bytes) {
    close(fd);
    char message[128];
    snprintf(message, sizeof message, "file is larger than the %llu-byte read limit", (unsigned long long)max_bytes);
    return send_error(id, "file_too_large", message);
  }
  size_t cap = 65536, len = 0;
  uint8_t *buf = malloc(cap);
  for (;;) {
    if (!buf) break;
    if (len == cap) {
      if (cap > max_bytes) break;
      uint8_t *grown = realloc(buf, cap * 2);
      if (!grown) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = grown;
      cap *= 2;
    }
    ssize_t k = read(fd, buf + len, cap - len);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    len += (size_t)k;
  }
  close(fd);
  if (!buf) return send_error(id, "io_error", "out of memory while reading the file");
  if (len > max_bytes) {
    free(buf);
    char message[128];
    snprintf(message, sizeof message, "file is larger than the %llu-byte read limit", (unsigned long long)max_bytes);
    return send_error(id, "file_too_large", message);
  }
  mp_writer w;
  reply_begin(&w, "ok", id, 1);
  mp_str(&w, "data");
  mp_bin(&w, buf, len);
  free(buf);
  channel_send(&w);
}

/* Creates every missing parent directory of rel, one component at a time inside the root. */
static int make_parents(char *rel) {
  for (char *slash = strchr(rel, '/'); slash; slash = strchr(slash + 1, '/')) {
    *slash = 0;
    int fd = open_in_root(rel, O_PATH | O_DIRECTORY, 0);
    if (fd >= 0) {
      close(fd);
    } else if (errno == ENOENT) {
      if (mkdirat(root_fd, rel, 0755) < 0 && errno != EEXIST) {
        *slash = '/';
        return -1;
      }
    } else {
      *slash = '/';
      return -1;
    }
    *slash = '/';
  }
  return 0;
}

/* Creates a temp file beside rel under a random name that did not exist: O_EXCL never opens a
 * FIFO or anything else the sandbox put there, and O_NONBLOCK keeps even that from waiting. */
static int create_temp_beside(const char *rel, char *tmp, size_t size, uint32_t mode) {
  const char *slash = strrchr(rel, '/');
  int dir_len = slash ? (int)(slash - rel + 1) : 0;
  for (int attempt = 0; attempt < 16; attempt++) {
    uint64_t nonce = 0;
    /* GRND_NONBLOCK: a VM guest early in its boot must not wait for entropy just to name a file */
    if (getrandom(&nonce, sizeof nonce, GRND_NONBLOCK) != sizeof nonce) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      nonce = ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)attempt << 56);
    }
    snprintf(tmp, size, "%.*s.sandgym-write-%016llx", dir_len, rel, (unsigned long long)nonce);
    int fd = open_in_root(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY, mode & 07777);
    if (fd >= 0 || errno != EEXIST) return fd;
  }
  errno = EEXIST;
  return -1;
}

/* Writes rel (already checked) whole: a temp file beside it, renamed into place. 0, or an errno
 * with *what naming the step that failed. */
static int write_whole(char *rel, const uint8_t *p, size_t n, uint32_t mode, const char **what) {
  char tmp[4200];
  *what = "cannot create parent directory";
  if (make_parents(rel) < 0) return errno;
  *what = "cannot create file";
  int fd = create_temp_beside(rel, tmp, sizeof tmp, mode);
  if (fd < 0) return errno;
  *what = "cannot write file";
  while (n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      int err = errno;
      close(fd);
      unlinkat(root_fd, tmp, 0);
      return err;
    }
    p += k;
    n -= (size_t)k;
  }
  fchmod(fd, mode & 07777); /* the umask must not narrow the mode the caller asked for */
  close(fd);
  *what = "cannot replace file";
  if (renameat(root_fd, tmp, root_fd, rel) < 0) {
    int err = errno;
    unlinkat(root_fd, tmp, 0);
    return err;
  }
  return 0;
}

void file_write(uint32_t id, const mp_item *path, const mp_item *data, uint32_t mode) {
  follow_root();
  char rel[4096];
  const char *why = checked_path(path, rel, sizeof rel);
  if (why) return send_error(id, "invalid_path", why);
  if (data->type != MP_BIN && data->type != MP_STR) return send_error(id, "bad_request", "data must be binary");
  const char *what;
  int err = write_whole(rel, data->ptr, data->len, mode, &what);
  if (err) return send_errno(id, err, what);
  send_ok(id);
}

/* Makes rel's parent folders as root's own: each a folder (never a symlink) that root owns and no
 * one else may write, made 0755 where missing. 0, or an errno. */
static int root_parents(char *rel) {
  for (char *slash = strchr(rel, '/'); slash; slash = strchr(slash + 1, '/')) {
    *slash = 0;
    if (mkdirat(root_fd, rel, 0755) < 0 && errno != EEXIST) {
      *slash = '/';
      return errno;
    }
    int fd = open_in_root(rel, O_PATH | O_DIRECTORY | O_NOFOLLOW, 0);
    *slash = '/';
    struct stat st;
    bool own = fd >= 0 && fstat(fd, &st) == 0 && st.st_uid == 0 && !(st.st_mode & 022);
    if (fd >= 0) close(fd);
    if (!own) return EPERM;
  }
  return 0;
}

int files_put(const char *path, const char *text, uint32_t mode) {
  follow_root();
  char rel[4096];
  mp_item item = {.type = MP_STR, .ptr = (const uint8_t *)path, .len = (uint32_t)strlen(path)};
  if (checked_path(&item, rel, sizeof rel)) return EINVAL;
  /* the agent's own file: nothing the sandbox made may stand in for its folders (a symlink to
   * /etc, a folder a user could write and so fill with a value of its own) */
  int err = root_parents(rel);
  if (err) return err;
  const char *what;
  return write_whole(rel, (const uint8_t *)text, strlen(text), mode, &what);
}

/* A listing stops at this many entries or bytes of entries, far below the channel's frame limit
 * (a folder of millions of long names would not fit in one reply) and says it stopped. */
#define LIST_MAX_ENTRIES 50000u
#define LIST_MAX_BYTES (16u << 20)

static const char *type_name(mode_t mode) {
  if (S_ISREG(mode)) return "file";
  if (S_ISDIR(mode)) return "dir";
  if (S_ISLNK(mode)) return "symlink";
  return "other";
}

void file_list(uint32_t id, const mp_item *path) {
  follow_root();
  char rel[4096];
  const char *why = checked_path(path, rel, sizeof rel);
  if (why) return send_error(id, "invalid_path", why);
  int fd = open_in_root(rel, O_RDONLY | O_DIRECTORY | O_NONBLOCK, 0);
  if (fd < 0) return send_errno(id, errno, "cannot open directory");
  DIR *dir = fdopendir(fd);
  if (!dir) {
    close(fd);
    return send_errno(id, errno, "cannot read directory");
  }
  mp_writer entries;
  mp_writer_init(&entries);
  uint32_t count = 0;
  bool truncated = false;
  for (struct dirent *e; (e = readdir(dir));) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (count >= LIST_MAX_ENTRIES || entries.len >= LIST_MAX_BYTES) {
      truncated = true;
      break;
    }
    struct stat st;
    if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) continue;
    mp_map(&entries, 4);
    mp_str(&entries, "name");
    mp_str(&entries, e->d_name);
    mp_str(&entries, "type");
    mp_str(&entries, type_name(st.st_mode));
    mp_str(&entries, "size");
    mp_uint(&entries, (uint64_t)st.st_size);
    mp_str(&entries, "mode");
    mp_uint(&entries, st.st_mode & 07777);
    count++;
  }
  closedir(dir);
  /* the entries were encoded apart because their count is known only at the end */
  mp_writer w;
  reply_begin(&w, "ok", id, truncated ? 2 : 1);
  if (truncated) {
    mp_str(&w, "truncated");
    mp_bool(&w, true);
  }
  mp_str(&w, "entries");
  mp_array(&w, count);
  mp_raw(&w, entries.data, entries.len);
  mp_writer_free(&entries);
  channel_send(&w);
}
