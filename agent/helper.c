/* Host-side helper mode of the agent binary: one long-lived process per node that starts
 * containers (request `launch`, below) and swaps the root filesystem of a live sandbox. It is the
 * subreaper of every sandbox it starts. This is what makes warm sandboxes possible: a pooled "shell"
 * (namespaces, cgroups, agent running) is given a tenant's layer stack, and a destroyed tenant's
 * sandbox is given back an empty root, without restarting anything.
 *
 *   sandgym-agent helper
 *
 * reads one request per line on stdin, fields separated by tabs:
 *
 *   ID launch DIR JOINS UMOUNT LOWERS CHECK_EROFS RUNTIME RUNTIME_ROOT SLOT   (see launch())
 *   ID attach PID overlay LOWERS UPPER WORK CHECK_EROFS DEV   (CHECK_EROFS: 0 or 1)
 *   ID attach PID bind DIR                                    (DIR is mounted read-only)
 *   ID subvol PATH LIMIT                                      (see subvol(); answers the subvolume id)
 *   ID snapshot SOURCE DEST                                   (see snapshot())
 *   ID unsubvol PATH                                          (see unsubvol())
 *   ID clearopaque PATH...                                    (see clear_opaque(); answers how many)
 *
 * DEV is "fresh" or "keep": a scrub between tenants always builds a fresh /dev and purges IPC,
 * so handing a scrubbed shell to its next tenant may keep both as they are.
 *
 * It answers each with one line on stdout: "ID\tok" (or "ID\tok\tVALUE") or "ID\terror\tMESSAGE". Every request runs
 * in a forked child, because entering a sandbox's mount namespace cannot be undone; the helper
 * itself exits when stdin closes. Node never forks itself per request (fork of a large Node process
 * costs 9-27 ms here); a fork of this small process costs well under a millisecond.
 *
 * An attach, inside the sandbox's mount and IPC namespaces:
 *   1. builds the new root as a detached mount (overlay of the given dirs, or a read-only bind),
 *      from host paths resolved before entering the sandbox;
 *   2. mounts it on a staging dir of the current root and moves /proc and /sys (with their masked
 *      and read-only submounts) into it;
 *   3. gives it a fresh /dev (the standard device nodes, new devpts, /dev/shm and /dev/mqueue) and
 *      moves the agent binary's bind mount across (or, with DEV "keep", moves /dev as it is);
 *   4. removes every System V IPC object and POSIX message queue of the sandbox's IPC namespace
 *      (not with DEV "keep");
 *   5. pivots to the new root and detaches the old one with everything on it.
 * pivot_root moves the root and working directory of every process of the namespace that was on
 * the old root, so the agent (pid 1) finds itself on the new root. The caller ends every other
 * process first (agent op `reset`), so nothing of a previous tenant survives the swap. */
#define _GNU_SOURCE
#include <dirent.h>
#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>
#include <sys/ioctl.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>
#include "overlay.h"

#define EROFS_SUPER_MAGIC_V1 0xE0F5E1E2
#define STAGE "/.sandgym-stage"
#define AGENT_IN_SANDBOX "/dev/.sandgym-agent"
#define MAX_FIELDS 12
#define MAX_RUNNING 1024
/* a sandbox's devpts cap: SANDBOX_MAX_PTYS in src/backends/container/oci-config.ts */
#define SANDBOX_MAX_PTYS "256"

static const char *request_id = "?";
/* Where answers go: the helper's stdout, kept aside when a launch points stdout at a log. */
static int answer_fd = 1;

/* One line, one write: lines under PIPE_BUF from many children never interleave. With code 0,
 * a non-null format is the answer's value. */
