/* Guest init mode of the agent binary (microvm and vm backends). The kernel starts it as /init
 * from the initramfs sandgym builds (see src/backends/vm/guest-kernel.ts): the Debian kernel's
 * modules and their load order, then a per-VM archive with this binary and /sandgym/env.
 *
 * It prepares what crun prepares for a container, then becomes the ordinary agent:
 *   1. mounts /dev (devtmpfs), /proc and /sys, and loads /modules/order with finit_module;
 *   2. mounts the layer disks (the first sandgym.layers= virtio disks, EROFS, read-only, base
 *      first) and the writable disk after them (ext4), and an overlay of them as the new root;
 *   3. moves /dev, /proc and /sys into it and makes it the root (the initramfs stays below);
 *   4. brings up loopback, names the host "sandbox", takes the environment from /sandgym/env;
 *   5. opens the virtio-serial port named "sandgym" as its channel (fds 3 and 4 of the agent).
 * Any failure is printed on the console and powers the VM off: the host sees QEMU exit and
 * reports the console's tail. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "overlay.h"

/* microvm has 24 virtio-mmio transports: the layer disks, the writable disk, the serial port and
 * the rng (VM_MAX_LAYERS in src/backends/vm/vm-backend.ts); vda to vdu need one letter each */
#define MAX_LAYERS 21

/* Powers the VM off, which is how a VM's init ends: pid 1 may not exit. */
_Noreturn void vm_power_off(void) {
  sync();
  reboot(RB_POWER_OFF);
  for (;;) pause();
}

static _Noreturn void fail(const char *format, ...) {
  va_list args;
  va_start(args, format);
  fprintf(stderr, "sandgym-init: ");
  vfprintf(stderr, format, args);
  fprintf(stderr, "\n");
  va_end(args);
  vm_power_off();
}

#define MUST(call, ...)                    \
  do {                                     \
    if ((call) < 0) fail(__VA_ARGS__);     \
  } while (0)

static void make_dir(const char *path) {
  if (mkdir(path, 0755) < 0 && errno != EEXIST) fail("cannot create %s: %s", path, strerror(errno));
}

static void load_modules(void) {
  FILE *order = fopen("/modules/order", "r");
  if (!order) fail("no /modules/order in the initramfs");
  char name[256], path[300];
  while (fgets(name, sizeof name, order)) {
    name[strcspn(name, "\n")] = 0;
    if (!name[0]) continue;
    snprintf(path, sizeof path, "/modules/%s", name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open %s: %s", path, strerror(errno));
    if (syscall(SYS_finit_module, fd, "", 0) < 0 && errno != EEXIST) fail("cannot load %s: %s", name, strerror(errno));
    close(fd);
  }
  fclose(order);
}

/* The value of `key=` on the kernel command line, or -1. */
static long cmdline_number(const char *key) {
  char line[4096] = {0};
  int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, line, sizeof line - 1);
  close(fd);
  if (n <= 0) return -1;
  for (char *at = strstr(line, key); at; at = strstr(at + 1, key))
    if (at == line || at[-1] == ' ') return strtol(at + strlen(key), NULL, 10);
  return -1;
}

/* Disks appear as their drivers probe them: wait for one, up to ten seconds. */
static void wait_for(const char *path) {
  for (int i = 0; i < 1000; i++) {
    if (access(path, F_OK) == 0) return;
    usleep(10000);
  }
  fail("%s did not appear", path);
}

