/* wasmbox.h — the wasmbox ABI v1 from C (header only, C11, needs only wasi-libc).
 *
 * A tool module exports `memory`, `wasmbox_alloc(len) -> ptr` and
 * `wasmbox_call(ptr, len) -> (ptr << 32) | len`. The host writes the call's args (a MessagePack
 * map with str keys) into memory from `wasmbox_alloc`, calls `wasmbox_call`, and reads back a
 * MessagePack map `{"ok": value}` or `{"error": "message"}`. One instance serves one call, so
 * nothing here frees memory it does not have to.
 *
 *     #include "wasmbox.h"
 *     static int greet(const wb_value *args, wb_writer *out) {
 *         wb_value name;
 *         if (!wb_map_get(args, "name", &name) || name.type != WB_STR)
 *             return wb_error(out, "args: \"name\" must be a string");
 *         wb_write_map(out, 1);                 // write exactly one value: the "ok" value
 *         wb_write_cstr(out, "hello");
 *         wb_write_str(out, (const char *)name.data, name.len);
 *         return 0;
 *     }
 *     WASMBOX_TOOL(greet)
 *
 * Build as a reactor: zig cc -target wasm32-wasi -mexec-model=reactor -O2 -I runtimes tool.c
 * (runtimes/examples/build.py does that for each .c file in runtimes/examples/c/).
 *
 * Reading: `wb_read` checks a whole value (nesting included, without recursion) against the
 * buffer's bounds before anything else looks at it, so malformed or hostile input gives `false`,
 * never an out-of-bounds read. Strings are (data, len) views into the input, not NUL-terminated;
 * `wb_cstr` makes a terminated copy. `wb_next`/`wb_map_get` re-check each item they return, so
 * walking every level of a deeply nested value costs depth x size; top-level lookups are linear.
 *
 * Writing: a `wb_writer` grows with realloc; if memory runs out it sets `failed` and ignores
 * further writes (the call then reports "out of memory", which the host files as memory_limit).
 * Strings must be UTF-8 (use bin for bytes): WASMBOX_TOOL checks the reply before it goes back,
 * so a handler bug becomes a clean {"error"}, and error messages get U+FFFD for bad bytes.
 *
 * Host functions: WASMBOX_HOST_FUNCTION declares the import, wb_call_host sends a request map,
 * wb_parse_reply splits the host's {"ok"}/{"error"} reply.
 */
#ifndef WASMBOX_H
#define WASMBOX_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WB_API static inline __attribute__((unused))

/* ---- values ------------------------------------------------------------------------------- */

typedef enum {
    WB_NIL, WB_BOOL,
    WB_INT,   /* any integer that fits int64_t: as.i */
    WB_UINT,  /* an unsigned integer above INT64_MAX: as.u */
    WB_FLOAT, /* float32 or float64: as.f */
    WB_STR, WB_BIN, WB_EXT, /* data/len (ext: as.ext_type too) */
    WB_ARRAY, /* len items from data */
    WB_MAP    /* len key/value pairs from data */
} wb_type;

typedef struct wb_value {
    wb_type type;
    uint32_t len;                 /* str/bin/ext: bytes; array: items; map: pairs */
    const uint8_t *data;          /* str/bin/ext: the bytes; array/map: the first item */
    const uint8_t *start, *end;   /* the whole encoded value (to copy it with wb_write_value) */
    union { bool b; int64_t i; uint64_t u; double f; int8_t ext_type; } as;
} wb_value;

static inline uint64_t wb__be(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int k = 0; k < n; k++) v = (v << 8) | p[k];
    return v;
}

/* Decodes the header of the value at p (and the payload of a scalar/str/bin/ext), bounds-checked.
 * Returns the position after it (for array/map: the first item), or NULL if malformed. */
