/* sandgym-agent: the first process of every sandbox.
 *
 * It serves the node side over two inherited fds (3 requests, 4 responses), framed
 * msgpack. It exposes no socket, is not dumpable (so no process in the sandbox, root included,
 * can open its fds through /proc or ptrace it), and never calls the image's shell for its own
 * work. When the request pipe closes, the sandbox has no owner: it kills everything and exits.
 *
 * With --durable (node agents), the sandbox outlives its owner instead: the agent keeps a spare
 * writer on its request pipe and a spare reader on its response pipe, so neither ever reports
 * that the other end went away. A restarted owner (root on the host) reopens both pipes through
 * /proc/<pid>/fd/100 and /101, and sends `sync` with a random nonce; the agent answers with the
 * raw nonce before a normal reply, so the owner can skip whatever a dead predecessor left half
 * read. Such a sandbox ends only on `shutdown` or when its cgroup is killed.
 *
 * The same binary has host-side modes, `launch` and `helper` (launch.c, helper.c), and is the init
 * of the VM backends' guests (vminit.c). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/random.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "channel.h"
#include "creds.h"
#include "files.h"
#include "selfstate.h"
#include "jobs.h"

/* 2: file calls and commands carry the request's user (uid, gid, groups); an agent before it
 * would do a file call with a user as root, so the host refuses it one (see AgentChannel). */
#define AGENT_PROTOCOL_VERSION 2
#define DEFAULT_CAP_BYTES (1u << 20)
#define DEFAULT_READ_LIMIT (64u << 20)

int launch_main(int argc, char **argv);
int helper_main(void);
int mount_erofs_main(int argc, char **argv);
int mount_overlay_main(int argc, char **argv);
void vm_init(void);
void vm_open_channel(void);
_Noreturn void vm_power_off(void);

/* Set when this is a VM's init (see vminit.c): there is no namespace to end, only the machine. */
static bool in_vm = false;

static int request_fd = -1;
static uint8_t *inbuf;
static size_t inbuf_len, inbuf_cap;

/* How the sandbox's processes are scheduled, as the ready message reports it. */
typedef struct {
  bool durable, sched_idle, core_cookie;
} agent_options;

static const char *sched_class = "normal";
static const char *core_cookie = "off";

/* The CPU class of the whole sandbox, set on the agent so every command inherits it:
 * best-effort sandboxes run SCHED_IDLE (they get a CPU only when nothing else wants it, and
 * without CAP_SYS_NICE cannot leave that class); latency-sensitive ones may get their own
 * core-scheduling cookie, so no other tenant shares their physical core's siblings. */
static void apply_cpu_class(const agent_options *options) {
  if (options->sched_idle) {
    struct sched_param none = {0};
    sched_class = sched_setscheduler(0, SCHED_IDLE, &none) == 0 ? "idle" : "normal";
  }
  if (options->core_cookie) {
    /* PR_SCHED_CORE_CREATE for this thread group; kernels without CONFIG_SCHED_CORE refuse */
    core_cookie = prctl(62 /* PR_SCHED_CORE */, 1 /* CREATE */, 0, 1 /* PIDTYPE_TGID */, 0) == 0 ? "own" : "unsupported";
  }
}

static void send_ready(void) {
  mp_writer w;
  mp_writer_init(&w);
  char state[2048];
  selfstate_describe(state, sizeof state);
  mp_map(&w, 6);
  mp_str(&w, "t");
  mp_str(&w, "ready");
  mp_str(&w, "version");
  mp_uint(&w, AGENT_PROTOCOL_VERSION);
  mp_str(&w, "pid");
  mp_uint(&w, (uint64_t)getpid());
  mp_str(&w, "sched");
  mp_str(&w, sched_class);
  mp_str(&w, "coreCookie");
  mp_str(&w, core_cookie);
  mp_str(&w, "state");
  mp_str(&w, state);
  channel_send(&w);
}


