/* Commands the agent runs on the host's behalf. */
#ifndef SANDGYM_JOBS_H
#define SANDGYM_JOBS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "msgpack.h"

#define MAX_JOBS 256
/* The streams a job's output comes on: stdout, stderr, and the report channel. */
#define JOB_STREAMS 3
/* The lowest and highest fd number a report channel may take. */
#define REPORT_FD_MIN 3
#define REPORT_FD_MAX 1023

typedef struct {
  uint32_t id;
  char **argv;
  char **env; /* KEY=VALUE entries laid over the agent's own environment */
  char *cwd;
  uint8_t *stdin_data;
  size_t stdin_len;
  uint64_t timeout_ms; /* 0: no deadline */
  uint64_t cap_bytes;  /* captured per stream; the rest is counted and dropped */
  int64_t uid, gid;    /* -1: keep the agent's (root) */
  /* When non-zero, the command inherits the write end of a pipe on this fd number, and what is
   * written there comes back as a third stream: a channel only the command's own processes can
   * write and none can take back (see jobs.c). */
  uint32_t report_fd;
  const gid_t *groups; /* supplementary groups, with gid */
  size_t ngroups;
} exec_request;

typedef struct {
  bool used;
  uint32_t id;
  pid_t pid;
  int fds[3]; /* stdout, stderr and report read ends; -1 once closed (or never opened) */
  int stdin_fd;
  uint8_t *stdin_data;
  size_t stdin_len, stdin_off;
  uint64_t cap_bytes;
  uint64_t bytes[3];
  bool has_report;
  int64_t start_us, end_us, deadline_us;
  bool timed_out, cancelled;
  int status;
} job;

extern job jobs[MAX_JOBS];

int64_t now_us(void);
char **read_strv(mp_reader *r, const mp_item *array, const char **why);
void exec_request_free(exec_request *req);
void job_start(exec_request *req);
job *job_by_id(uint32_t id);
bool job_pump(job *j, int stream, int max_reads);
void job_feed_stdin(job *j);
void job_kill(job *j, bool timed_out);
void jobs_reap(void);
int64_t jobs_next_deadline(void);
void jobs_expire(int64_t now);

#endif
