/* A minimal msgpack writer and reader: just the types the agent protocol uses
 * (maps, arrays, strings, binary, integers, booleans, nil). */
#ifndef SANDGYM_MSGPACK_H
#define SANDGYM_MSGPACK_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>

typedef struct {
  uint8_t *data;
  size_t len;
  size_t cap;
  bool failed; /* set when an allocation fails; the frame is then dropped */
} mp_writer;

void mp_writer_init(mp_writer *w);
void mp_writer_free(mp_writer *w);
void mp_map(mp_writer *w, uint32_t entries);
void mp_array(mp_writer *w, uint32_t entries);
void mp_str(mp_writer *w, const char *s);
void mp_strn(mp_writer *w, const char *s, size_t n);
void mp_bin(mp_writer *w, const void *data, size_t n);
void mp_int(mp_writer *w, int64_t v);
void mp_uint(mp_writer *w, uint64_t v);
void mp_bool(mp_writer *w, bool v);
void mp_nil(mp_writer *w);
/* Appends bytes that are already msgpack-encoded. */
void mp_raw(mp_writer *w, const void *data, size_t n);

typedef enum { MP_NIL, MP_BOOL, MP_INT, MP_FLOAT, MP_STR, MP_BIN, MP_ARRAY, MP_MAP, MP_BAD } mp_type;

typedef struct {
  const uint8_t *p;
  const uint8_t *end;
} mp_reader;

/* One decoded item. For STR and BIN, ptr/len point into the frame. For ARRAY and MAP, len is the
 * number of entries and the entries follow in the reader. */
typedef struct {
  mp_type type;
  bool b;
  int64_t i;
  const uint8_t *ptr;
  uint32_t len;
} mp_item;

bool mp_next(mp_reader *r, mp_item *out);
bool mp_skip(mp_reader *r);
bool mp_item_is(const mp_item *it, const char *s);

#endif