static _Noreturn void answer(int code, const char *format, ...) {
  char line[2048];
  int n;
  if (code == 0 && format == NULL) {
    n = snprintf(line, sizeof line, "%s\tok\n", request_id);
  } else if (code == 0) {
    char value[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(value, sizeof value, format, args);
    va_end(args);
    n = snprintf(line, sizeof line, "%s\tok\t%s\n", request_id, value);
  } else {
    char message[1024];
    va_list args;
    va_start(args, format);
    vsnprintf(message, sizeof message, format, args);
    va_end(args);
    for (char *c = message; *c; c++)
      if (*c == '\n' || *c == '\t') *c = ' ';
    n = snprintf(line, sizeof line, "%s\terror\t%s\n", request_id, message);
  }
  if (n > 0) (void)!write(answer_fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
  _exit(code);
}

#define CHECK(call, ...)                                                        \
  do {                                                                          \
    if ((call) < 0) answer(1, __VA_ARGS__);                                     \
  } while (0)

static void check_erofs_lowers(const char *lowers) {
  for (const char *p = lowers; *p;) {
    const char *colon = strchr(p, ':');
    int len = colon ? (int)(colon - p) : (int)strlen(p);
    char dir[1024];
    snprintf(dir, sizeof dir, "%.*s", len, p);
    struct statfs fs;
    if (statfs(dir, &fs) < 0 || fs.f_type != EROFS_SUPER_MAGIC_V1) answer(1, "layer mount %s is missing", dir);
    p = colon ? colon + 1 : p + len;
  }
}

/* The new root as a mount that is attached nowhere yet. */
static int detached_root(char **f, int nfields) {
  if (nfields == 9 && strcmp(f[3], "overlay") == 0) {
    if (strcmp(f[7], "1") == 0) check_erofs_lowers(f[4]);
    char error[512];
    int mnt = overlay_open(f[4], f[5], f[6], error, sizeof error);
    if (mnt < 0) answer(1, "%s", error);
    return mnt;
  }
  if (nfields == 5 && strcmp(f[3], "bind") == 0) {
    int mnt = open_tree(AT_FDCWD, f[4], OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    CHECK(mnt, "cannot bind %s: %s", f[4], strerror(errno));
    struct mount_attr attr = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
    CHECK(mount_setattr(mnt, "", AT_EMPTY_PATH, &attr, sizeof attr), "cannot make %s read-only: %s", f[4], strerror(errno));
    return mnt;
  }
  answer(2, "malformed attach request");
}

static void ensure_dir(const char *path, mode_t mode) {
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (S_ISDIR(st.st_mode)) return;
    /* something else sits there (a previous tenant's file or symlink): replace it */
    CHECK(unlink(path), "cannot replace %s: %s", path, strerror(errno));
  }
  CHECK(mkdir(path, mode), "cannot create %s: %s", path, strerror(errno));
}

/* A sandbox's writable storage on the node's btrfs scratch volume: PATH becomes a subvolume (its
 * parent folder made first; an existing subvolume is kept) whose quota group may reference at
 * most LIMIT bytes ("none": no cap). Answers the subvolume id, which names its quota group in
 * sysfs. Three ioctls, where the btrfs program would cost three processes. */
static void subvol(char **f, int n) {
  if (n != 4) answer(2, "malformed subvol request");
  char parent[4096];
  if (snprintf(parent, sizeof parent, "%s", f[2]) >= (int)sizeof parent) answer(2, "path too long");
  char *slash = strrchr(parent, '/');
  if (!slash || slash == parent || strlen(slash + 1) >= BTRFS_PATH_NAME_MAX) answer(2, "bad subvolume path %s", f[2]);
  *slash = 0;
  const char *name = slash + 1;
  if (mkdir(parent, 0755) < 0 && errno != EEXIST) answer(1, "cannot create %s: %s", parent, strerror(errno));
  int dir = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  CHECK(dir, "cannot open %s: %s", parent, strerror(errno));
  struct btrfs_ioctl_vol_args create = {0};
  memcpy(create.name, name, strlen(name));
  if (ioctl(dir, BTRFS_IOC_SUBVOL_CREATE, &create) < 0 && errno != EEXIST)
    answer(1, "cannot create the subvolume %s: %s", f[2], strerror(errno));
  int fd = open(f[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  CHECK(fd, "cannot open %s: %s", f[2], strerror(errno));
  /* qgroup id 0: the quota group of the subvolume fd is in; all ones clears the cap */
  struct btrfs_ioctl_qgroup_limit_args limit = {0};
  limit.lim.flags = BTRFS_QGROUP_LIMIT_MAX_RFER;
  limit.lim.max_rfer = strcmp(f[3], "none") == 0 ? (__u64)-1 : strtoull(f[3], NULL, 10);
  CHECK(ioctl(fd, BTRFS_IOC_QGROUP_LIMIT, &limit), "cannot cap %s: %s", f[2], strerror(errno));
  struct btrfs_ioctl_ino_lookup_args lookup = {0};
  lookup.objectid = BTRFS_FIRST_FREE_OBJECTID;
  CHECK(ioctl(fd, BTRFS_IOC_INO_LOOKUP, &lookup), "cannot read the id of %s: %s", f[2], strerror(errno));
  answer(0, "%llu", (unsigned long long)lookup.treeid);
}

/* Splits PATH into its parent folder (opened) and its last component, which must fit a btrfs name. */
static int open_parent(const char *path, char *parent, size_t size, const char **name) {
  if (snprintf(parent, size, "%s", path) >= (int)size) answer(2, "path too long");
  char *slash = strrchr(parent, '/');
  if (!slash || slash == parent || strlen(slash + 1) >= BTRFS_PATH_NAME_MAX) answer(2, "bad subvolume path %s", path);
  *slash = 0;
  *name = slash + 1;
  int dir = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  CHECK(dir, "cannot open %s: %s", parent, strerror(errno));
  return dir;
}

/* A read-write snapshot of subvolume SOURCE at DEST: a private copy of a sandbox's writable layer,
 * made in one ioctl whatever its size, that a packer may prune without touching the sandbox. */
static void snapshot(char **f, int n) {
  if (n != 4) answer(2, "malformed snapshot request");
  char parent[4096];
  const char *name;
  int dir = open_parent(f[3], parent, sizeof parent, &name);
  int source = open(f[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  CHECK(source, "cannot open %s: %s", f[2], strerror(errno));
  struct btrfs_ioctl_vol_args_v2 args = {0};
  args.fd = source;
  memcpy(args.name, name, strlen(name));
  CHECK(ioctl(dir, BTRFS_IOC_SNAP_CREATE_V2, &args), "cannot snapshot %s: %s", f[2], strerror(errno));
  answer(0, NULL);
}

/* Deletes subvolume PATH with everything in it, as btrfs does: at once, the space freed later. */
static void unsubvol(char **f, int n) {
  if (n != 3) answer(2, "malformed unsubvol request");
  char parent[4096];
  const char *name;
  int dir = open_parent(f[2], parent, sizeof parent, &name);
  struct btrfs_ioctl_vol_args args = {0};
  memcpy(args.name, name, strlen(name));
  if (ioctl(dir, BTRFS_IOC_SNAP_DESTROY, &args) < 0 && errno != ENOENT)
    answer(1, "cannot delete the subvolume %s: %s", f[2], strerror(errno));
  answer(0, NULL);
}

/* Makes each PATH, an overlay upper folder, transparent again: its opaque mark goes, so what the
 * layers below hold shows through it. Answers one flag per path, 1 where it had the mark. */
static void clear_opaque(char **f, int n) {
  char flags[MAX_FIELDS + 1] = "";
  for (int i = 2; i < n; i++) {
    bool had = lremovexattr(f[i], "trusted.overlay.opaque") == 0;
    if (!had && errno != ENODATA && errno != ENOENT)
      answer(1, "cannot clear the opaque mark of %s: %s", f[i], strerror(errno));
    flags[i - 2] = had ? '1' : '0';
    flags[i - 1] = 0;
  }
  answer(0, "%s", flags[0] ? flags : "-");
}

/* The device nodes and links of an OCI container's /dev, on a fresh tmpfs. */
static void build_dev(const char *dev) {
  char path[512];
  CHECK(mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_STRICTATIME, "mode=755,size=65536k"), "cannot mount %s: %s", dev, strerror(errno));
  static const struct {
    const char *name;
    unsigned major, minor;
  } nodes[] = {{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}};
  for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dev, nodes[i].name);
    CHECK(mknod(path, S_IFCHR | 0666, makedev(nodes[i].major, nodes[i].minor)), "cannot create %s: %s", path, strerror(errno));
  }
  static const char *links[][2] = {{"core", "/proc/kcore"},          {"fd", "/proc/self/fd"},
                                   {"stdin", "/proc/self/fd/0"},     {"stdout", "/proc/self/fd/1"},
                                   {"stderr", "/proc/self/fd/2"},    {"ptmx", "pts/ptmx"}};
  for (size_t i = 0; i < sizeof links / sizeof links[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", dev, links[i][0]);
    CHECK(symlink(links[i][1], path), "cannot create %s: %s", path, strerror(errno));
  }
  snprintf(path, sizeof path, "%s/pts", dev);
  CHECK(mkdir(path, 0755), "cannot create %s: %s", path, strerror(errno));
  CHECK(mount("devpts", path, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,max=" SANDBOX_MAX_PTYS), "cannot mount %s: %s", path, strerror(errno));
  snprintf(path, sizeof path, "%s/shm", dev);
  CHECK(mkdir(path, 01777), "cannot create %s: %s", path, strerror(errno));
  CHECK(mount("shm", path, "tmpfs", MS_NOSUID | MS_NOEXEC | MS_NODEV, "mode=1777,size=65536k"), "cannot mount %s: %s", path, strerror(errno));
  snprintf(path, sizeof path, "%s/mqueue", dev);
  CHECK(mkdir(path, 01777), "cannot create %s: %s", path, strerror(errno));
  /* mqueue shows the IPC namespace of the process that mounts it: the sandbox's, entered above */
  CHECK(mount("mqueue", path, "mqueue", MS_NOSUID | MS_NOEXEC | MS_NODEV, NULL), "cannot mount %s: %s", path, strerror(errno));
  snprintf(path, sizeof path, "%s/.sandgym-agent", dev);
  int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0755);
  CHECK(fd, "cannot create %s: %s", path, strerror(errno));
  close(fd);
  CHECK(mount(AGENT_IN_SANDBOX, path, NULL, MS_MOVE, NULL), "cannot move the agent binary: %s", strerror(errno));
}

/* Every System V object and POSIX queue of the sandbox's IPC namespace outlives the processes that
 * made them; a next tenant must not find them. */
static void purge_ipc(const char *mqueue_dir) {
  struct shm_info shm;
  int max = shmctl(0, SHM_INFO, (struct shmid_ds *)(void *)&shm);
  for (int i = 0; i <= max; i++) {
    struct shmid_ds ds;
    int id = shmctl(i, SHM_STAT_ANY, &ds);
    if (id >= 0) shmctl(id, IPC_RMID, NULL);
  }
  struct msginfo msg;
  max = msgctl(0, MSG_INFO, (struct msqid_ds *)(void *)&msg);
  for (int i = 0; i <= max; i++) {
    struct msqid_ds ds;
    int id = msgctl(i, MSG_STAT_ANY, &ds);
    if (id >= 0) msgctl(id, IPC_RMID, NULL);
  }
  struct seminfo sem;
  max = semctl(0, 0, SEM_INFO, &sem);
  for (int i = 0; i <= max; i++) {
    struct semid_ds ds;
    int id = semctl(i, 0, SEM_STAT_ANY, &ds);
    if (id >= 0) semctl(id, 0, IPC_RMID);
  }
  DIR *queues = opendir(mqueue_dir);
  if (!queues) answer(1, "cannot list %s: %s", mqueue_dir, strerror(errno));
  for (struct dirent *e; (e = readdir(queues));)
    if (e->d_name[0] != '.') unlinkat(dirfd(queues), e->d_name, 0);
  closedir(queues);
}

static int open_namespace(pid_t pid, const char *kind) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/ns/%s", (int)pid, kind);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  CHECK(fd, "cannot open %s: %s", path, strerror(errno));
  return fd;
}

static _Noreturn void attach(char **f, int nfields) {
  umask(0);
  if (nfields < 4) answer(2, "malformed attach request");
  pid_t pid = (pid_t)atoi(f[2]);
  if (pid <= 1) answer(2, "bad pid %s", f[2]);
  int root = detached_root(f, nfields);
  int ipc = open_namespace(pid, "ipc"), mnt = open_namespace(pid, "mnt");
  CHECK(setns(ipc, CLONE_NEWIPC), "cannot enter the IPC namespace of %d: %s", (int)pid, strerror(errno));
  CHECK(setns(mnt, CLONE_NEWNS), "cannot enter the mount namespace of %d: %s", (int)pid, strerror(errno));
  ensure_dir(STAGE, 0700);
  CHECK(move_mount(root, "", AT_FDCWD, STAGE, MOVE_MOUNT_F_EMPTY_PATH), "cannot attach the new root: %s", strerror(errno));
  ensure_dir(STAGE "/proc", 0555);
  ensure_dir(STAGE "/sys", 0555);
  ensure_dir(STAGE "/dev", 0755);
  CHECK(mount("/proc", STAGE "/proc", NULL, MS_MOVE, NULL), "cannot move /proc: %s", strerror(errno));
  CHECK(mount("/sys", STAGE "/sys", NULL, MS_MOVE, NULL), "cannot move /sys: %s", strerror(errno));
  if (nfields == 9 && strcmp(f[8], "keep") == 0) {
    CHECK(mount("/dev", STAGE "/dev", NULL, MS_MOVE, NULL), "cannot move /dev: %s", strerror(errno));
  } else {
    build_dev(STAGE "/dev");
    purge_ipc(STAGE "/dev/mqueue");
  }
  CHECK(chdir(STAGE), "cannot enter the new root: %s", strerror(errno));
  CHECK(syscall(SYS_pivot_root, ".", "."), "cannot pivot to the new root: %s", strerror(errno));
  CHECK(umount2(".", MNT_DETACH), "cannot detach the old root: %s", strerror(errno));
  answer(0, NULL);
}

/* Joins each cgroup of a colon-separated list of cgroup.procs files. */
static void join_cgroups(char *list) {
  for (char *file = strtok(list, ":"); file; file = strtok(NULL, ":")) {
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0", 1) != 1) answer(1, "cannot join cgroup %s: %s", file, strerror(errno));
    close(fd);
  }
}

/* The FIFO pair of the sandbox's channel, created afresh; returns the agent's ends. */
static void agent_channel(const char *dir, int *requests, int *responses) {
  char path[1024];
  snprintf(path, sizeof path, "%s/agent.requests", dir);
  unlink(path);
  CHECK(mkfifo(path, 0600), "cannot create %s: %s", path, strerror(errno));
  /* non-blocking: no writer yet; the agent polls until the node opens its end */
  *requests = open(path, O_RDONLY | O_NONBLOCK);
  CHECK(*requests, "cannot open %s: %s", path, strerror(errno));
  snprintf(path, sizeof path, "%s/agent.responses", dir);
  unlink(path);
  CHECK(mkfifo(path, 0600), "cannot create %s: %s", path, strerror(errno));
  /* read-write: opening does not wait for the node's reader, and the agent's "ready" waits in the pipe */
  *responses = open(path, O_RDWR);
  CHECK(*responses, "cannot open %s: %s", path, strerror(errno));
}

/* Starts a container:
 *
 *   ID launch DIR JOINS UMOUNT LOWERS CHECK_EROFS RUNTIME RUNTIME_ROOT SLOT
 *
 * DIR is the bundle, with the FIFO channel, runtime.log, and (with LOWERS) upper, work and rootfs;
 * JOINS a colon-separated list of cgroup.procs files or "-"; UMOUNT a mount to detach (the hybrid
 * cgroup2 mount Debian's crun refuses) or "-"; LOWERS the overlay's lower dirs, top first, or "-"
 * when the bundle names its own root. Like `sandgym-agent launch` (launch.c), the overlay is
 * mounted in a mount namespace of this child alone, which ends with it. The runtime starts the
 * container detached; its first process is handed to the helper, the subreaper of every sandbox,
 * so no process per sandbox stays besides the sandbox's own. */
static _Noreturn void launch(char **f, int n) {
  if (n != 10) answer(2, "malformed launch request");
  const char *dir = f[2], *runtime = f[7], *runtime_root = f[8], *slot = f[9];
  int requests, responses;
  agent_channel(dir, &requests, &responses);
  if (strcmp(f[3], "-") != 0) join_cgroups(f[3]);
  CHECK(unshare(CLONE_NEWNS), "cannot create a mount namespace: %s", strerror(errno));
  CHECK(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL), "cannot make mounts private: %s", strerror(errno));
  if (strcmp(f[5], "-") != 0) {
    if (strcmp(f[6], "1") == 0) check_erofs_lowers(f[5]);
    char target[1024], upper[1024], work[1024], error[512];
    snprintf(target, sizeof target, "%s/rootfs", dir);
    snprintf(upper, sizeof upper, "%s/rw/upper", dir);
    snprintf(work, sizeof work, "%s/rw/work", dir);
    if (overlay_mount(target, f[5], upper, work, error, sizeof error) < 0) answer(1, "%s", error);
  }
  if (strcmp(f[4], "-") != 0 && umount2(f[4], MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT)
    answer(1, "cannot unmount %s: %s", f[4], strerror(errno));
  char log_path[1024];
  snprintf(log_path, sizeof log_path, "%s/runtime.log", dir);
  int log = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  CHECK(log, "cannot open %s: %s", log_path, strerror(errno));
  answer_fd = dup(1);
  pid_t pid = fork();
  CHECK(pid, "cannot fork: %s", strerror(errno));
  if (pid == 0) {
    /* the runtime's stdio is the log; the channel is fds 3 and 4 (--preserve-fds 2) */
    int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(log, 1);
    dup2(log, 2);
    dup2(requests, 3);
    dup2(responses, 4);
    char *args[] = {(char *)runtime, "--root", (char *)runtime_root, "run", "--detach", "--preserve-fds", "2",
                    "--bundle", (char *)dir, (char *)slot, NULL};
    execv(runtime, args);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    answer(1, "the runtime failed to start the container (status %d); see %s", status, log_path);
  answer(0, NULL);
}

/* Splits a request line in place. */
static int split(char *line, char **fields) {
  int n = 0;
  for (char *p = line; p && n < MAX_FIELDS; n++) {
    fields[n] = p;
    p = strchr(p, '\t');
    if (p) *p++ = 0;
  }
  return n;
}

static struct {
  pid_t pid;
  char id[64];
} running[MAX_RUNNING];

static void reap(void) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int i = 0; i < MAX_RUNNING; i++) {
      if (running[i].pid != pid) continue;
      running[i].pid = 0;
      if (WIFSIGNALED(status)) {
        char line[128];
        int n = snprintf(line, sizeof line, "%s\terror\tthe helper died of signal %d\n", running[i].id, WTERMSIG(status));
        (void)!write(1, line, (size_t)n);
      }
    }
  }
}

static void start(char *line) {
  char *f[MAX_FIELDS];
  int n = split(line, f);
  int slot = -1;
  for (int i = 0; i < MAX_RUNNING && slot < 0; i++)
    if (!running[i].pid) slot = i;
  request_id = f[0];
  if (slot < 0 || strlen(f[0]) >= sizeof running[0].id) {
    char message[160];
    int len = snprintf(message, sizeof message, "%.60s\terror\ttoo many requests at once or id too long\n", f[0]);
    (void)!write(1, message, (size_t)len);
    return;
  }
  pid_t pid = fork();
  if (pid == 0) {
    if (n >= 2 && strcmp(f[1], "attach") == 0) attach(f, n);
    if (n >= 2 && strcmp(f[1], "launch") == 0) launch(f, n);
    if (n >= 2 && strcmp(f[1], "subvol") == 0) subvol(f, n);
    if (n >= 2 && strcmp(f[1], "snapshot") == 0) snapshot(f, n);
    if (n >= 2 && strcmp(f[1], "unsubvol") == 0) unsubvol(f, n);
    if (n >= 2 && strcmp(f[1], "clearopaque") == 0) clear_opaque(f, n);
    answer(2, "unknown request %s", n >= 2 ? f[1] : "");
  }
  if (pid < 0) {
    char message[160];
    int len = snprintf(message, sizeof message, "%s\terror\tcannot fork: %s\n", f[0], strerror(errno));
    (void)!write(1, message, (size_t)len);
    return;
  }
  running[slot].pid = pid;
  snprintf(running[slot].id, sizeof running[slot].id, "%s", f[0]);
}

int helper_main(void) {
  /* sandboxes' first processes are handed here when their runtime exits, and reaped here */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sigfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  static char buf[1 << 16];
  size_t len = 0;
  for (;;) {
    struct pollfd fds[2] = {{.fd = 0, .events = POLLIN}, {.fd = sigfd, .events = POLLIN}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) return 1;
    if (fds[1].revents) {
      struct signalfd_siginfo info;
      while (read(sigfd, &info, sizeof info) > 0) {}
      reap();
    }
    if (!fds[0].revents) continue;
    ssize_t got = read(0, buf + len, sizeof buf - len - 1);
    if (got <= 0) return 0; /* the node went away */
    len += (size_t)got;
    char *line = buf, *end;
    while ((end = memchr(line, '\n', len - (size_t)(line - buf)))) {
      *end = 0;
      start(line);
      line = end + 1;
    }
    len -= (size_t)(line - buf);
    memmove(buf, line, len);
    if (len == sizeof buf - 1) len = 0; /* a line this long is garbage: drop it */
  }
}