static inline const uint8_t *wb__head(const uint8_t *p, const uint8_t *end, wb_value *v) {
    if (p >= end) return NULL;
    uint8_t c = *p++;
    size_t left = (size_t)(end - p);
    uint32_t n = 0, lenbytes = 0;
    memset(v, 0, sizeof *v);
    v->start = p - 1;
    if (c <= 0x7f) { v->type = WB_INT; v->as.i = c; return p; }
    if (c >= 0xe0) { v->type = WB_INT; v->as.i = (int8_t)c; return p; }
    if (c <= 0x8f) { v->type = WB_MAP; v->len = c & 0x0f; v->data = p; return p; }
    if (c <= 0x9f) { v->type = WB_ARRAY; v->len = c & 0x0f; v->data = p; return p; }
    if (c <= 0xbf) { v->type = WB_STR; n = c & 0x1f; goto payload; }
    switch (c) {
    case 0xc0: v->type = WB_NIL; return p;
    case 0xc2: case 0xc3: v->type = WB_BOOL; v->as.b = c == 0xc3; return p;
    case 0xc4: case 0xc5: case 0xc6: v->type = WB_BIN; lenbytes = 1u << (c - 0xc4); break;
    case 0xc7: case 0xc8: case 0xc9: v->type = WB_EXT; lenbytes = 1u << (c - 0xc7); break;
    case 0xd9: case 0xda: case 0xdb: v->type = WB_STR; lenbytes = 1u << (c - 0xd9); break;
    case 0xdc: case 0xdd: case 0xde: case 0xdf: {
        int w = (c & 1) ? 4 : 2;
        if (left < (size_t)w) return NULL;
        v->type = c <= 0xdd ? WB_ARRAY : WB_MAP;
        v->len = (uint32_t)wb__be(p, w);
        v->data = p + w;
        return p + w;
    }
    case 0xca: case 0xcb: {
        if (left < (c == 0xca ? 4u : 8u)) return NULL;
        v->type = WB_FLOAT;
        if (c == 0xca) {
            uint32_t b = (uint32_t)wb__be(p, 4);
            float f;
            memcpy(&f, &b, 4);
            v->as.f = f;
            return p + 4;
        }
        uint64_t b = wb__be(p, 8);
        memcpy(&v->as.f, &b, 8);
        return p + 8;
    }
    case 0xcc: case 0xcd: case 0xce: case 0xcf: case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        int w = 1 << (c & 3);
        if (left < (size_t)w) return NULL;
        uint64_t u = wb__be(p, w);
        v->type = WB_INT;
        if (c >= 0xd0) { /* signed: sign-extend from w bytes */
            int shift = 64 - 8 * w;
            v->as.i = shift ? (int64_t)(u << shift) >> shift : (int64_t)u;
        } else if (u > (uint64_t)INT64_MAX) { v->type = WB_UINT; v->as.u = u; }
        else v->as.i = (int64_t)u;
        return p + w;
    }
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
        v->type = WB_EXT; n = 1u << (c - 0xd4); goto payload;
    default: return NULL; /* 0xc1 is never used */
    }
    if (left < lenbytes) return NULL;
    n = (uint32_t)wb__be(p, (int)lenbytes);
    p += lenbytes; left -= lenbytes;
payload:
    if (v->type == WB_EXT) {
        if (left < 1) return NULL;
        v->as.ext_type = (int8_t)*p++; left--;
    }
    if (left < n) return NULL;
    v->data = p; v->len = n;
    return p + n;
}

/* The length of the longest valid UTF-8 prefix of s[0..n) (as strict as Python's decoder). */
static inline size_t wb__utf8_prefix(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i], lo = 0x80, hi = 0xbf;
        size_t len = 1;
        if (c >= 0xc2 && c <= 0xdf) {
            len = 2;
        } else if (c >= 0xe0 && c <= 0xef) { /* no overlongs (e0), no surrogates (ed) */
            len = 3; lo = c == 0xe0 ? 0xa0 : 0x80; hi = c == 0xed ? 0x9f : 0xbf;
        } else if (c >= 0xf0 && c <= 0xf4) { /* no overlongs (f0), nothing past U+10FFFF (f4) */
            len = 4; lo = c == 0xf0 ? 0x90 : 0x80; hi = c == 0xf4 ? 0x8f : 0xbf;
        } else if (c >= 0x80) {
            return i;
        }
        if (n - i < len || (len > 1 && (s[i + 1] < lo || s[i + 1] > hi))) return i;
        for (size_t k = 2; k < len; k++)
            if ((s[i + k] & 0xc0) != 0x80) return i;
        i += len;
    }
    return n;
}
WB_API bool wb_utf8_valid(const void *s, size_t n) { return wb__utf8_prefix(s, n) == n; }