/* The fields any request may carry; which ones matter depends on op. */
typedef struct {
  mp_item op, path, data, cwd, stdin_data, fork;
  uint32_t id;
  uint64_t timeout_ms, cap_bytes, max_bytes, mode, target, time_ms, report_fd;
  creds as; /* who the request acts as: a command, or a file call */
  char **argv, **env;
  bool bad;
  /* why argv or env was refused, named in the error reply */
  const char *bad_strv;
} request;

static uint64_t as_uint(const mp_item *it, bool *bad) {
  if ((it->type != MP_INT && it->type != MP_FLOAT) || it->i < 0) {
    *bad = true;
    return 0;
  }
  return (uint64_t)it->i;
}

static bool parse_request(const uint8_t *p, size_t n, request *req) {
  mp_reader r = {p, p + n};
  mp_item map, key, value;
  memset(req, 0, sizeof *req);
  req->cap_bytes = DEFAULT_CAP_BYTES;
  req->max_bytes = DEFAULT_READ_LIMIT;
  req->mode = 0644;
  req->as.uid = req->as.gid = -1;
  if (!mp_next(&r, &map) || map.type != MP_MAP) return false;
  for (uint32_t i = 0; i < map.len; i++) {
    if (!mp_next(&r, &key) || key.type != MP_STR) return false;
    if (mp_item_is(&key, "groups")) {
      if (!mp_next(&r, &value)) return false;
      if (value.type == MP_NIL) continue;
      if (value.type != MP_ARRAY || !creds_read_groups(&r, &value, &req->as)) req->bad = true;
      continue;
    }
    if (mp_item_is(&key, "argv") || mp_item_is(&key, "env")) {
      if (!mp_next(&r, &value)) return false;
      if (value.type == MP_NIL) continue;
      if (value.type != MP_ARRAY) return false;
      const char *why = NULL;
      char **v = read_strv(&r, &value, &why);
      if (!v) {
        req->bad_strv = mp_item_is(&key, "argv") ? "argv" : "env";
        if (strcmp(why, "malformed request") == 0) return false;
        continue;
      }
      if (mp_item_is(&key, "argv")) req->argv = v;
      else req->env = v;
      continue;
    }
    if (!mp_next(&r, &value)) return false;
    if (value.type == MP_ARRAY || value.type == MP_MAP) {
      /* a field this agent does not know: skip its contents */
      for (uint32_t k = 0; k < value.len * (value.type == MP_MAP ? 2u : 1u); k++)
        if (!mp_skip(&r)) return false;
      continue;
    }
    if (value.type == MP_NIL) continue;
    if (mp_item_is(&key, "op")) req->op = value;
    else if (mp_item_is(&key, "id")) req->id = (uint32_t)as_uint(&value, &req->bad);
    else if (mp_item_is(&key, "path")) req->path = value;
    else if (mp_item_is(&key, "data")) req->data = value;
    else if (mp_item_is(&key, "cwd")) req->cwd = value;
    else if (mp_item_is(&key, "stdin")) req->stdin_data = value;
    else if (mp_item_is(&key, "fork")) req->fork = value;
    else if (mp_item_is(&key, "timeoutMs")) req->timeout_ms = as_uint(&value, &req->bad);
    else if (mp_item_is(&key, "outputCapBytes")) req->cap_bytes = as_uint(&value, &req->bad);
    else if (mp_item_is(&key, "maxBytes")) req->max_bytes = as_uint(&value, &req->bad);
    else if (mp_item_is(&key, "mode")) req->mode = as_uint(&value, &req->bad);
    else if (mp_item_is(&key, "target")) req->target = as_uint(&value, &req->bad);
    else if (mp_item_is(&key, "timeMs")) req->time_ms = as_uint(&value, &req->bad);
    else if (mp_item_is(&key, "uid")) req->as.uid = (int64_t)as_uint(&value, &req->bad);
    else if (mp_item_is(&key, "gid")) req->as.gid = (int64_t)as_uint(&value, &req->bad);
    else if (mp_item_is(&key, "reportFd")) req->report_fd = as_uint(&value, &req->bad);
  }
  /* a user comes whole: both ids, neither the kernel's "no id" (-1 as a 32-bit id) */
  if ((req->as.uid >= 0) != (req->as.gid >= 0) || req->as.uid > 0xfffffffe || req->as.gid > 0xfffffffe) req->bad = true;
  return true;
}

