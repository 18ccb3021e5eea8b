#include "channel.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static int channel_out = -1;

void channel_init(int out_fd) { channel_out = out_fd; }

static void write_all(const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t k = write(channel_out, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        /* a VM's channel is one non-blocking port for both directions: wait for room */
        struct pollfd room = {.fd = channel_out, .events = POLLOUT};
        poll(&room, 1, -1);
        continue;
      }
      /* The host side is gone: nothing is left to report to. */
      _exit(0);
    }
    p += k;
    n -= (size_t)k;
  }
}

void channel_write_raw(const uint8_t *p, size_t n) { write_all(p, n); }

/* The request id of a reply the writer holds (reply_begin wrote its type, then its id). */
static bool reply_id(const mp_writer *w, uint32_t *id) {
  mp_reader r = {.p = w->data, .end = w->data + (w->len < 64 ? w->len : 64)};
  mp_item it;
  if (!mp_next(&r, &it) || it.type != MP_MAP) return false;
  for (uint32_t i = 0; i < 2; i++) {
    mp_item key, value;
    if (!mp_next(&r, &key) || !mp_next(&r, &value)) return false;
    if (mp_item_is(&key, "id") && value.type == MP_INT && value.i >= 0 && value.i <= UINT32_MAX) {
      *id = (uint32_t)value.i;
      return true;
    }
  }
  return false;
}

void channel_send(mp_writer *w) {
  if (w->failed) {
    mp_writer_free(w);
    return;
  }
  if (w->len > CHANNEL_MAX_FRAME) {
    /* a reply the host could not take would end the sandbox: it becomes that call's error */
    uint32_t id;
    bool known = reply_id(w, &id);
    mp_writer_free(w);
    if (known) send_error(id, "reply_too_large", "the reply would not fit in one channel frame");
    return;
  }
  uint8_t header[4] = {(uint8_t)(w->len >> 24), (uint8_t)(w->len >> 16), (uint8_t)(w->len >> 8), (uint8_t)w->len};
  write_all(header, 4);
  write_all(w->data, w->len);
  mp_writer_free(w);
}

void reply_begin(mp_writer *w, const char *type, uint32_t id, uint32_t fields) {
  mp_writer_init(w);
  mp_map(w, 2 + fields);
  mp_str(w, "t");
  mp_str(w, type);
  mp_str(w, "id");
  mp_uint(w, id);
}

void send_ok(uint32_t id) {
  mp_writer w;
  reply_begin(&w, "ok", id, 0);
  channel_send(&w);
}

void send_error(uint32_t id, const char *code, const char *message) {
  mp_writer w;
  reply_begin(&w, "error", id, 2);
  mp_str(&w, "code");
  mp_str(&w, code);
  mp_str(&w, "message");
  mp_str(&w, message);
  channel_send(&w);
}

static const char *errno_code(int err) {
  switch (err) {
    case ENOENT: return "not_found";
    case EACCES: case EPERM: case EROFS: return "permission_denied";
    case EISDIR: return "is_directory";
    case ENOTDIR: return "not_directory";
    case ELOOP: case EXDEV: return "path_escape";
    case ENOSPC: case EDQUOT: return "no_space";
    case EFBIG: return "file_too_large";
    /* the sandbox's own limits (pids, memory, open files): its doing, never the platform's */
    case EAGAIN: case ENOMEM: case EMFILE: case ENFILE: return "no_resources";
    case ENAMETOOLONG: return "invalid_path";
    default: return "io_error";
  }
}

void send_errno(uint32_t id, int err, const char *what) {
  char message[512];
  snprintf(message, sizeof message, "%s: %s", what, strerror(err));
  send_error(id, errno_code(err), message);
}
