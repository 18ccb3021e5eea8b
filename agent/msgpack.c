#include "msgpack.h"

#include <stdlib.h>
#include <string.h>

void mp_writer_init(mp_writer *w) {
  w->data = NULL;
  w->len = 0;
  w->cap = 0;
  w->failed = false;
}

void mp_writer_free(mp_writer *w) {
  free(w->data);
  mp_writer_init(w);
}

static void put(mp_writer *w, const void *src, size_t n) {
  if (w->failed) return;
  if (w->len + n > w->cap) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->len + n) cap *= 2;
    uint8_t *grown = realloc(w->data, cap);
    if (!grown) {
      w->failed = true;
      return;
    }
    w->data = grown;
    w->cap = cap;
  }
  memcpy(w->data + w->len, src, n);
  w->len += n;
}

static void put_byte(mp_writer *w, uint8_t b) { put(w, &b, 1); }

static void put_be(mp_writer *w, uint64_t v, int bytes) {
  uint8_t buf[8];
  for (int i = 0; i < bytes; i++) buf[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
  put(w, buf, (size_t)bytes);
}

static void header(mp_writer *w, uint32_t n, uint8_t fix, uint8_t fixmax, uint8_t b8, uint8_t b16, uint8_t b32) {
  if (n <= fixmax && fix) {
    put_byte(w, (uint8_t)(fix | n));
  } else if (b8 && n <= 0xff) {
    put_byte(w, b8);
    put_be(w, n, 1);
  } else if (n <= 0xffff) {
    put_byte(w, b16);
    put_be(w, n, 2);
  } else {
    put_byte(w, b32);
    put_be(w, n, 4);
  }
}

void mp_map(mp_writer *w, uint32_t n) { header(w, n, 0x80, 15, 0, 0xde, 0xdf); }
void mp_array(mp_writer *w, uint32_t n) { header(w, n, 0x90, 15, 0, 0xdc, 0xdd); }

void mp_strn(mp_writer *w, const char *s, size_t n) {
  header(w, (uint32_t)n, 0xa0, 31, 0xd9, 0xda, 0xdb);
  put(w, s, n);
}

void mp_str(mp_writer *w, const char *s) { mp_strn(w, s, strlen(s)); }

void mp_bin(mp_writer *w, const void *data, size_t n) {
  header(w, (uint32_t)n, 0, 0, 0xc4, 0xc5, 0xc6);
  put(w, data, n);
}

void mp_uint(mp_writer *w, uint64_t v) {
  if (v < 128) {
    put_byte(w, (uint8_t)v);
  } else if (v <= 0xffffffffu) {
    put_byte(w, 0xce);
    put_be(w, v, 4);
  } else {
    put_byte(w, 0xcf);
    put_be(w, v, 8);
  }
}

void mp_int(mp_writer *w, int64_t v) {
  if (v >= 0) {
    mp_uint(w, (uint64_t)v);
  } else if (v >= -32) {
    put_byte(w, (uint8_t)(int8_t)v);
  } else {
    put_byte(w, 0xd3);
    put_be(w, (uint64_t)v, 8);
  }
}

void mp_bool(mp_writer *w, bool v) { put_byte(w, v ? 0xc3 : 0xc2); }
void mp_nil(mp_writer *w) { put_byte(w, 0xc0); }
void mp_raw(mp_writer *w, const void *data, size_t n) {
  if (n) put(w, data, n);
}

static bool take(mp_reader *r, size_t n, const uint8_t **out) {
  if ((size_t)(r->end - r->p) < n) return false;
  *out = r->p;
  r->p += n;
  return true;
}

static bool take_be(mp_reader *r, int bytes, uint64_t *out) {
  const uint8_t *p;
  if (!take(r, (size_t)bytes, &p)) return false;
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v = (v << 8) | p[i];
  *out = v;
  return true;
}

static bool sized(mp_reader *r, mp_item *out, mp_type type, int len_bytes) {
  uint64_t n;
  if (!take_be(r, len_bytes, &n)) return false;
  out->type = type;
  out->len = (uint32_t)n;
  if (type == MP_STR || type == MP_BIN) return take(r, n, &out->ptr);
  return true;
}

bool mp_next(mp_reader *r, mp_item *out) {
  const uint8_t *p;
  uint64_t v;
  memset(out, 0, sizeof(*out));
  out->type = MP_BAD;
  if (!take(r, 1, &p)) return false;
  uint8_t b = *p;
  if (b <= 0x7f) {
    out->type = MP_INT;
    out->i = b;
    return true;
  }
  if (b >= 0xe0) {
    out->type = MP_INT;
    out->i = (int8_t)b;
    return true;
  }
  if ((b & 0xf0) == 0x80) {
    out->type = MP_MAP;
    out->len = b & 0x0f;
    return true;
  }
  if ((b & 0xf0) == 0x90) {
    out->type = MP_ARRAY;
    out->len = b & 0x0f;
    return true;
  }
  if ((b & 0xe0) == 0xa0) {
    out->type = MP_STR;
    out->len = b & 0x1f;
    return take(r, out->len, &out->ptr);
  }
  switch (b) {
    case 0xc0: out->type = MP_NIL; return true;
    case 0xc2: out->type = MP_BOOL; out->b = false; return true;
    case 0xc3: out->type = MP_BOOL; out->b = true; return true;
    case 0xc4: return sized(r, out, MP_BIN, 1);
    case 0xc5: return sized(r, out, MP_BIN, 2);
    case 0xc6: return sized(r, out, MP_BIN, 4);
    case 0xd9: return sized(r, out, MP_STR, 1);
    case 0xda: return sized(r, out, MP_STR, 2);
    case 0xdb: return sized(r, out, MP_STR, 4);
    case 0xdc: return sized(r, out, MP_ARRAY, 2);
    case 0xdd: return sized(r, out, MP_ARRAY, 4);
    case 0xde: return sized(r, out, MP_MAP, 2);
    case 0xdf: return sized(r, out, MP_MAP, 4);
    case 0xcc: case 0xcd: case 0xce: case 0xcf: {
      int bytes = 1 << (b - 0xcc);
      if (!take_be(r, bytes, &v)) return false;
      out->type = MP_INT;
      out->i = (int64_t)v;
      return true;
    }
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
      int bytes = 1 << (b - 0xd0);
      if (!take_be(r, bytes, &v)) return false;
      int shift = 64 - 8 * bytes;
      out->type = MP_INT;
      out->i = shift ? ((int64_t)(v << shift)) >> shift : (int64_t)v;
      return true;
    }
    case 0xcb: { /* float64: the host's encoder uses it for large whole numbers */
      if (!take_be(r, 8, &v)) return false;
      double d;
      memcpy(&d, &v, sizeof d);
      out->type = MP_FLOAT;
      out->i = (int64_t)d;
      return true;
    }
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: { /* fixext: a type byte, then 1-16 bytes */
      const uint8_t *ignored;
      out->type = MP_NIL; /* no extension type means anything to the agent */
      return take(r, 1 + ((size_t)1 << (b - 0xd4)), &ignored);
    }
    case 0xc7: case 0xc8: case 0xc9: {
      const uint8_t *ignored;
      if (!take_be(r, 1 << (b - 0xc7), &v)) return false;
      out->type = MP_NIL;
      return take(r, 1 + v, &ignored);
    }
    default: return false;
  }
}

bool mp_skip(mp_reader *r) {
  mp_item it;
  if (!mp_next(r, &it)) return false;
  if (it.type == MP_ARRAY) {
    for (uint32_t i = 0; i < it.len; i++) if (!mp_skip(r)) return false;
  } else if (it.type == MP_MAP) {
    for (uint32_t i = 0; i < 2 * it.len; i++) if (!mp_skip(r)) return false;
  }
  return true;
}

bool mp_item_is(const mp_item *it, const char *s) {
  size_t n = strlen(s);
  return it->type == MP_STR && it->len == n && memcmp(it->ptr, s, n) == 0;
}