static inline bool wb__read(const uint8_t *buf, size_t len, wb_value *v, bool utf8) {
    const uint8_t *end = buf + len;
    const uint8_t *p = wb__head(buf, end, v);
    if (!p || (utf8 && v->type == WB_STR && !wb_utf8_valid(v->data, v->len))) return false;
    uint64_t pending = 0; /* items still to skip */
    if (v->type == WB_ARRAY) pending = v->len;
    else if (v->type == WB_MAP) pending = 2 * (uint64_t)v->len;
    while (pending) {
        wb_value item;
        if (pending > (uint64_t)(end - p)) return false; /* every item takes at least one byte */
        if (!(p = wb__head(p, end, &item))) return false;
        if (utf8 && item.type == WB_STR && !wb_utf8_valid(item.data, item.len)) return false;
        pending--;
        if (item.type == WB_ARRAY) pending += item.len;
        else if (item.type == WB_MAP) pending += 2 * (uint64_t)item.len;
    }
    v->end = p;
    return true;
}
/* Reads one whole value from buf[0..len): true and *v filled (v->end = just past it), or false
 * if the bytes are not a complete MessagePack value. Nested containers are walked with a counter,
 * not recursion, so deep nesting cannot exhaust the stack. (Strings are not checked for UTF-8:
 * see wb_utf8_valid.) */
WB_API bool wb_read(const uint8_t *buf, size_t len, wb_value *v) {
    return wb__read(buf, len, v, false);
}

/* Iterating an array (wb_next) or a map (wb_map_next) that came from wb_read. */
typedef struct { const uint8_t *pos, *end; uint64_t left; } wb_iter;

WB_API wb_iter wb_items(const wb_value *v) {
    wb_iter it = { v->data, v->end, 0 };
    if (v->type == WB_ARRAY) it.left = v->len;
    else if (v->type == WB_MAP) it.left = 2 * (uint64_t)v->len;
    return it;
}
WB_API bool wb_next(wb_iter *it, wb_value *out) {
    if (!it->left || !it->pos || !wb_read(it->pos, (size_t)(it->end - it->pos), out)) return false;
    it->pos = out->end;
    it->left--;
    return true;
}
WB_API bool wb_map_next(wb_iter *it, wb_value *key, wb_value *val) {
    return it->left >= 2 && wb_next(it, key) && wb_next(it, val);
}

WB_API bool wb_str_eq(const wb_value *v, const char *s) {
    size_t n = strlen(s);
    return v->type == WB_STR && v->len == n && memcmp(v->data, s, n) == 0;
}
/* The value of str key `key` in map `map` (the first one if repeated). */
WB_API bool wb_map_get(const wb_value *map, const char *key, wb_value *out) {
    if (map->type != WB_MAP) return false;
    wb_iter it = wb_items(map);
    wb_value k;
    while (wb_map_next(&it, &k, out))
        if (wb_str_eq(&k, key)) return true;
    return false;
}
/* True if `map` has a key that is not in the NULL-terminated list `allowed` (a non-str key
 * counts); *bad is then that key. */
