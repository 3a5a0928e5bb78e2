// wasmbox: command
/* fsprobe: a WASI command for probing what a sandbox lets a guest see and do.
 *
 *   fsprobe read PATH        print the file to stdout
 *   fsprobe open PATH...     open each PATH for reading, in turn: "PATH: ok" or "PATH: <strerror>"
 *   fsprobe write PATH TEXT  create/truncate PATH and write TEXT to it
 *   fsprobe fill PATH N [C]  create/truncate PATH and write N bytes to it, C bytes per write
 *                            (default 64 KiB; C = N makes it one write)
 *   fsprobe ls DIR           the names in DIR, sorted, one per line ("." and ".." left out)
 *   fsprobe env              each environment entry, one per line
 *   fsprobe argv [ARG...]    each argv entry (argv[0] and these ARGs too), one per line
 *   fsprobe cat              copy stdin to stdout
 *   fsprobe exit N           exit with code N (0..255; Wasmtime refuses 126 and up)
 *
 * Success exits 0. A failure prints "error: <strerror(errno)>" to stderr and exits 1.
 * An unknown subcommand or wrong arguments print the usage to stderr and exit 2.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

static int fail(int err) {
    fprintf(stderr, "error: %s\n", strerror(err));
    return 1;
}

static int usage(void) {
    fputs("usage: fsprobe read PATH | open PATH... | write PATH TEXT | fill PATH N [CHUNK] | ls DIR | env | argv [ARG...] | cat"
          " | exit N\n", stderr);
    return 2;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int copy(int from, int to) {
    static char buf[64 * 1024];
    for (;;) {
        ssize_t n = read(from, buf, sizeof buf);
        if (n == 0) return 0;
        if (n < 0) {
            if (errno == EINTR) continue;
            return fail(errno);
        }
        if (write_all(to, buf, (size_t)n) < 0) return fail(errno);
    }
}

static int cmd_read(const char *path) {
    struct stat st;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return fail(errno);
    if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
        close(fd);
        return fail(EISDIR);
    }
    int rc = copy(fd, STDOUT_FILENO);
    close(fd);
    return rc;
}

static int cmd_open(int count, char **paths) {
    for (int k = 0; k < count; k++) {
        int fd = open(paths[k], O_RDONLY);
        printf("%s: %s\n", paths[k], fd < 0 ? strerror(errno) : "ok");
        if (fd >= 0) close(fd);
    }
    return 0;
}

static int cmd_write(const char *path, const char *text) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return fail(errno);
    if (write_all(fd, text, strlen(text)) < 0) {
        int err = errno;
        close(fd);
        return fail(err);
    }
    if (close(fd) < 0) return fail(errno);
    return 0;
}

static int parse_size(const char *text, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long n = strtoull(text, &end, 10);
    if (errno || end == text || *end || n == 0 || n > (1ull << 31)) return -1;
    *out = (size_t)n;
    return 0;
}

static int cmd_fill(const char *path, const char *total_text, const char *chunk_text) {
    size_t total, chunk = 64 * 1024;
    if (parse_size(total_text, &total) < 0) return usage();
    if (chunk_text && parse_size(chunk_text, &chunk) < 0) return usage();
    if (chunk > total) chunk = total;
    char *buf = malloc(chunk);
    if (!buf) return fail(ENOMEM);
    memset(buf, 'x', chunk);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return fail(errno);
    for (size_t done = 0; done < total;) {
        size_t n = total - done < chunk ? total - done : chunk;
        if (write_all(fd, buf, n) < 0) {
            int err = errno;
            close(fd);
            return fail(err);
        }
        done += n;
    }
    if (close(fd) < 0) return fail(errno);
    return 0;
}

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmd_ls(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return fail(errno);
    char **names = NULL;
    size_t count = 0, cap = 0;
    struct dirent *e;
    for (errno = 0; (e = readdir(d)) != NULL; errno = 0) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 64;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown) return fail(ENOMEM);
            names = grown;
        }
        if (!(names[count++] = strdup(e->d_name))) return fail(ENOMEM);
    }
    if (errno) return fail(errno);
    closedir(d);
    qsort(names, count, sizeof *names, by_name);
    for (size_t k = 0; k < count; k++) puts(names[k]);
    return 0;
}

static int print_lines(char **lines) {
    for (; lines && *lines; lines++) puts(*lines);
    return 0;
}

static int dispatch(int argc, char **argv) {
    if (argc < 2) return usage();
    const char *cmd = argv[1];
    int nargs = argc - 2;
    if (!strcmp(cmd, "read") && nargs == 1) return cmd_read(argv[2]);
    if (!strcmp(cmd, "open")) return cmd_open(nargs, argv + 2);
    if (!strcmp(cmd, "write") && nargs == 2) return cmd_write(argv[2], argv[3]);
    if (!strcmp(cmd, "fill") && (nargs == 2 || nargs == 3))
        return cmd_fill(argv[2], argv[3], nargs == 3 ? argv[4] : NULL);
    if (!strcmp(cmd, "ls") && nargs == 1) return cmd_ls(argv[2]);
    if (!strcmp(cmd, "env") && nargs == 0) return print_lines(environ);
    if (!strcmp(cmd, "argv")) return print_lines(argv);
    if (!strcmp(cmd, "cat") && nargs == 0) return copy(STDIN_FILENO, STDOUT_FILENO);
    if (!strcmp(cmd, "exit") && nargs == 1) {
        char *end;
        errno = 0;
        long code = strtol(argv[2], &end, 10);
        if (errno || end == argv[2] || *end || code < 0 || code > 255) return usage();
        exit((int)code);
    }
    return usage();
}

int main(int argc, char **argv) {
    int rc = dispatch(argc, argv);
    if (fflush(stdout) != 0 || ferror(stdout)) {
        if (rc == 0) rc = fail(errno ? errno : EIO);
    }
    return rc;
}
