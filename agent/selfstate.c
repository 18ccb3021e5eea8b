/* The agent's own process state, which a sandbox's processes could otherwise turn against it or
 * against the next tenant of a warm sandbox.
 *
 * Out-of-memory: the agent is pid 1 and the sandbox's only way to report, so the OOM killer must
 * never pick it. It sets its own score to the minimum (which needs CAP_SYS_RESOURCE, given to the
 * agent alone); each command raises its score to the maximum while it still holds that capability
 * (which also makes the maximum its floor), then drops the capability for good before exec. A
 * command can therefore neither lower its own score below the agent's nor keep the capability; the
 * container masks /proc/1/oom_score_adj so no one can raise the agent's.
 *
 * Fingerprint: processes of the same uid may still change some of pid 1's state from outside
 * (prlimit, renice, ionice, taskset, the autogroup's nice, the coredump filter), and its commands
 * inherit all of it. The agent describes that state as text; the host compares it with what the
 * agent reported when it started and discards a warm sandbox whose agent was changed. */
#define _GNU_SOURCE
#include "selfstate.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define IOPRIO_WHO_PROCESS 1

static void write_oom_score_adj(const char *value) {
  int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (fd < 0) return;
  if (write(fd, value, strlen(value)) < 0) {}
  close(fd);
}

void selfstate_protect(void) { write_oom_score_adj("-1000"); }

void selfstate_for_command(void) {
  write_oom_score_adj("1000");
  /* out of the bounding set first (needs CAP_SETPCAP, still held), then out of the sets it has */
  prctl(PR_CAPBSET_DROP, CAP_SYS_RESOURCE, 0, 0, 0);
  struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  if (syscall(SYS_capget, &header, data) != 0) return;
  for (int i = 0; i < 2; i++) {
    uint32_t bit = CAP_SYS_RESOURCE / 32 == (unsigned)i ? 1u << (CAP_SYS_RESOURCE % 32) : 0;
    data[i].effective &= ~bit;
    data[i].permitted &= ~bit;
    data[i].inheritable &= ~bit;
  }
  syscall(SYS_capset, &header, data);
}

/* Appends the first line of a /proc/self file, as "name=value;". */
static size_t append_proc_line(char *buf, size_t size, size_t at, const char *name) {
  char path[64], line[128] = "";
  snprintf(path, sizeof path, "/proc/self/%s", name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, line, sizeof line - 1);
    line[n > 0 ? n : 0] = 0;
    close(fd);
  }
  /* the autogroup's name has its id, which differs per session; only its nice is state */
  const char *shown = strstr(line, "nice") ? strstr(line, "nice") : line;
  line[strcspn(line, "\n")] = 0;
  int n = snprintf(buf + at, at < size ? size - at : 0, "%s=%s;", name, shown);
  return at + (n > 0 ? (size_t)n : 0);
}

size_t selfstate_describe(char *buf, size_t size) {
  size_t at = 0;
  int n;
#define APPEND(...)                                                         \
  do {                                                                      \
    n = snprintf(buf + at, at < size ? size - at : 0, __VA_ARGS__);        \
    at += n > 0 ? (size_t)n : 0;                                            \
  } while (0)
  for (int resource = 0; resource < RLIM_NLIMITS; resource++) {
    struct rlimit limit;
    if (getrlimit(resource, &limit) == 0)
      APPEND("rlimit%d=%llu:%llu;", resource, (unsigned long long)limit.rlim_cur,
             (unsigned long long)limit.rlim_max);
  }
  errno = 0;
  int nice = getpriority(PRIO_PROCESS, 0);
  APPEND("nice=%d;", errno ? 99 : nice);
  APPEND("ioprio=%ld;", syscall(SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0));
  struct sched_param param = {0};
  sched_getparam(0, &param);
  APPEND("sched=%d:%d;", sched_getscheduler(0), param.sched_priority);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0) {
    APPEND("cpus=");
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
      if (CPU_ISSET(cpu, &cpus)) APPEND("%d,", cpu);
    APPEND(";");
  }
  APPEND("timerslack=%d;", prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0));
#undef APPEND
  at = append_proc_line(buf, size, at, "oom_score_adj");
  at = append_proc_line(buf, size, at, "autogroup");
  at = append_proc_line(buf, size, at, "coredump_filter");
  if (at >= size && size > 0) buf[size - 1] = 0;
  return at < size ? at : size - 1;
}

int selfstate_others(void) {
  DIR *proc = opendir("/proc");
  if (!proc) return -1;
  int count = 0;
  for (struct dirent *e; (e = readdir(proc));)
    if (e->d_name[0] >= '1' && e->d_name[0] <= '9' && strcmp(e->d_name, "1") != 0) count++;
  closedir(proc);
  return count;
}
