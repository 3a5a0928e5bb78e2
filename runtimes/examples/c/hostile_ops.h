/* hostile_ops.h: what a hostile guest tries, shared by hostile_cmd.c (a WASI command) and
 * hostile_core.c (a wasmbox ABI v1 reactor), so both kinds of module attempt the same things.
 *
 *   hostile_op(argc, argv) with argv[0] the operation:
 *     read PATH              print the file
 *     write PATH TEXT        create/truncate PATH, write TEXT
 *     append PATH TEXT       open PATH for appending, write TEXT
 *     mkdir PATH | rmdir PATH | unlink PATH | rename OLD NEW | symlink TARGET PATH
 *     link OLD NEW           a hard link
 *     readlink PATH          print the link's target
 *     stat PATH              print the size
 *     truncate PATH N        set the size to N
 *     ls DIR                 the names in DIR, one per line
 *     env | wasiargs         each environment entry / WASI argv entry, one per line
 *     fdread FD              read up to 4 KiB from descriptor FD and print it
 *     fdwrite FD TEXT        write TEXT to descriptor FD
 *     fdscan                 print every descriptor number in 0..1023 that fstat accepts
 *     prestat                print the name of each preopened directory (fd: name)
 *     openmany PATH N        open PATH N times without closing; print how many opens succeeded
 *     readloop PATH N        read PATH N times, printing each read's contents on its own line
 *     accept FD              accept() a connection on descriptor FD
 *     recv FD | send FD TEXT | shutdown FD
 *
 * Success prints what it read (or nothing) and returns 0; a failure prints
 * "error: <strerror(errno)>" to stdout and returns 1; bad usage returns 2.
 */
#ifndef HOSTILE_OPS_H
#define HOSTILE_OPS_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <wasi/api.h>

extern char **environ;

static int ho_fail(int err) {
    printf("error: %s\n", strerror(err));
    return 1;
}

static int ho_write_all(int fd, const char *p, size_t n) {
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

/* Prints the contents of the open descriptor fd (up to 64 KiB); 0, or 1 after ho_fail. */
static int ho_dump(int fd) {
    static char buf[64 * 1024];
    size_t total = 0;
    for (;;) {
        ssize_t n = read(fd, buf + total, sizeof buf - total);
        if (n == 0 || total == sizeof buf) break;
        if (n < 0) return ho_fail(errno);
        total += (size_t)n;
    }
    fwrite(buf, 1, total, stdout);
    return 0;
}

static int ho_read(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ho_fail(errno);
    int rc = ho_dump(fd);
    close(fd);
    return rc;
}

static int ho_write(const char *path, const char *text, int flags) {
    int fd = open(path, O_WRONLY | O_CREAT | flags, 0644);
    if (fd < 0) return ho_fail(errno);
    if (ho_write_all(fd, text, strlen(text)) < 0) {
        int err = errno;
        close(fd);
        return ho_fail(err);
    }
    return close(fd) < 0 ? ho_fail(errno) : 0;
}

static int ho_ls(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return ho_fail(errno);
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) puts(e->d_name);
    closedir(d);
    return 0;
}

static int ho_lines(char **lines) {
    for (; lines && *lines; lines++) puts(*lines);
    return 0;
}

static int ho_wasiargs(void) {
    size_t count, size;
    if (__wasi_args_sizes_get(&count, &size) != 0) return ho_fail(EIO);
    char **args = malloc((count + 1) * sizeof *args), *buf = malloc(size + 1);
    if (!args || !buf || __wasi_args_get((uint8_t **)args, (uint8_t *)buf) != 0) return ho_fail(EIO);
    args[count] = NULL;
    return ho_lines(args);
}

static int ho_fdscan(void) {
    struct stat st;
    for (int fd = 0; fd < 1024; fd++)
        if (fstat(fd, &st) == 0) printf("%d\n", fd);
    return 0;
}

static int ho_prestat(void) {
    for (__wasi_fd_t fd = 0; fd < 1024; fd++) {
        __wasi_prestat_t pre;
        if (__wasi_fd_prestat_get(fd, &pre) != 0) continue;
        char name[256] = {0};
        size_t len = pre.u.dir.pr_name_len < sizeof name - 1 ? pre.u.dir.pr_name_len : sizeof name - 1;
        if (__wasi_fd_prestat_dir_name(fd, (uint8_t *)name, len) == 0)
            printf("%u: %s\n", (unsigned)fd, name);
    }
    return 0;
}