static void request_free(request *req) {
  for (int k = 0; k < 2; k++) {
    char **v = k ? req->env : req->argv;
    if (!v) continue;
    for (char **s = v; *s; s++) free(*s);
    free(v);
  }
}

static void handle_exec(request *req) {
  if (!req->argv || !req->argv[0] || !req->argv[0][0])
    return send_error(req->id, "bad_request", "exec needs a non-empty argv");
  exec_request ex;
  memset(&ex, 0, sizeof ex);
  ex.id = req->id;
  ex.argv = req->argv;
  ex.env = req->env;
  req->argv = req->env = NULL;
  if (req->cwd.type == MP_STR) ex.cwd = strndup((const char *)req->cwd.ptr, req->cwd.len);
  if ((req->stdin_data.type == MP_BIN || req->stdin_data.type == MP_STR) && req->stdin_data.len) {
    ex.stdin_data = malloc(req->stdin_data.len);
    if (ex.stdin_data) {
      memcpy(ex.stdin_data, req->stdin_data.ptr, req->stdin_data.len);
      ex.stdin_len = req->stdin_data.len;
    }
  }
  ex.timeout_ms = req->timeout_ms;
  ex.cap_bytes = req->cap_bytes;
  ex.uid = req->as.uid;
  ex.gid = req->as.gid;
  ex.groups = req->as.groups; /* the child is forked before the request is freed */
  ex.ngroups = req->as.ngroups;
  if (req->report_fd > REPORT_FD_MAX) {
    exec_request_free(&ex);
    return send_error(req->id, "bad_request", "reportFd must be a descriptor number from 3 to 1023");
  }
  ex.report_fd = (uint32_t)req->report_fd;
  job_start(&ex);
  exec_request_free(&ex);
}

static void shutdown_sandbox(void);

static void do_file(request *req) {
  if (mp_item_is(&req->op, "read")) file_read(req->id, &req->path, req->max_bytes);
  else if (mp_item_is(&req->op, "write")) file_write(req->id, &req->path, &req->data, (uint32_t)req->mode);
  else file_list(req->id, &req->path);
}

/* A file call. The platform's own (no user) runs here, as root. One with a user runs in a child
 * that has taken on the user's ids with no capabilities (creds_become): procfs and sysfs decide
 * on credentials and capabilities rather than modes, and /proc/1 is the agent itself, so only a
 * separate process with the user's rights reads them as the user would. The child writes its
 * reply to a pipe; the agent forwards it only when the child ended well, so nothing the call
 * meets can put half a frame on the channel. */