static void mount_root(long layers) {
  if (layers < 1 || layers > MAX_LAYERS) fail("sandgym.layers=%ld is not 1 to %d", layers, MAX_LAYERS);
  char dev[32], dir[32], lowers[MAX_LAYERS * 16] = {0};
  make_dir("/layers");
  for (long i = 0; i < layers; i++) {
    snprintf(dev, sizeof dev, "/dev/vd%c", (char)('a' + i));
    snprintf(dir, sizeof dir, "/layers/%ld", i);
    wait_for(dev);
    make_dir(dir);
    MUST(mount(dev, dir, "erofs", MS_RDONLY, NULL), "cannot mount layer %s: %s", dev, strerror(errno));
  }
  /* overlay lists lower dirs top first; the disks come base first */
  for (long i = layers - 1; i >= 0; i--) {
    size_t len = strlen(lowers);
    snprintf(lowers + len, sizeof lowers - len, "%s/layers/%ld", i == layers - 1 ? "" : ":", i);
  }
  snprintf(dev, sizeof dev, "/dev/vd%c", (char)('a' + layers));
  wait_for(dev);
  make_dir("/rw");
  MUST(mount(dev, "/rw", "ext4", MS_NOATIME, NULL), "cannot mount the writable disk %s: %s", dev, strerror(errno));
  make_dir("/rw/upper");
  make_dir("/rw/work");
  char error[512];
  make_dir("/newroot");
  if (overlay_mount("/newroot", lowers, "/rw/upper", "/rw/work", error, sizeof error) < 0)
    fail("cannot mount the overlay root: %s", error);
  const char *moved[] = {"/dev", "/proc", "/sys"};
  for (size_t i = 0; i < sizeof moved / sizeof *moved; i++) {
    char target[64];
    snprintf(target, sizeof target, "/newroot%s", moved[i]);
    make_dir(target);
    MUST(mount(moved[i], target, NULL, MS_MOVE, NULL), "cannot move %s: %s", moved[i], strerror(errno));
  }
  MUST(chdir("/newroot"), "cannot enter the new root: %s", strerror(errno));
  MUST(mount(".", "/", NULL, MS_MOVE, NULL), "cannot move the new root: %s", strerror(errno));
  MUST(chroot("."), "cannot enter the new root: %s", strerror(errno));
  MUST(chdir("/"), "cannot enter the new root: %s", strerror(errno));
}

/* /sandgym/env of the initramfs: NUL-separated NAME=value pairs, the sandbox's environment. */
static void take_environment(void) {
  int fd = open("/sandgym/env", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  static char env[65536];
  ssize_t n = read(fd, env, sizeof env - 1);
  close(fd);
  clearenv();
  setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
  for (ssize_t at = 0; n > 0 && at < n; at += (ssize_t)strlen(env + at) + 1) putenv(env + at);
}

static void loopback_up(void) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct ifreq ifr = {0};
  strcpy(ifr.ifr_name, "lo");
  if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0) fail("cannot find loopback: %s", strerror(errno));
  ifr.ifr_flags |= IFF_UP;
  MUST(ioctl(s, SIOCSIFFLAGS, &ifr), "cannot bring up loopback: %s", strerror(errno));
  close(s);
}

/* The virtio-serial port the host named "sandgym", as fds 3 and 4 (one open file: a port
 * admits a single opener). Also what the agent does as a full VM's service (--vm-service). */
void vm_open_channel(void) {
  for (int attempt = 0; attempt < 1000; attempt++) {
    DIR *ports = opendir("/sys/class/virtio-ports");
    for (struct dirent *e; ports && (e = readdir(ports));) {
      if (e->d_name[0] == '.') continue;
      char path[300], name[64] = {0};
      snprintf(path, sizeof path, "/sys/class/virtio-ports/%s/name", e->d_name);
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      if (fd < 0) continue;
      ssize_t n = read(fd, name, sizeof name - 1);
      close(fd);
      if (n <= 0 || strncmp(name, "sandgym\n", 8) != 0) continue;
      snprintf(path, sizeof path, "/dev/%s", e->d_name);
      int port = open(path, O_RDWR);
      if (port < 0) fail("cannot open %s: %s", path, strerror(errno));
      closedir(ports);
      if (dup2(port, 3) < 0 || dup2(port, 4) < 0) fail("cannot place the channel: %s", strerror(errno));
      if (port != 3 && port != 4) close(port);
      return;
    }
    if (ports) closedir(ports);
    usleep(10000);
  }
  fail("no virtio-serial port named sandgym");
}

void vm_init(void) {
  MUST(mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755"), "cannot mount /dev: %s", strerror(errno));
  int console = open("/dev/console", O_RDWR | O_CLOEXEC);
  if (console >= 0) {
    dup2(console, 1);
    dup2(console, 2);
  }
  make_dir("/proc");
  make_dir("/sys");
  MUST(mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL), "cannot mount /proc: %s", strerror(errno));
  MUST(mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL), "cannot mount /sys: %s", strerror(errno));
  load_modules();
  take_environment();
  mount_root(cmdline_number("sandgym.layers="));
  make_dir("/dev/pts");
  make_dir("/dev/shm");
  mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620");
  mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
  loopback_up();
  sethostname("sandbox", 7);
  vm_open_channel();
}