static int ho_openmany(const char *path, long n) {
    long opened = 0;
    int err = 0;
    for (; opened < n; opened++) {
        if (open(path, O_RDONLY) < 0) {
            err = errno;
            break;
        }
    }
    printf("%ld\n", opened);
    return err ? ho_fail(err) : 0;
}

static int ho_readloop(const char *path, long n) {
    char buf[256];
    for (long i = 0; i < n; i++) {
        int fd = open(path, O_RDONLY);
        if (fd < 0) {
            printf("(%s)\n", strerror(errno));
            continue;
        }
        ssize_t got = read(fd, buf, sizeof buf - 1);
        close(fd);
        buf[got > 0 ? got : 0] = 0;
        printf("%s\n", buf);
    }
    return 0;
}

static long ho_number(const char *s, int *ok) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    *ok = !errno && end != s && !*end;
    return v;
}

static int hostile_op(int argc, char **argv) {
    if (argc < 1) return 2;
    const char *op = argv[0];
    int n = argc - 1, ok = 1;
    const char *a = n >= 1 ? argv[1] : "", *b = n >= 2 ? argv[2] : "";
    long num = n >= 1 ? ho_number(n >= 2 ? b : a, &ok) : 0;
#define HO_IS(name, count) (!strcmp(op, name) && n == (count))
    if (HO_IS("read", 1)) return ho_read(a);
    if (HO_IS("write", 2)) return ho_write(a, b, O_TRUNC);
    if (HO_IS("append", 2)) return ho_write(a, b, O_APPEND);
    if (HO_IS("mkdir", 1)) return mkdir(a, 0755) ? ho_fail(errno) : 0;
    if (HO_IS("rmdir", 1)) return rmdir(a) ? ho_fail(errno) : 0;
    if (HO_IS("unlink", 1)) return unlink(a) ? ho_fail(errno) : 0;
    if (HO_IS("rename", 2)) return rename(a, b) ? ho_fail(errno) : 0;
    if (HO_IS("symlink", 2)) return symlink(a, b) ? ho_fail(errno) : 0;
    if (HO_IS("link", 2)) return link(a, b) ? ho_fail(errno) : 0;
    if (HO_IS("readlink", 1)) {
        char target[1024];
        ssize_t len = readlink(a, target, sizeof target - 1);
        if (len < 0) return ho_fail(errno);
        printf("%.*s\n", (int)len, target);
        return 0;
    }
    if (HO_IS("stat", 1)) {
        struct stat st;
        if (stat(a, &st)) return ho_fail(errno);
        printf("%lld\n", (long long)st.st_size);
        return 0;
    }
    if (HO_IS("truncate", 2) && ok) return truncate(a, num) ? ho_fail(errno) : 0;
    if (HO_IS("ls", 1)) return ho_ls(a);
    if (HO_IS("env", 0)) return ho_lines(environ);
    if (HO_IS("wasiargs", 0)) return ho_wasiargs();
    if (HO_IS("fdread", 1) && ok) return ho_dump((int)num);
    if (HO_IS("fdwrite", 2)) {
        long fd = ho_number(a, &ok);
        if (!ok) return 2;
        return ho_write_all((int)fd, b, strlen(b)) ? ho_fail(errno) : 0;
    }
    if (HO_IS("fdscan", 0)) return ho_fdscan();
    if (HO_IS("prestat", 0)) return ho_prestat();
    if (HO_IS("openmany", 2) && ok) return ho_openmany(a, num);
    if (HO_IS("readloop", 2) && ok) return ho_readloop(a, num);
    if (HO_IS("accept", 1) && ok) return accept((int)num, NULL, NULL) < 0 ? ho_fail(errno) : 0;
    if (HO_IS("recv", 1) && ok) {
        char buf[64];
        return recv((int)num, buf, sizeof buf, 0) < 0 ? ho_fail(errno) : 0;
    }
    if (HO_IS("send", 2)) {
        long fd = ho_number(a, &ok);
        if (!ok) return 2;
        return send((int)fd, b, strlen(b), 0) < 0 ? ho_fail(errno) : 0;
    }
    if (HO_IS("shutdown", 1) && ok) return shutdown((int)num, SHUT_RDWR) ? ho_fail(errno) : 0;
#undef HO_IS
    return 2;
}

#endif /* HOSTILE_OPS_H */