WB_API bool wb_unknown_key(const wb_value *map, const char *const *allowed, wb_value *bad) {
    wb_iter it = wb_items(map);
    wb_value v;
    while (wb_map_next(&it, bad, &v)) {
        const char *const *a = allowed;
        while (*a && !wb_str_eq(bad, *a)) a++;
        if (!*a) return true;
    }
    return false;
}
/* A malloc'd NUL-terminated copy of a str; NULL if not a str, if it holds a NUL, or no memory. */
WB_API char *wb_cstr(const wb_value *v) {
    if (v->type != WB_STR || memchr(v->data, 0, v->len)) return NULL;
    char *s = malloc((size_t)v->len + 1);
    if (s) { memcpy(s, v->data, v->len); s[v->len] = 0; }
    return s;
}
WB_API bool wb_as_int(const wb_value *v, int64_t *out) {
    if (v->type != WB_INT) return false;
    *out = v->as.i; return true;
}
WB_API bool wb_as_uint(const wb_value *v, uint64_t *out) {
    if (v->type == WB_UINT) { *out = v->as.u; return true; }
    if (v->type == WB_INT && v->as.i >= 0) { *out = (uint64_t)v->as.i; return true; }
    return false;
}
WB_API bool wb_as_double(const wb_value *v, double *out) { /* floats, and ints converted */
    if (v->type == WB_FLOAT) *out = v->as.f;
    else if (v->type == WB_INT) *out = (double)v->as.i;
    else if (v->type == WB_UINT) *out = (double)v->as.u;
    else return false;
    return true;
}

/* ---- writing ------------------------------------------------------------------------------ */

typedef struct wb_writer {
    uint8_t *buf;
    size_t len, cap;
    bool failed;     /* out of memory: later writes are ignored */
    bool is_error;   /* (the call's writer) wb_error replaced the contents */
} wb_writer;

WB_API void wb_write_raw(wb_writer *w, const void *bytes, size_t n) {
    if (w->failed) return;
    if (n > w->cap - w->len) {
        size_t cap = w->cap ? w->cap : 64;
        while (cap - w->len < n) {
            if (cap > SIZE_MAX / 2) { w->failed = true; return; }
            cap *= 2;
        }
        uint8_t *buf = realloc(w->buf, cap);
        if (!buf) { w->failed = true; return; }
        w->buf = buf; w->cap = cap;
    }
    if (n) memcpy(w->buf + w->len, bytes, n);
    w->len += n;
}
static inline void wb__put(wb_writer *w, uint8_t tag, uint64_t v, int n) { /* tag + n BE bytes */
    uint8_t b[9] = { tag };
    for (int k = 0; k < n; k++) b[1 + k] = (uint8_t)(v >> (8 * (n - 1 - k)));
    wb_write_raw(w, b, 1 + (size_t)n);
}
/* Header for n items/bytes: the fix form below fixmax (-1: none), else tag8 (0: none)/16/32. */
static inline void wb__len(wb_writer *w, size_t n, uint8_t fixbase, int fixmax,
                           uint8_t tag8, uint8_t tag16, uint8_t tag32) {
    if ((uint64_t)n > UINT32_MAX) w->failed = true;
    else if (fixmax >= 0 && n <= (size_t)fixmax) wb__put(w, (uint8_t)(fixbase + n), 0, 0);
    else if (tag8 && n <= 0xff) wb__put(w, tag8, n, 1);
    else if (n <= 0xffff) wb__put(w, tag16, n, 2);
    else wb__put(w, tag32, n, 4);
}
WB_API void wb_write_nil(wb_writer *w) { wb__put(w, 0xc0, 0, 0); }
WB_API void wb_write_bool(wb_writer *w, bool b) { wb__put(w, b ? 0xc3 : 0xc2, 0, 0); }
WB_API void wb_write_map(wb_writer *w, size_t pairs) {
    wb__len(w, pairs, 0x80, 15, 0, 0xde, 0xdf);
}
WB_API void wb_write_array(wb_writer *w, size_t items) {
    wb__len(w, items, 0x90, 15, 0, 0xdc, 0xdd);
}
WB_API void wb_write_uint(wb_writer *w, uint64_t v) {
    if (v <= 0x7f) wb__put(w, (uint8_t)v, 0, 0);
    else if (v <= 0xff) wb__put(w, 0xcc, v, 1);
    else if (v <= 0xffff) wb__put(w, 0xcd, v, 2);
    else if (v <= 0xffffffffu) wb__put(w, 0xce, v, 4);
    else wb__put(w, 0xcf, v, 8);
}
WB_API void wb_write_int(wb_writer *w, int64_t v) {
    if (v >= 0) wb_write_uint(w, (uint64_t)v);
    else if (v >= -32) wb__put(w, (uint8_t)v, 0, 0);
    else if (v >= INT8_MIN) wb__put(w, 0xd0, (uint64_t)v, 1);
    else if (v >= INT16_MIN) wb__put(w, 0xd1, (uint64_t)v, 2);
    else if (v >= INT32_MIN) wb__put(w, 0xd2, (uint64_t)v, 4);
    else wb__put(w, 0xd3, (uint64_t)v, 8);
}
WB_API void wb_write_double(wb_writer *w, double d) {
    uint64_t b; memcpy(&b, &d, 8); wb__put(w, 0xcb, b, 8);
}
WB_API void wb_write_str(wb_writer *w, const char *s, size_t n) {
    wb__len(w, n, 0xa0, 31, 0xd9, 0xda, 0xdb); wb_write_raw(w, s, n);
}
WB_API void wb_write_cstr(wb_writer *w, const char *s) { wb_write_str(w, s, strlen(s)); }
WB_API void wb_write_bin(wb_writer *w, const void *b, size_t n) {
    wb__len(w, n, 0, -1, 0xc4, 0xc5, 0xc6); wb_write_raw(w, b, n);
}
/* Copies an already-encoded value (e.g. one read from the args or a host reply) verbatim. */
WB_API void wb_write_value(wb_writer *w, const wb_value *v) {
    wb_write_raw(w, v->start, (size_t)(v->end - v->start));
}
WB_API void wb_writer_free(wb_writer *w) { free(w->buf); *w = (wb_writer){0}; }

