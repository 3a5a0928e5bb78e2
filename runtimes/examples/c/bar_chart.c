// wasmbox: command
/* bar_chart: renders a bar chart of numbers as SVG (text) or PNG (binary) (a WASI command).
 *
 *   bar_chart [--format=svg|png] [--title=TEXT] [--label=TEXT]... [--width=N] [--height=N]
 *             [--output=PATH] [--] VALUE...
 *
 * Each VALUE is a number; a bar goes up from the zero line, or down for a negative value. The
 * i-th --label names the i-th bar. The SVG has the title and the labels; the PNG (8-bit
 * palette, zlib-compressed with fixed Huffman codes) has the bars and the zero line only.
 * The chart goes to stdout, or with --output to that file (then stdout gets one line saying
 * what was written). A bad argument is an error on stderr and exit code 2.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_BARS 256
#define MAX_SIDE 2048

static int fail(const char *message, const char *detail) {
    fprintf(stderr, "bar_chart: %s%s%s\n", message, detail ? ": " : "", detail ? detail : "");
    return 2;
}

/* ---- layout (shared by both formats) ---------------------------------------------------- */

typedef struct {
    int width, height, n;
    double values[MAX_BARS];
    const char *labels[MAX_BARS];
    int n_labels;
    const char *title;
    double lo, hi;          /* value range shown, always including 0 */
    double top, bottom;     /* plot area, in pixels from the top */
    double left, right;
} chart;

static void layout(chart *c) {
    c->lo = 0, c->hi = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->values[i] < c->lo) c->lo = c->values[i];
        if (c->values[i] > c->hi) c->hi = c->values[i];
    }
    if (c->hi == c->lo) c->hi = c->lo + 1;
    c->top = c->title ? 32 : 12;
    c->bottom = c->height - (c->n_labels ? 28 : 12);
    c->left = 12;
    c->right = c->width - 12;
    if (c->bottom < c->top + 1) c->bottom = c->top + 1;
}

static double y_of(const chart *c, double v) {
    return c->top + (c->hi - v) / (c->hi - c->lo) * (c->bottom - c->top);
}

/* bar i spans [x0, x1) and [y0, y1) */
static void bar(const chart *c, int i, double *x0, double *x1, double *y0, double *y1) {
    double slot = (c->right - c->left) / c->n;
    *x0 = c->left + i * slot + slot * 0.1;
    *x1 = *x0 + slot * 0.8;
    double a = y_of(c, c->values[i]), b = y_of(c, 0);
    *y0 = a < b ? a : b;
    *y1 = a < b ? b : a;
}

/* ---- SVG -------------------------------------------------------------------------------- */

static void xml_text(FILE *out, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        default: fputc(*s, out);
        }
    }
}

static void write_svg(FILE *out, const chart *c) {
    fprintf(out, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n",
           c->width, c->height, c->width, c->height);
    fprintf(out, "<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n");
    if (c->title) {
        fprintf(out, "<text x=\"%d\" y=\"22\" text-anchor=\"middle\" font-family=\"sans-serif\" "
               "font-size=\"16\">", c->width / 2);
        xml_text(out, c->title);
        fprintf(out, "</text>\n");
    }
    for (int i = 0; i < c->n; i++) {
        double x0, x1, y0, y1;
        bar(c, i, &x0, &x1, &y0, &y1);
        fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>",
               x0, y0, x1 - x0, y1 - y0, c->values[i] < 0 ? "#e15759" : "#4e79a7");
        if (i < c->n_labels) {
            xml_text(out, c->labels[i]);
            fprintf(out, ": ");
        }
        fprintf(out, "%g</title></rect>\n", c->values[i]);
        if (i < c->n_labels) {
            fprintf(out, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" font-family=\"sans-serif\" "
                   "font-size=\"12\">", (x0 + x1) / 2, c->height - 10);
            xml_text(out, c->labels[i]);
            fprintf(out, "</text>\n");
        }
    }
    double zero = y_of(c, 0);
    fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#555555\"/>\n",
           c->left, zero, c->right, zero);
    fprintf(out, "</svg>\n");
}

/* ---- PNG: palette pixels, zlib with fixed-Huffman deflate -------------------------------- */

typedef struct {
    uint8_t *data;
    size_t len, cap;
    uint32_t bits;  /* pending bits, LSB first */
    int nbits;
} buffer;

static int reserve(buffer *b, size_t more) {
    if (b->len + more <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more) cap *= 2;
    uint8_t *data = realloc(b->data, cap);
    if (!data) return -1;
    b->data = data, b->cap = cap;
    return 0;
}

static int put_byte(buffer *b, uint8_t byte) {
    if (reserve(b, 1)) return -1;
    b->data[b->len++] = byte;
    return 0;
}

