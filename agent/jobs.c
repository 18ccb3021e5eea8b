/* Commands run by the agent: fork, exec (our own PATH search, never a shell), stream capped
 * output back, enforce the deadline on the whole process group, report how the command ended.
 *
 * A command may also get a report channel: the write end of a pipe on an fd number of the
 * caller's choosing, read here as a third stream. A grader's test harness writes its results
 * there as it goes; whatever a process writes is read at once, so nothing started later (the
 * code under test) can take it back or rewrite it, and a harness that never finishes its report
 * shows as one that never finished. */
#define _GNU_SOURCE
#include "jobs.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "channel.h"
#include "selfstate.h"

#define CHUNK_BYTES 65536
#define DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

job jobs[MAX_JOBS];

int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static job *free_slot(void) {
  for (int i = 0; i < MAX_JOBS; i++)
    if (!jobs[i].used) return &jobs[i];
  return NULL;
}

job *job_by_id(uint32_t id) {
  for (int i = 0; i < MAX_JOBS; i++)
    if (jobs[i].used && jobs[i].id == id) return &jobs[i];
  return NULL;
}

static char *copy_str(const mp_item *it) {
  char *s = malloc(it->len + 1);
  if (!s) return NULL;
  memcpy(s, it->ptr, it->len);
  s[it->len] = 0;
  return s;
}

static void free_strv(char **v) {
  if (!v) return;
  for (char **p = v; *p; p++) free(*p);
  free(v);
}

/* Reads an array of strings from the reader into a NULL-terminated vector. On a bad entry (not a
 * string, or one holding a NUL byte) it returns NULL with *why set, but still moves the reader
 * past the whole array, so the rest of the request (its id above all) can be read and answered. */
char **read_strv(mp_reader *r, const mp_item *array, const char **why) {
  char **v = calloc(array->len + 1, sizeof(char *));
  *why = v ? NULL : "out of memory";
  for (uint32_t i = 0; i < array->len; i++) {
    mp_item it;
    if (!mp_next(r, &it)) {
      *why = "malformed request";
      break;
    }
    if (it.type == MP_ARRAY || it.type == MP_MAP) {
      for (uint32_t k = 0; k < it.len * (it.type == MP_MAP ? 2u : 1u); k++) mp_skip(r);
    }
    if (*why) continue;
    if (it.type != MP_STR) *why = "entries must be strings";
    else if (memchr(it.ptr, 0, it.len)) *why = "entries must not contain NUL bytes";
    else if (!(v[i] = copy_str(&it))) *why = "out of memory";
  }
  if (*why) {
    free_strv(v);
    return NULL;
  }
  return v;
}

/* The agent's own environment with the request's KEY=VALUE entries laid over it. */
static char **merged_env(char **overrides) {
  extern char **environ;
  size_t base = 0, extra = 0;
  while (environ[base]) base++;
  while (overrides && overrides[extra]) extra++;
  char **env = calloc(base + extra + 1, sizeof(char *));
  if (!env) return NULL;
  size_t n = 0;
  for (size_t i = 0; i < base; i++) {
    const char *eq = strchr(environ[i], '=');
    size_t key = eq ? (size_t)(eq - environ[i]) + 1 : strlen(environ[i]);
    bool replaced = false;
    for (size_t j = 0; j < extra && !replaced; j++) replaced = strncmp(overrides[j], environ[i], key) == 0;
    if (!replaced) env[n++] = environ[i];
  }
  for (size_t j = 0; j < extra; j++) env[n++] = overrides[j];
  return env;
}

static const char *env_lookup(char **env, const char *key) {
  size_t n = strlen(key);
  for (char **p = env; *p; p++)
    if (strncmp(*p, key, n) == 0 && (*p)[n] == '=') return *p + n + 1;
  return NULL;
}

/* execve along PATH. Unlike execvpe, it never hands a script without a shebang to /bin/sh. */
static void exec_path(char **argv, char **env) {
  if (strchr(argv[0], '/')) {
    execve(argv[0], argv, env);
    return;
  }
  const char *path = env_lookup(env, "PATH");
  if (!path) path = DEFAULT_PATH;
  int saved = ENOENT;
  char full[4096];
  for (const char *dir = path; dir;) {
    const char *colon = strchr(dir, ':');
    int len = colon ? (int)(colon - dir) : (int)strlen(dir);
    snprintf(full, sizeof full, "%.*s/%s", len, len ? dir : ".", argv[0]);
    execve(full, argv, env);
    if (errno != ENOENT && errno != ENOTDIR) saved = errno;
    dir = colon ? colon + 1 : NULL;
  }
  errno = saved;
}