static void handle_file(request *req) {
  if (req->as.uid < 0) return do_file(req);
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) < 0) return send_errno(req->id, errno, "cannot start the file call");
  pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return send_errno(req->id, errno, "cannot start the file call");
  }
  if (pid == 0) {
    close(pipefd[0]);
    channel_init(pipefd[1]);
    if (!creds_become(&req->as)) send_errno(req->id, errno, "cannot act as the request's user");
    else do_file(req);
    _exit(0);
  }
  close(pipefd[1]);
  size_t len = 0, cap = 65536;
  uint8_t *buf = malloc(cap);
  for (;;) {
    if (buf && len == cap) {
      uint8_t *grown = cap < (size_t)CHANNEL_MAX_FRAME * 2 ? realloc(buf, cap * 2) : NULL;
      if (!grown) free(buf);
      buf = grown;
      cap *= 2;
    }
    uint8_t sink[4096];
    ssize_t k = buf ? read(pipefd[0], buf + len, cap - len) : read(pipefd[0], sink, sizeof sink);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    if (buf) len += (size_t)k;
  }
  close(pipefd[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  /* exactly one whole frame, from a child that exited: anything else is the call's error */
  bool whole = buf && len >= 4 && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
               ((size_t)buf[0] << 24 | (size_t)buf[1] << 16 | (size_t)buf[2] << 8 | buf[3]) == len - 4;
  if (whole) channel_write_raw(buf, len);
  else send_error(req->id, "io_error", "the file call ended without a reply");
  free(buf);
}

/* An ok that says which protocol this agent speaks: what a channel reopened to it learns it from. */
static void send_ok_with_version(uint32_t id) {
  mp_writer w;
  reply_begin(&w, "ok", id, 1);
  mp_str(&w, "version");
  mp_uint(&w, AGENT_PROTOCOL_VERSION);
  channel_send(&w);
}

/* Resynchronises a reopened channel: the raw nonce marks where this owner's replies begin. */
static void handle_sync(request *req) {
  if ((req->data.type != MP_BIN && req->data.type != MP_STR) || req->data.len < 8 || req->data.len > 64)
    return send_error(req->id, "bad_request", "sync needs an 8-64 byte nonce in data");
  channel_write_raw(req->data.ptr, req->data.len);
  send_ok_with_version(req->id);
}

/* Makes a warm sandbox ready for its next root (see helper.c): ends every other process of the
 * sandbox and waits until they are reaped, then takes the current root as the one file calls are
 * resolved in (the host swaps roots between two resets). Only pid 1 of a namespace may do this. */
static void handle_reset(request *req) {
  if (getpid() != 1) return send_error(req->id, "bad_request", "reset needs the agent to be its namespace's pid 1");
  kill(-1, SIGKILL);
  int left = -1;
  for (int i = 0; i < 500 && (left = selfstate_others()) != 0; i++) {
    jobs_reap();
    usleep(10000);
  }
  jobs_reap();
  if (left != 0) return send_error(req->id, "busy", "processes of the sandbox would not end");
  if (chdir("/") < 0 || !files_reopen_root()) return send_error(req->id, "io", "cannot open the new root");
  send_ok(req->id);
}

/* Processes besides the agent and the kernel's own threads (whose cmdline is empty): what a VM's
 * stats report as its pids, where no cgroup counts them. */
/* The agent's own process state now (see selfstate.c), for the host to compare with the ready's. */
static void handle_procstate(request *req) {
  char state[2048];
  selfstate_describe(state, sizeof state);
  mp_writer w;
  reply_begin(&w, "ok", req->id, 1);
  mp_str(&w, "state");
  mp_str(&w, state);
  channel_send(&w);
}

static void handle_procs(request *req) {
  DIR *proc = opendir("/proc");
  if (!proc) return send_errno(req->id, errno, "cannot list /proc");
  uint64_t count = 0;
  for (struct dirent *e; (e = readdir(proc));) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9' || strcmp(e->d_name, "1") == 0) continue;
    char path[300], c;
    snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (read(fd, &c, 1) == 1) count++;
    close(fd);
  }
  closedir(proc);
  mp_writer w;
  reply_begin(&w, "ok", req->id, 1);
  mp_str(&w, "count");
  mp_uint(&w, count);
  channel_send(&w);
}

/* Where the sandbox's processes read which fork they are in (docs/training.md). */
#define FORK_FILE "/run/sandgym/fork"

/* The sandbox's processes came back from a memory image (a fork, a restore, a wake from
 * hibernation): the host names this copy with a fresh value, which the agent writes to FORK_FILE
 * and puts in the environment of every command it starts from now on (SANDGYM_FORK), so
 * processes can tell copies apart and reseed. Processes that were running keep the random state
 * of their memory: only they can reseed it, from that value. */
