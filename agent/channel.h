/* Framed msgpack over the inherited channel fds: a 4-byte big-endian length, then one map. */
#ifndef SANDGYM_CHANNEL_H
#define SANDGYM_CHANNEL_H

#include "msgpack.h"

#define CHANNEL_MAX_FRAME (80u * 1024u * 1024u)
/* Where the agent keeps its channel, so a restarted owner can find it in /proc/<pid>/fd. */
#define CHANNEL_REQUEST_FD 100
#define CHANNEL_RESPONSE_FD 101

void channel_init(int out_fd);
/* Writes bytes outside any frame: only the sync marker does this. */
void channel_write_raw(const uint8_t *p, size_t n);
/* Sends the writer's bytes as one frame and resets the writer. */
void channel_send(mp_writer *w);
/* Starts a reply map: its type, the request id, then room for `fields` more entries. */
void reply_begin(mp_writer *w, const char *type, uint32_t id, uint32_t fields);
void send_ok(uint32_t id);
void send_error(uint32_t id, const char *code, const char *message);
void send_errno(uint32_t id, int err, const char *what);

#endif