static void child_main(exec_request *req, int out_w, int err_w, int in_r, int report_w, char **env) {
  sigset_t all;
  sigemptyset(&all);
  sigprocmask(SIG_SETMASK, &all, NULL);
  for (int sig = 1; sig < NSIG; sig++) signal(sig, SIG_DFL);
  setsid(); /* its own process group, so a timeout kills every descendant that stayed in it */
  /* The OOM killer must pick a command, never the agent that reports on it (see selfstate.c). */
  selfstate_for_command();
  dup2(in_r, 0);
  dup2(out_w, 1);
  dup2(err_w, 2);
  /* dup2 clears close-on-exec: the command and whatever it starts inherit the report channel */
  if (report_w >= 0 && dup2(report_w, (int)req->report_fd) < 0) {
    dprintf(2, "sandgym-agent: cannot open the report channel on fd %u: %s\n", req->report_fd, strerror(errno));
    _exit(126);
  }
  if (req->gid >= 0 && (setgroups(req->ngroups, req->groups) < 0 || setgid((gid_t)req->gid) < 0)) {
    dprintf(2, "sandgym-agent: cannot switch to group %lld: %s\n", (long long)req->gid, strerror(errno));
    _exit(126);
  }
  if (req->uid >= 0 && setuid((uid_t)req->uid) < 0) {
    dprintf(2, "sandgym-agent: cannot switch to user %lld: %s\n", (long long)req->uid, strerror(errno));
    _exit(126);
  }
  if (req->cwd && chdir(req->cwd) < 0) {
    dprintf(2, "sandgym-agent: cannot change to directory %s: %s\n", req->cwd, strerror(errno));
    _exit(126);
  }
  exec_path(req->argv, env);
  int err = errno;
  dprintf(2, "sandgym-agent: cannot run %s: %s\n", req->argv[0], strerror(err));
  _exit(err == ENOENT ? 127 : 126);
}

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