static void note_fork(request *req) {
  char value[65];
  const mp_item *fork = &req->fork;
  bool hex = fork->type == MP_STR && fork->len > 0 && fork->len < sizeof value;
  for (uint32_t i = 0; hex && i < fork->len; i++)
    hex = (fork->ptr[i] >= '0' && fork->ptr[i] <= '9') || (fork->ptr[i] >= 'a' && fork->ptr[i] <= 'f');
  if (!hex) return send_error(req->id, "bad_request", "fork must be 1-64 lowercase hex digits");
  memcpy(value, fork->ptr, fork->len);
  value[fork->len] = 0;
  if (setenv("SANDGYM_FORK", value, 1) < 0) return send_errno(req->id, errno, "cannot set SANDGYM_FORK");
  /* Only what the sandbox did to its own /run (a file where the folder goes, a full disk) stops
   * this write, and that must not fail the restore, nor make it the platform's failure. */
  (void)files_put(FORK_FILE, value, 0644);
  send_ok(req->id);
}

/* A VM restored from a snapshot (or one of its forks) also carries the snapshot's clock and the
 * random state of its kernel: the host sends the time and fresh entropy, credited to the pool and
 * the generator reseeded from it, so no two forks draw the same random numbers and none lives in
 * the past. A container's kernel is the host's: it sends only the fork. */
static void handle_restored(request *req) {
  if (req->time_ms || req->data.type != MP_NIL) {
    if (req->data.type != MP_BIN || req->data.len < 32 || req->data.len > 512 || !req->time_ms)
      return send_error(req->id, "bad_request", "restored needs timeMs and 32-512 bytes of entropy in data");
    struct timespec now = {.tv_sec = (time_t)(req->time_ms / 1000), .tv_nsec = (long)(req->time_ms % 1000) * 1000000};
    if (clock_settime(CLOCK_REALTIME, &now) < 0) return send_errno(req->id, errno, "cannot set the clock");
    struct {
      int entropy_count, buf_size;
      unsigned char buf[512];
    } seed = {(int)req->data.len * 8, (int)req->data.len, {0}};
    memcpy(seed.buf, req->data.ptr, req->data.len);
    int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return send_errno(req->id, errno, "cannot open /dev/urandom");
    int rc = ioctl(fd, RNDADDENTROPY, &seed);
    /* Credited entropy only reaches the generator at its next scheduled reseed (up to a minute
     * away), so until then every fork would still draw the snapshot's stream: reseed it now. */
    if (rc == 0) rc = ioctl(fd, RNDRESEEDCRNG);
    int err = errno;
    close(fd);
    if (rc < 0) return send_errno(req->id, err, "cannot reseed the kernel's random pool");
  }
  if (req->fork.type != MP_NIL) return note_fork(req);
  send_ok(req->id);
}

static void handle_frame(const uint8_t *p, size_t n) {
  request req;
  if (!parse_request(p, n, &req) || req.bad || req.op.type != MP_STR) {
    send_error(req.id, "bad_request", "malformed request");
  } else if (req.bad_strv) {
    char message[96];
    snprintf(message, sizeof message, "%s entries must be strings without NUL bytes", req.bad_strv);
    send_error(req.id, "bad_request", message);
  } else if (mp_item_is(&req.op, "exec")) {
    handle_exec(&req);
  } else if (mp_item_is(&req.op, "cancel")) {
    job *j = job_by_id((uint32_t)req.target);
    if (j) job_kill(j, false);
    send_ok(req.id);
  } else if (mp_item_is(&req.op, "read") || mp_item_is(&req.op, "write") || mp_item_is(&req.op, "list")) {
    handle_file(&req);
  } else if (mp_item_is(&req.op, "restored")) {
    handle_restored(&req);
  } else if (mp_item_is(&req.op, "procs")) {
    handle_procs(&req);
  } else if (mp_item_is(&req.op, "procstate")) {
    handle_procstate(&req);
  } else if (mp_item_is(&req.op, "ping")) {
    send_ok_with_version(req.id);
  } else if (mp_item_is(&req.op, "sync")) {
    handle_sync(&req);
  } else if (mp_item_is(&req.op, "reset")) {
    handle_reset(&req);
  } else if (mp_item_is(&req.op, "shutdown")) {
    send_ok(req.id);
    shutdown_sandbox();
  } else {
    send_error(req.id, "bad_request", "unknown op");
  }
  request_free(&req);
}

