/* Host-side modes of the agent binary. They exist so that the node never needs a mount program
 * per operation and never sets up loop devices.
 *
 *   sandgym-agent mount-erofs IMAGE TARGET
 *
 * mounts an EROFS image file read-only at TARGET straight from the file (file-backed EROFS).
 *
 *   sandgym-agent mount-overlay TARGET LOWERS [UPPER WORK]
 *
 * mounts an overlay of LOWERS (colon-separated, top first) at TARGET, read-only without UPPER
 * and WORK, with one lower dir per fsconfig call where the kernel can (overlay.c): a deep stack
 * does not fit the `mount` program's single option string.
 *
 * Launch mode:
 *
 *   sandgym-agent launch [--join-cgroup PROCS_FILE]... [--lowers-are-erofs]
 *                        [--overlay LOWERS UPPER WORK TARGET]
 *                        [--umount PATH]... -- PROGRAM ARG...
 *
 * It joins the given cgroups, enters a private mount namespace of its own, mounts the sandbox's
 * overlay root there (so the node's namespace never holds per-sandbox mounts and creating the next
 * sandbox does not get slower), detaches the given mounts (the hybrid cgroup2 mount that Debian's
 * crun refuses), then executes PROGRAM (the OCI runtime). Benchmarks run their crun baselines
 * through it; the node starts its own containers through the helper (helper.c), which does the
 * same in a forked child. When the runtime exits, the namespace
 * and the overlay mount go with it: nothing is left to unmount after a crash. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/vfs.h>
#include <unistd.h>
#include "overlay.h"

#define EROFS_SUPER_MAGIC_V1 0xE0F5E1E2

static int fail(const char *what, const char *arg) {
  fprintf(stderr, "sandgym-agent launch: %s %s: %s\n", what, arg ? arg : "", strerror(errno));
  return 125;
}

int mount_erofs_main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: sandgym-agent mount-erofs IMAGE TARGET\n");
    return 2;
  }
  if (mount(argv[1], argv[2], "erofs", MS_RDONLY | MS_NODEV | MS_NOSUID, NULL) < 0) return fail("cannot mount EROFS image", argv[1]);
  return 0;
}

int mount_overlay_main(int argc, char **argv) {
  if (argc != 3 && argc != 5) {
    fprintf(stderr, "usage: sandgym-agent mount-overlay TARGET LOWERS [UPPER WORK]\n");
    return 2;
  }
  char error[512];
  if (overlay_mount(argv[1], argv[2], argc == 5 ? argv[3] : NULL, argc == 5 ? argv[4] : NULL, error, sizeof error) < 0) {
    fprintf(stderr, "sandgym-agent mount-overlay: %s\n", error);
    return 125;
  }
  return 0;
}

static int join_cgroup(const char *procs_file) {
  int fd = open(procs_file, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = write(fd, "0", 1);
  close(fd);
  return n == 1 ? 0 : -1;
}

int launch_main(int argc, char **argv) {
  const char *joins[16], *umounts[16];
  int njoins = 0, numounts = 0;
  const char *lowers = NULL, *upper = NULL, *work = NULL, *target = NULL;
  int check_erofs = 0;

  int i = 1;
  for (; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      i++;
      break;
    } else if (strcmp(argv[i], "--join-cgroup") == 0 && i + 1 < argc && njoins < 16) {
      joins[njoins++] = argv[++i];
    } else if (strcmp(argv[i], "--umount") == 0 && i + 1 < argc && numounts < 16) {
      umounts[numounts++] = argv[++i];
    } else if (strcmp(argv[i], "--lowers-are-erofs") == 0) {
      check_erofs = 1;
    } else if (strcmp(argv[i], "--overlay") == 0 && i + 4 < argc) {
      lowers = argv[++i], upper = argv[++i], work = argv[++i], target = argv[++i];
    } else {
      fprintf(stderr, "sandgym-agent launch: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (i >= argc) {
    fprintf(stderr, "sandgym-agent launch: missing -- PROGRAM\n");
    return 2;
  }
  for (int k = 0; k < njoins; k++)
    if (join_cgroup(joins[k]) < 0) return fail("cannot join cgroup", joins[k]);
  if (unshare(CLONE_NEWNS) < 0) return fail("cannot create mount namespace", NULL);
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return fail("cannot make mounts private", NULL);
  if (lowers) {
    /* A layer mount that vanished (unmounted by a concurrent gc) would leave an empty lower dir
     * and a sandbox with a silently wrong root. Refuse instead; the caller mounts it again. */
    for (const char *p = lowers; check_erofs && *p;) {
      const char *colon = strchr(p, ':');
      char dir[1024];
      int len = colon ? (int)(colon - p) : (int)strlen(p);
      snprintf(dir, sizeof dir, "%.*s", len, p);
      struct statfs fs;
      if (statfs(dir, &fs) < 0 || fs.f_type != EROFS_SUPER_MAGIC_V1) {
        fprintf(stderr, "sandgym-agent launch: layer mount %s is missing\n", dir);
        return 124;
      }
      p = colon ? colon + 1 : p + len;
    }
    char error[512];
    if (overlay_mount(target, lowers, upper, work, error, sizeof error) < 0) {
      fprintf(stderr, "sandgym-agent launch: %s\n", error);
      return 125;
    }
  }
  for (int k = 0; k < numounts; k++)
    if (umount2(umounts[k], MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT) return fail("cannot unmount", umounts[k]);
  execv(argv[i], argv + i);
  return fail("cannot execute", argv[i]);
}