static int put_be32(buffer *b, uint32_t v) {
    for (int s = 24; s >= 0; s -= 8)
        if (put_byte(b, (uint8_t)(v >> s))) return -1;
    return 0;
}

static int put_bits(buffer *b, uint32_t value, int n) { /* deflate's order: LSB first */
    b->bits |= value << b->nbits;
    b->nbits += n;
    while (b->nbits >= 8) {
        if (put_byte(b, (uint8_t)b->bits)) return -1;
        b->bits >>= 8;
        b->nbits -= 8;
    }
    return 0;
}

static int put_code(buffer *b, uint32_t code, int n) { /* Huffman codes go MSB first */
    uint32_t reversed = 0;
    for (int i = 0; i < n; i++) reversed |= ((code >> i) & 1u) << (n - 1 - i);
    return put_bits(b, reversed, n);
}

static int put_symbol(buffer *b, int sym) { /* the fixed literal/length code (RFC 1951 3.2.6) */
    if (sym < 144) return put_code(b, 0x30 + sym, 8);
    if (sym < 256) return put_code(b, 0x190 + sym - 144, 9);
    if (sym < 280) return put_code(b, sym - 256, 7);
    return put_code(b, 0xC0 + sym - 280, 8);
}

static const uint16_t len_base[29] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31,
                                      35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t len_extra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2,
                                      3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t dist_base[30] = {1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193,
                                       257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145,
                                       8193, 12289, 16385, 24577};