/* Owner gone: end every process of the sandbox. As pid 1 of its namespace, kill(-1) reaches all
 * of them and nothing else; anywhere else it would reach the whole host, so there only the
 * commands' own process groups are ended. */
static void shutdown_sandbox(void) {
  if (in_vm) {
    kill(-1, SIGKILL);
    vm_power_off();
  }
  if (getpid() == 1) {
    kill(-1, SIGKILL);
  } else {
    for (int i = 0; i < MAX_JOBS; i++)
      if (jobs[i].used) kill(-jobs[i].pid, SIGKILL);
  }
  _exit(0);
}

static void read_requests(void) {
  if (inbuf_cap - inbuf_len < 65536) {
    size_t cap = inbuf_cap ? inbuf_cap * 2 : 262144;
    uint8_t *grown = realloc(inbuf, cap);
    if (!grown) shutdown_sandbox();
    inbuf = grown;
    inbuf_cap = cap;
  }
  ssize_t n = read(request_fd, inbuf + inbuf_len, inbuf_cap - inbuf_len);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n <= 0) shutdown_sandbox();
  inbuf_len += (size_t)n;
  size_t off = 0;
  while (inbuf_len - off >= 4) {
    const uint8_t *h = inbuf + off;
    uint32_t len = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
    if (len > CHANNEL_MAX_FRAME) shutdown_sandbox(); /* the stream cannot be trusted any more */
    if (inbuf_len - off - 4 < len) break;
    handle_frame(h + 4, len);
    off += 4 + (size_t)len;
  }
  memmove(inbuf, inbuf + off, inbuf_len - off);
  inbuf_len -= off;
}

/* Moves the channel to close-on-exec fds so that no command can inherit it. The runtime hands
 * it over as fds 3 and 4 (crun --preserve-fds), apart from stdio, which the runtime itself reads. */
static void take_channel(bool durable) {
  request_fd = dup3(3, CHANNEL_REQUEST_FD, O_CLOEXEC) < 0 ? -1 : CHANNEL_REQUEST_FD;
  int out = dup3(4, CHANNEL_RESPONSE_FD, O_CLOEXEC) < 0 ? -1 : CHANNEL_RESPONSE_FD;
  if (request_fd < 0 || out < 0) {
    fprintf(stderr, "sandgym-agent: no channel on fds 3 and 4: %s\n", strerror(errno));
    _exit(111);
  }
  close(3);
  close(4);
  if (durable) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", CHANNEL_REQUEST_FD);
    int spare_writer = open(path, O_WRONLY | O_CLOEXEC);
    snprintf(path, sizeof path, "/proc/self/fd/%d", CHANNEL_RESPONSE_FD);
    int spare_reader = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (spare_writer < 0 || spare_reader < 0) {
      fprintf(stderr, "sandgym-agent: --durable cannot hold its channel open: %s\n", strerror(errno));
      _exit(112);
    }
    /* kept open for the life of the agent, never used */
  }
  fcntl(request_fd, F_SETFL, fcntl(request_fd, F_GETFL) | O_NONBLOCK);
  channel_init(out);
}

