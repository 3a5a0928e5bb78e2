/* word_count: counts the words, lines and bytes of a file or of a text (wasmbox ABI v1 reactor).
 *
 * args:   {"path": str}  a file the manifest lets the tool see (e.g. under /data), read via WASI
 *     or  {"text": str}  the text itself
 * result: {"words": n, "lines": n, "bytes": n}
 *
 * words are maximal runs of bytes that are not ASCII whitespace (space, \t \n \v \f \r), as in
 * Python's bytes.split(). lines counts lines as people do: the newlines, plus one for a last
 * line without a newline at its end ("a\nb" has 2 lines, "a\n" has 1, "" has 0).
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wasmbox.h"

typedef struct {
    uint64_t words, lines, bytes;
    bool in_word;
    uint8_t last; /* the last byte seen */
} counts;

/* For each byte: bit 0 set if it is ASCII whitespace, bit 1 too if it is a newline. */
static const uint8_t kind[256] = {
    [' '] = 1, ['\t'] = 1, ['\n'] = 3, ['\v'] = 1, ['\f'] = 1, ['\r'] = 1,
};

static void count(counts *c, const uint8_t *p, size_t n) {
    uint32_t in_word = c->in_word;
    for (size_t start = 0; start < n; start += 1u << 24) { /* 32-bit sums: less fuel */
        size_t stop = n - start > (1u << 24) ? start + (1u << 24) : n;
        uint32_t words = 0, lines = 0;
        for (size_t k = start; k < stop; k++) {
            uint32_t t = kind[p[k]];
            words += ~(t | in_word) & 1; /* a word starts: not space, and not in a word */
            lines += t >> 1;
            in_word = (t & 1) ^ 1;
        }
        c->words += words;
        c->lines += lines;
    }
    c->in_word = in_word;
    if (n) c->last = p[n - 1];
    c->bytes += n;
}

static int count_file(const wb_value *path, counts *c, wb_writer *out) {
    static uint8_t buf[64 * 1024];
    char *name = wb_cstr(path);
    if (!name) {
        if (memchr(path->data, 0, path->len))
            return wb_error(out, "args: \"path\" contains a NUL byte");
        return wb_error(out, "out of memory");
    }
    struct stat st;
    int rc = 0, fd = open(name, O_RDONLY);
    if (fd < 0) {
        rc = wb_error(out, "cannot open %s: %s", name, strerror(errno));
    } else if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        rc = wb_error(out, "cannot read %s: %s", name, strerror(EISDIR));
        close(fd);
    } else {
        for (;;) {
            ssize_t n = read(fd, buf, sizeof buf);
            if (n > 0) count(c, buf, (size_t)n);
            else if (n == 0) break;
            else if (errno != EINTR) {
                rc = wb_error(out, "cannot read %s: %s", name, strerror(errno));
                break;
            }
        }
        close(fd);
    }
    free(name);
    return rc;
}

static int word_count(const wb_value *args, wb_writer *out) {
    static const char *const keys[] = { "path", "text", NULL };
    wb_value path, text, bad;
    if (wb_unknown_key(args, keys, &bad)) {
        if (bad.type == WB_STR)
            return wb_error(out, "args: unexpected key \"%.*s\" (give \"path\" or \"text\")",
                            (int)bad.len, (const char *)bad.data);
        return wb_error(out, "args: keys must be strings");
    }
    bool has_path = wb_map_get(args, "path", &path), has_text = wb_map_get(args, "text", &text);
    if (has_path == has_text)
        return wb_error(out, "args: give exactly one of \"path\" and \"text\"");
    counts c = {0};
    if (has_path) {
        if (path.type != WB_STR) return wb_error(out, "args: \"path\" must be a string");
        int rc = count_file(&path, &c, out);
        if (rc) return rc;
    } else {
        if (text.type != WB_STR) return wb_error(out, "args: \"text\" must be a string");
        count(&c, text.data, text.len);
    }
    if (c.bytes && c.last != '\n') c.lines++;
    wb_write_map(out, 3);
    wb_write_cstr(out, "words"); wb_write_uint(out, c.words);
    wb_write_cstr(out, "lines"); wb_write_uint(out, c.lines);
    wb_write_cstr(out, "bytes"); wb_write_uint(out, c.bytes);
    return 0;
}

WASMBOX_TOOL(word_count)