/* ---- results ------------------------------------------------------------------------------ */

/* Replace whatever the handler wrote with {"error": msg}; returns 1 so a handler can
 * `return wb_error_n(out, msg, len);`. Bytes that are not UTF-8 become U+FFFD. */
WB_API int wb_error_n(wb_writer *out, const char *msg, size_t n) {
    wb_writer text = {0};
    for (size_t ok; n; msg += ok + 1, n -= ok + 1) {
        ok = wb__utf8_prefix((const uint8_t *)msg, n);
        wb_write_raw(&text, msg, ok);
        if (ok == n) break;
        wb_write_raw(&text, "\xef\xbf\xbd", 3);
    }
    out->len = 0; out->failed = false; out->is_error = true;
    wb_write_map(out, 1); wb_write_str(out, "error", 5);
    if (text.failed) wb_write_str(out, "out of memory", 13);
    else wb_write_str(out, (const char *)text.buf, text.len);
    wb_writer_free(&text);
    return 1;
}
/* printf-style wb_error_n: `return wb_error(out, "cannot open %s: %s", path, strerror(errno));` */
__attribute__((format(printf, 2, 3), unused))
static int wb_error(wb_writer *out, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt); va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    char *msg = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (msg) vsnprintf(msg, (size_t)n + 1, fmt, ap2);
    va_end(ap2); va_end(ap);
    if (!msg) return wb_error_n(out, "out of memory", 13);
    wb_error_n(out, msg, (size_t)n);
    free(msg);
    return 1;
}

static inline int64_t wb__pack(const void *p, size_t n) {
    return (int64_t)(((uint64_t)(uintptr_t)p << 32) | (uint32_t)n);
}

typedef int (*wb_handler)(const wb_value *args, wb_writer *out);

/* The body of wasmbox_call: checks that the args are one map, runs the handler on a writer that
 * already holds `{"ok":`, and makes sure what goes back is one well-formed reply. */
static inline int64_t wb__call(wb_handler handler, int32_t ptr, int32_t len) {
    static const uint8_t oom[] = "\x81\xa5" "error" "\xad" "out of memory";
    const uint8_t *in = (const uint8_t *)(uintptr_t)(uint32_t)ptr;
    wb_writer out = {0};
    wb_value args;
    wb_write_raw(&out, "\x81\xa2ok", 4);
    if (!wb_read(in, (uint32_t)len, &args) || args.end != in + (uint32_t)len)
        wb_error(&out, "args are not one MessagePack value");
    else if (args.type != WB_MAP)
        wb_error(&out, "args must be a map");
    else if (handler(&args, &out) != 0 && !out.is_error)
        wb_error(&out, "the tool failed without a message");
    fflush(NULL); /* a reactor never exits, so stdio would keep what it buffered */
    wb_value reply; /* {"ok": <exactly one value>} or {"error": ...}, all strings UTF-8 */
    size_t skip = out.is_error ? 0 : 4;
    if (!out.failed && (!wb__read(out.buf + skip, out.len - skip, &reply, true) ||
                        reply.end != out.buf + out.len))
        wb_error(&out, "the tool wrote a malformed result (not one value, or a str not UTF-8)");
    if (out.failed) return wb__pack(oom, sizeof oom - 1);
    return wb__pack(out.buf, out.len);
}