static _Noreturn void agent_main(const agent_options *options) {
  prctl(PR_SET_DUMPABLE, 0);
  selfstate_protect();
  take_channel(options->durable);
  apply_cpu_class(options);
  files_init();
  signal(SIGPIPE, SIG_IGN);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sigfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  send_ready();
  /* per job: its output streams, and its stdin (marked by the stream number JOB_STREAMS) */
  struct pollfd fds[2 + (JOB_STREAMS + 1) * MAX_JOBS];
  job *owners[2 + (JOB_STREAMS + 1) * MAX_JOBS];
  int streams[2 + (JOB_STREAMS + 1) * MAX_JOBS];
  for (;;) {
    int n = 0;
    fds[n++] = (struct pollfd){.fd = request_fd, .events = POLLIN};
    fds[n++] = (struct pollfd){.fd = sigfd, .events = POLLIN};
    for (int i = 0; i < MAX_JOBS; i++) {
      job *j = &jobs[i];
      if (!j->used) continue;
      for (int s = 0; s < JOB_STREAMS; s++) {
        if (j->fds[s] < 0) continue;
        owners[n] = j, streams[n] = s;
        fds[n++] = (struct pollfd){.fd = j->fds[s], .events = POLLIN};
      }
      if (j->stdin_fd >= 0) {
        owners[n] = j, streams[n] = JOB_STREAMS;
        fds[n++] = (struct pollfd){.fd = j->stdin_fd, .events = POLLOUT};
      }
    }
    int64_t deadline = jobs_next_deadline();
    int timeout = -1;
    if (deadline) {
      int64_t wait_us = deadline - now_us();
      timeout = wait_us <= 0 ? 0 : (int)((wait_us + 999) / 1000);
    }
    if (poll(fds, (nfds_t)n, timeout) < 0 && errno != EINTR) shutdown_sandbox();
    for (int k = 2; k < n; k++) {
      if (!fds[k].revents) continue;
      if (streams[k] == JOB_STREAMS) job_feed_stdin(owners[k]);
      else job_pump(owners[k], streams[k], 4);
    }
    if (fds[1].revents) {
      struct signalfd_siginfo info;
      while (read(sigfd, &info, sizeof info) > 0) {}
      jobs_reap();
    }
    jobs_expire(now_us());
    if (fds[0].revents) read_requests();
  }
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "launch") == 0) return launch_main(argc - 1, argv + 1);
  if (argc == 2 && strcmp(argv[1], "helper") == 0) return helper_main();
  if (argc > 1 && strcmp(argv[1], "mount-erofs") == 0) return mount_erofs_main(argc - 1, argv + 1);
  if (argc > 1 && strcmp(argv[1], "mount-overlay") == 0) return mount_overlay_main(argc - 1, argv + 1);
  agent_options options = {false, false, false};
  if (getpid() == 1 && argc >= 1 && strcmp(argv[0], "/init") == 0) {
    /* the kernel started us from the initramfs: build the root, then serve as usual */
    in_vm = true;
    vm_init();
    agent_main(&options);
  }
  bool usage = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--vm-service") == 0) {
      /* a full VM's service (the vm backend's images): the machine is the sandbox */
      in_vm = true;
      vm_open_channel();
      agent_main(&options);
    }
    if (strcmp(argv[i], "--durable") == 0) options.durable = true;
    else if (strcmp(argv[i], "--sched-idle") == 0) options.sched_idle = true;
    else if (strcmp(argv[i], "--core-cookie") == 0) options.core_cookie = true;
    else usage = true;
  }
  if (usage) {
    fprintf(stderr, "usage: sandgym-agent [--durable] [--sched-idle] [--core-cookie] (as a sandbox's first process)\n"
                    "       sandgym-agent --vm-service  (a full VM's agent, on its virtio-serial port \"sandgym\")\n"
                    "       sandgym-agent launch ...  (host side; see launch.c)\n"
                    "       sandgym-agent helper      (host side; see helper.c)\n"
                    "       sandgym-agent mount-erofs IMAGE TARGET\n");
    return 2;
  }
  agent_main(&options);
}