static const uint8_t dist_extra[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6,
                                       7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

static int put_match(buffer *b, int length, int distance) {
    int l = 28, d = 29;
    while (len_base[l] > length) l--;
    while (dist_base[d] > distance) d--;
    if (put_symbol(b, 257 + l) || put_bits(b, (uint32_t)(length - len_base[l]), len_extra[l])) return -1;
    return put_code(b, (uint32_t)d, 5) || put_bits(b, (uint32_t)(distance - dist_base[d]), dist_extra[d]);
}

static size_t match_length(const uint8_t *raw, size_t pos, size_t n, size_t distance) {
    if (distance > pos) return 0;
    size_t limit = n - pos < 258 ? n - pos : 258, k = 0;
    while (k < limit && raw[pos + k] == raw[pos + k - distance]) k++;
    return k;
}

/* A zlib stream of `raw`: one fixed-Huffman block whose matches are runs (distance 1) and
 * repeats of the row above (distance `stride`), which is what a chart is made of. */
static int deflate_fixed(buffer *b, const uint8_t *raw, size_t n, size_t stride) {
    if (put_byte(b, 0x78) || put_byte(b, 0x01)) return -1;
    if (put_bits(b, 1, 1) || put_bits(b, 1, 2)) return -1; /* BFINAL, BTYPE = fixed */
    for (size_t pos = 0; pos < n;) {
        size_t run = match_length(raw, pos, n, 1), up = match_length(raw, pos, n, stride);
        size_t best = run >= up ? run : up, distance = run >= up ? 1 : stride;
        if (best >= 3) {
            if (put_match(b, (int)best, (int)distance)) return -1;
            pos += best;
        } else {
            if (put_symbol(b, raw[pos])) return -1;
            pos++;
        }
    }
    if (put_symbol(b, 256) || put_bits(b, 0, 7)) return -1; /* end of block, then flush */
    uint32_t s1 = 1, s2 = 0; /* Adler-32, reduced every 5552 bytes (the most before s2 overflows) */
    for (size_t start = 0; start < n; start += 5552) {
        size_t stop = n - start < 5552 ? n : start + 5552;
        for (size_t i = start; i < stop; i++) {
            s1 += raw[i];
            s2 += s1;
        }
        s1 %= 65521;
        s2 %= 65521;
    }
    b->nbits = 0, b->bits = 0;
    return put_be32(b, (s2 << 16) | s1);
}

static uint32_t crc_table[256];

static uint32_t crc32(uint32_t crc, const uint8_t *p, size_t n) {
    if (!crc_table[1]) {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            crc_table[i] = c;
        }
    }
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = crc_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

static int put_chunk(buffer *png, const char type[4], const uint8_t *data, size_t n) {
    if (put_be32(png, (uint32_t)n) || reserve(png, 4 + n)) return -1;
    size_t start = png->len;
    memcpy(png->data + png->len, type, 4);
    if (n) memcpy(png->data + png->len + 4, data, n);
    png->len += 4 + n;
    return put_be32(png, crc32(0, png->data + start, 4 + n));
}

enum { WHITE, BLUE, RED, GRAY };
static const uint8_t palette[] = {0xff, 0xff, 0xff, 0x4e, 0x79, 0xa7, 0xe1, 0x57, 0x59, 0x55, 0x55, 0x55};

static int render_png(const chart *c, buffer *png) {
    size_t stride = (size_t)c->width + 1, n = stride * (size_t)c->height;
    uint8_t *raw = calloc(n, 1); /* each row: filter byte 0 (none), then palette indices */
    if (!raw) return -1;
    for (int i = 0; i < c->n; i++) {
        double x0, x1, y0, y1;
        bar(c, i, &x0, &x1, &y0, &y1);
        uint8_t color = c->values[i] < 0 ? RED : BLUE;
        for (int y = (int)(y0 + 0.5); y < (int)(y1 + 0.5) && y < c->height; y++)
            for (int x = (int)(x0 + 0.5); x < (int)(x1 + 0.5) && x < c->width; x++)
                raw[(size_t)y * stride + 1 + (size_t)x] = color;
    }
    int zero = (int)(y_of(c, 0) + 0.5);
    if (zero >= c->height) zero = c->height - 1;
    for (int x = (int)c->left; x < (int)c->right; x++) raw[(size_t)zero * stride + 1 + (size_t)x] = GRAY;

    buffer z = {0};
    uint8_t header[13] = {0};
    for (int k = 0; k < 4; k++) {
        header[k] = (uint8_t)((uint32_t)c->width >> (24 - 8 * k));
        header[4 + k] = (uint8_t)((uint32_t)c->height >> (24 - 8 * k));
    }
    header[8] = 8, header[9] = 3; /* 8-bit palette indices */
    static const uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    int rc = deflate_fixed(&z, raw, n, stride);
    free(raw);
    if (!rc) rc = reserve(png, 8);
    if (!rc) {
        memcpy(png->data, signature, 8);
        png->len = 8;
        rc = put_chunk(png, "IHDR", header, 13) || put_chunk(png, "PLTE", palette, sizeof palette) ||
             put_chunk(png, "IDAT", z.data, z.len) || put_chunk(png, "IEND", NULL, 0);
    }
    free(z.data);
    return rc;
}

/* ---- arguments -------------------------------------------------------------------------- */

static int number(const char *text, double *out) {
    char *end;
    errno = 0;
    *out = strtod(text, &end);
    return *text && !*end && errno == 0 && *out == *out && *out - *out == 0; /* finite */
}

static const char *option(const char *arg, const char *name) {
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && arg[n] == '=' ? arg + n + 1 : NULL;
}

static int side(const char *text, int *out) {
    double v;
    if (!number(text, &v) || v < 16 || v > MAX_SIDE || v != (int)v) return 0;
    *out = (int)v;
    return 1;
}

int main(int argc, char **argv) {
    static chart c;
    c.width = 640, c.height = 400;
    const char *format = "svg", *output = NULL, *v;
    int only_values = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!only_values && strcmp(arg, "--") == 0) {
            only_values = 1;
        } else if (!only_values && strncmp(arg, "--", 2) == 0) {
            if ((v = option(arg, "--format"))) format = v;
            else if ((v = option(arg, "--title"))) c.title = *v ? v : NULL;
            else if ((v = option(arg, "--output"))) output = v;
            else if ((v = option(arg, "--label"))) {
                if (c.n_labels == MAX_BARS) return fail("too many labels", NULL);
                c.labels[c.n_labels++] = v;
            } else if ((v = option(arg, "--width"))) {
                if (!side(v, &c.width)) return fail("--width must be an integer from 16 to 2048", v);
            } else if ((v = option(arg, "--height"))) {
                if (!side(v, &c.height)) return fail("--height must be an integer from 16 to 2048", v);
            } else {
                return fail("unknown option", arg);
            }
        } else {
            if (c.n == MAX_BARS) return fail("too many values (at most 256)", NULL);
            if (!number(arg, &c.values[c.n])) return fail("not a finite number", arg);
            c.n++;
        }
    }
    if (c.n == 0) return fail("no values to chart", NULL);
    if (c.n_labels > c.n) return fail("more labels than values", NULL);
    int png = strcmp(format, "png") == 0;
    if (!png && strcmp(format, "svg") != 0) return fail("--format must be svg or png", format);
    layout(&c);

    FILE *file = stdout;
    if (output && !(file = fopen(output, "wb"))) return fail(strerror(errno), output);
    if (png) {
        buffer b = {0};
        if (render_png(&c, &b)) return fail("out of memory", NULL);
        fwrite(b.data, 1, b.len, file);
        free(b.data);
    } else {
        write_svg(file, &c);
    }
    if (file != stdout) {
        if (fclose(file)) return fail(strerror(errno), output);
        printf("wrote %s (%s, %dx%d, %d bars)\n", output, format, c.width, c.height, c.n);
    } else if (fflush(stdout)) {
        return fail(strerror(errno), "stdout");
    }
    return 0;
}