void job_start(exec_request *req) {
  job *j = free_slot();
  if (!j) return send_error(req->id, "busy", "too many commands are running in this sandbox");
  if (job_by_id(req->id)) return send_error(req->id, "bad_request", "request id is already in use");
  if (req->report_fd && (req->report_fd < REPORT_FD_MIN || req->report_fd > REPORT_FD_MAX))
    return send_error(req->id, "bad_request", "reportFd must be a descriptor number from 3 to 1023");
  int out[2], err[2], in[2] = {-1, -1}, report[2] = {-1, -1};
  if (pipe2(out, O_CLOEXEC) < 0) return send_errno(req->id, errno, "cannot create pipe");
  if (pipe2(err, O_CLOEXEC) < 0) {
    close(out[0]), close(out[1]);
    return send_errno(req->id, errno, "cannot create pipe");
  }
  if (req->report_fd && pipe2(report, O_CLOEXEC) < 0) {
    close(out[0]), close(out[1]), close(err[0]), close(err[1]);
    return send_errno(req->id, errno, "cannot create pipe");
  }
  if (req->stdin_len > 0) {
    if (pipe2(in, O_CLOEXEC) < 0) in[0] = -1;
  } else {
    in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  char **env = merged_env(req->env);
  pid_t pid = env && in[0] >= 0 ? fork() : -1;
  if (pid == 0) child_main(req, out[1], err[1], in[0], report[1], env);
  int fork_errno = errno;
  free(env);
  close(out[1]);
  close(err[1]);
  if (report[1] >= 0) close(report[1]);
  if (in[0] >= 0) close(in[0]);
  if (pid < 0) {
    close(out[0]), close(err[0]);
    if (report[0] >= 0) close(report[0]);
    if (in[1] >= 0) close(in[1]);
    return send_errno(req->id, fork_errno, "cannot start command");
  }
  memset(j, 0, sizeof *j);
  j->used = true;
  j->id = req->id;
  j->pid = pid;
  j->fds[0] = out[0];
  j->fds[1] = err[0];
  j->fds[2] = report[0];
  j->has_report = report[0] >= 0;
  j->stdin_fd = in[1];
  j->stdin_data = req->stdin_data;
  j->stdin_len = req->stdin_len;
  req->stdin_data = NULL;
  j->cap_bytes = req->cap_bytes;
  j->start_us = now_us();
  j->deadline_us = req->timeout_ms > 0 ? j->start_us + (int64_t)req->timeout_ms * 1000 : 0;
  set_nonblock(out[0]);
  set_nonblock(err[0]);
  if (report[0] >= 0) set_nonblock(report[0]);
  if (j->stdin_fd >= 0) set_nonblock(j->stdin_fd);
}

void exec_request_free(exec_request *req) {
  free_strv(req->argv);
  free_strv(req->env);
  free(req->cwd);
  free(req->stdin_data);
  memset(req, 0, sizeof *req);
}

static void send_chunk(job *j, int stream, const uint8_t *data, size_t n) {
  uint64_t before = j->bytes[stream];
  j->bytes[stream] += n;
  if (before >= j->cap_bytes) return;
  size_t keep = before + n > j->cap_bytes ? (size_t)(j->cap_bytes - before) : n;
  mp_writer w;
  reply_begin(&w, "out", j->id, 2);
  mp_str(&w, "fd");
  mp_uint(&w, (uint64_t)stream + 1);
  mp_str(&w, "data");
  mp_bin(&w, data, keep);
  channel_send(&w);
}

/* Reads what is ready on one output pipe. Returns false once the pipe reached EOF. */
bool job_pump(job *j, int stream, int max_reads) {
  static uint8_t buf[CHUNK_BYTES];
  for (int i = 0; i < max_reads; i++) {
    ssize_t n = read(j->fds[stream], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return true;
    if (n <= 0) {
      close(j->fds[stream]);
      j->fds[stream] = -1;
      return false;
    }
    send_chunk(j, stream, buf, (size_t)n);
  }
  return true;
}

void job_feed_stdin(job *j) {
  while (j->stdin_off < j->stdin_len) {
    ssize_t n = write(j->stdin_fd, j->stdin_data + j->stdin_off, j->stdin_len - j->stdin_off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n < 0) break; /* the command closed its stdin: the rest is not wanted */
    j->stdin_off += (size_t)n;
  }
  close(j->stdin_fd);
  j->stdin_fd = -1;
  free(j->stdin_data);
  j->stdin_data = NULL;
}

static void job_finish(job *j) {
  /* What the command wrote before it exited is in the pipes already. A background descendant
   * that still holds them must not keep the result waiting, so this drain is bounded. */
  for (int s = 0; s < JOB_STREAMS; s++) {
    if (j->fds[s] >= 0) job_pump(j, s, 64);
    if (j->fds[s] >= 0) close(j->fds[s]);
  }
  if (j->stdin_fd >= 0) close(j->stdin_fd);
  free(j->stdin_data);
  /* With no other process left in the sandbox, nothing can change the agent before the next
   * command: its state now is what a reuse check needs, sent along so the host skips asking. */
  bool alone = getpid() == 1 && selfstate_others() == 0;
  mp_writer w;
  reply_begin(&w, "exit", j->id, (alone ? 10 : 9) + (j->has_report ? 2 : 0));
  mp_str(&w, "exitCode");
  if (WIFEXITED(j->status)) mp_int(&w, WEXITSTATUS(j->status));
  else mp_nil(&w);
  mp_str(&w, "signal");
  if (WIFSIGNALED(j->status)) mp_int(&w, WTERMSIG(j->status));
  else mp_nil(&w);
  mp_str(&w, "timedOut");
  mp_bool(&w, j->timed_out);
  mp_str(&w, "cancelled");
  mp_bool(&w, j->cancelled);
  mp_str(&w, "durationUs");
  mp_uint(&w, (uint64_t)(j->end_us - j->start_us));
  mp_str(&w, "stdoutBytes");
  mp_uint(&w, j->bytes[0]);
  mp_str(&w, "stderrBytes");
  mp_uint(&w, j->bytes[1]);
  mp_str(&w, "stdoutTruncated");
  mp_bool(&w, j->bytes[0] > j->cap_bytes);
  mp_str(&w, "stderrTruncated");
  mp_bool(&w, j->bytes[1] > j->cap_bytes);
  if (j->has_report) {
    mp_str(&w, "reportBytes");
    mp_uint(&w, j->bytes[2]);
    mp_str(&w, "reportTruncated");
    mp_bool(&w, j->bytes[2] > j->cap_bytes);
  }
  if (alone) {
    char state[2048];
    selfstate_describe(state, sizeof state);
    mp_str(&w, "agentStateAlone");
    mp_str(&w, state);
  }
  channel_send(&w);
  j->used = false;
}

void jobs_reap(void) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int i = 0; i < MAX_JOBS; i++) {
      if (jobs[i].used && jobs[i].pid == pid) {
        jobs[i].status = status;
        jobs[i].end_us = now_us();
        job_finish(&jobs[i]);
      }
    }
  }
}

void job_kill(job *j, bool timed_out) {
  if (timed_out) j->timed_out = true;
  else j->cancelled = true;
  kill(-j->pid, SIGKILL);
  kill(j->pid, SIGKILL);
}

int64_t jobs_next_deadline(void) {
  int64_t next = 0;
  for (int i = 0; i < MAX_JOBS; i++) {
    job *j = &jobs[i];
    if (j->used && j->deadline_us && !j->timed_out && (!next || j->deadline_us < next)) next = j->deadline_us;
  }
  return next;
}

void jobs_expire(int64_t now) {
  for (int i = 0; i < MAX_JOBS; i++) {
    job *j = &jobs[i];
    if (j->used && j->deadline_us && !j->timed_out && now >= j->deadline_us) job_kill(j, true);
  }
}