/* Memory for the host: the args, and host-function replies. If there is none left, it grows
 * memory until that fails too and then traps: the host sees the cap reached and reports
 * memory_limit (ARCHITECTURE.md, "The outcome table"), not a bare trap. */
static inline int32_t wb__alloc(int32_t len) {
    void *p = malloc((uint32_t)len ? (uint32_t)len : 1);
    if (!p) {
#ifdef __wasm__
        while (__builtin_wasm_memory_grow(0, 1) != (size_t)-1) {}
#endif
        __builtin_trap();
    }
    return (int32_t)(uintptr_t)p;
}

/* Defines the exports wasmbox_alloc and wasmbox_call around
 * `int handler(const wb_value *args, wb_writer *out)`, which writes exactly one value (the "ok"
 * value) to `out` and returns 0, or returns wb_error(out, ...). Use once per module. */
#define WASMBOX_TOOL(handler)                                                                   \
    __attribute__((export_name("wasmbox_alloc"))) int32_t wasmbox_alloc(int32_t len) {          \
        return wb__alloc(len);                                                                  \
    }                                                                                           \
    __attribute__((export_name("wasmbox_call"))) int64_t wasmbox_call(int32_t ptr, int32_t len) { \
        return wb__call(handler, ptr, len);                                                     \
    }

/* ---- host functions ----------------------------------------------------------------------- */

/* Declares host function `name` (as granted in the manifest) as the C function `ident`:
 * WASMBOX_HOST_FUNCTION(kv_get, "kv.get"). Only functions a module calls end up imported. */
#define WASMBOX_HOST_FUNCTION(ident, name)                                               \
    __attribute__((import_module("wasmbox"), import_name(name))) int64_t ident(int32_t, int32_t)

typedef int64_t (*wb_host_fn)(int32_t ptr, int32_t len);
typedef struct { const uint8_t *data; size_t len; } wb_bytes;

/* Sends the request map in `req` (keyword args) to host function `fn`; returns the reply bytes,
 * which the host wrote into memory from wasmbox_alloc. {NULL, 0} if `req` ran out of memory. */
WB_API wb_bytes wb_call_host(wb_host_fn fn, const wb_writer *req) {
    if (req->failed) return (wb_bytes){ NULL, 0 };
    uint64_t r = (uint64_t)fn((int32_t)(uintptr_t)req->buf, (int32_t)req->len);
    return (wb_bytes){ (const uint8_t *)(uintptr_t)(uint32_t)(r >> 32), (uint32_t)r };
}

enum { WB_REPLY_MALFORMED = -1, WB_REPLY_ERROR = 0, WB_REPLY_OK = 1 };
/* Splits a reply: WB_REPLY_OK with *value = v for {"ok": v}, WB_REPLY_ERROR with *value = the
 * message (a str) for {"error": m}, WB_REPLY_MALFORMED for anything else. */
WB_API int wb_parse_reply(wb_bytes reply, wb_value *value) {
    wb_value map, key;
    if (!reply.data || !wb_read(reply.data, reply.len, &map) || map.end != reply.data + reply.len
        || map.type != WB_MAP || map.len != 1)
        return WB_REPLY_MALFORMED;
    wb_iter it = wb_items(&map);
    if (!wb_map_next(&it, &key, value)) return WB_REPLY_MALFORMED;
    if (wb_str_eq(&key, "ok")) return WB_REPLY_OK;
    if (wb_str_eq(&key, "error") && value->type == WB_STR) return WB_REPLY_ERROR;
    return WB_REPLY_MALFORMED;
}

#endif /* WASMBOX_H */
