/*
 * powerloss.so: an LD_PRELOAD journal of every file system change a process makes under
 * one directory, so that tools/powerloss/model.py can rebuild what a power cut would leave.
 *
 * ORDERMQ_POWERLOSS_DIR      the watched directory (absolute, no symlinks in it)
 * ORDERMQ_POWERLOSS_JOURNAL  the journal file to append records to
 * ORDERMQ_POWERLOSS_SYNC_US  optional: each fsync of a watched file first sleeps this many
 *                            microseconds, as a slow disk would take (widens the windows
 *                            in which a program may act on data not yet durable)
 *
 * Without both variables every call passes straight through. With them, each change of a
 * file or directory under the watched one is appended to the journal after the real call
 * succeeded, under one mutex, so the journal's order is an order the kernel also saw:
 * open/creat (with O_CREAT / O_TRUNC), write, writev, pwrite, ftruncate, truncate,
 * rename, unlink, mkdir, rmdir and close. An fsync or fdatasync writes SYNC_BEGIN before
 * the real call and SYNC_END after it succeeded: it makes durable what the journal holds
 * before its SYNC_BEGIN, and nothing if the process died before SYNC_END. Calls the model
 * does not cover (links, mmap of a shared writable mapping, fallocate, copy_file_range,
 * sendfile, dup of a watched descriptor) write an UNSUPPORTED record, which makes the
 * model refuse to rebuild. A forked child journals nothing; LD_PRELOAD is removed from
 * the environment so that programs the process runs are not traced either.
 *
 * A record: u32 size (of the whole record), u16 type, u16 flags, i64 a, i64 b, i64 c,
 * then size - 32 bytes of payload (a path relative to the watched directory, or data).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum {
    REC_OPEN = 1,        /* a=fd b=flags c=inode; flags bit 0 created, bit 1 directory */
    REC_WRITE = 2,       /* a=fd b=file offset; payload: the bytes written */
    REC_FTRUNCATE = 3,   /* a=fd b=length */
    REC_TRUNCATE = 4,    /* b=length; payload: path */
    REC_SYNC_BEGIN = 5,  /* a=fd b=token */
    REC_SYNC_END = 6,    /* b=token */
    REC_CLOSE = 7,       /* a=fd */
    REC_RENAME = 8,      /* payload: old path NUL new path */
    REC_UNLINK = 9,      /* payload: path */
    REC_MKDIR = 10,      /* c=inode; payload: path */
    REC_RMDIR = 11,      /* payload: path */
    REC_UNSUPPORTED = 12 /* payload: what was called */
};

#define MAX_FDS 65536
#define OUTSIDE ((const char *)0)

struct header {
    uint32_t size;
    uint16_t type;
    uint16_t flags;
    int64_t a, b, c;
};

static char root[PATH_MAX];
static size_t root_len;
static int journal = -1;
static int active;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t tokens;
static useconds_t sync_delay;
static unsigned char watched[MAX_FDS];

/* The next definition of `name` (libc's), looked up once per call site. */
#define REAL(name)                                                                        \
    ({                                                                                    \
        static __typeof__(&name) fn_;                                                     \
        if (fn_ == NULL) fn_ = (__typeof__(&name))real_fn(#name);                         \
        fn_;                                                                              \
    })

static void *real_fn(const char *name) {
    void *fn = dlsym(RTLD_NEXT, name);
    if (fn == NULL) {
        fprintf(stderr, "powerloss: no %s in libc\n", name);
        abort();
    }
    return fn;
}

static void stop_in_child(void) { active = 0; }

__attribute__((constructor)) static void init(void) {
    const char *dir = getenv("ORDERMQ_POWERLOSS_DIR");
    const char *path = getenv("ORDERMQ_POWERLOSS_JOURNAL");
    unsetenv("LD_PRELOAD");
    if (dir == NULL || path == NULL || dir[0] != '/' || strlen(dir) >= sizeof root) return;
    const char *delay = getenv("ORDERMQ_POWERLOSS_SYNC_US");
    sync_delay = delay == NULL ? 0 : (useconds_t)strtoul(delay, NULL, 10);
    strcpy(root, dir);
    root_len = strlen(root);
    while (root_len > 1 && root[root_len - 1] == '/') root[--root_len] = '\0';
    int fd = REAL(open)(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        perror("powerloss: cannot open the journal");
        abort();
    }
    /* Far from the numbers the program's own files get. */
    journal = fcntl(fd, F_DUPFD_CLOEXEC, 1000);
    REAL(close)(fd);
    if (journal < 0) abort();
    pthread_atfork(NULL, NULL, stop_in_child);
    active = 1;
}

static int is_watched(int fd) {
    return active && fd >= 0 && fd < MAX_FDS && __atomic_load_n(&watched[fd], __ATOMIC_RELAXED);
}

static void set_watched(int fd, unsigned char on) {
    if (fd >= 0 && fd < MAX_FDS) __atomic_store_n(&watched[fd], on, __ATOMIC_RELAXED);
}

/* Collapse "//", "/./" and "/../" in an absolute path, in place. */
static void normalize(char *p) {
    char *out = p;
    const char *in = p;
    while (*in) {
        while (*in == '/') in++;
        const char *end = strchrnul(in, '/');
        size_t n = (size_t)(end - in);
        if (n == 0 || (n == 1 && in[0] == '.')) {
        } else if (n == 2 && in[0] == '.' && in[1] == '.') {
            while (out > p && *--out != '/') {
            }
        } else {
            *out++ = '/';
            memmove(out, in, n);
            out += n;
        }
        in = end;
    }
    if (out == p) *out++ = '/';
    *out = '\0';
}

/*
 * The path relative to the watched directory ("" for the directory itself), written into
 * `buf`; OUTSIDE when it lies elsewhere or the process is not tracing.
 */
static const char *relative(int dirfd, const char *path, char *buf) {
    if (!active || path == NULL) return OUTSIDE;
    char base[PATH_MAX];
    if (path[0] == '/') {
        base[0] = '\0';
    } else if (dirfd == AT_FDCWD) {
        if (getcwd(base, sizeof base) == NULL) return OUTSIDE;
    } else {
        char link[64];
        snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
        ssize_t n = readlink(link, base, sizeof base - 1);
        if (n < 0) return OUTSIDE;
        base[n] = '\0';
    }
    if ((size_t)snprintf(buf, PATH_MAX, "%s/%s", base, path) >= PATH_MAX) return OUTSIDE;
    normalize(buf);
    if (strncmp(buf, root, root_len) != 0) return OUTSIDE;
    if (buf[root_len] == '\0') return buf + root_len;
    if (buf[root_len] != '/') return OUTSIDE;
    return buf + root_len + 1;
}

static void put_all(const struct iovec *iov, int n) {
    struct iovec v[4];
    memcpy(v, iov, sizeof(struct iovec) * (size_t)n);
    int i = 0;
    while (i < n) {
        ssize_t done = REAL(writev)(journal, v + i, n - i);
        if (done < 0) {
            if (errno == EINTR) continue;
            perror("powerloss: journal write failed");
            abort();
        }
        while (i < n && (size_t)done >= v[i].iov_len) done -= (ssize_t)v[i++].iov_len;
        if (i < n) {
            v[i].iov_base = (char *)v[i].iov_base + done;
            v[i].iov_len -= (size_t)done;
        }
    }
}

/* Append one record; the payload is p1 followed by p2. Keeps errno. */
static void emit(uint16_t type, uint16_t flags, int64_t a, int64_t b, int64_t c,
                 const void *p1, size_t n1, const void *p2, size_t n2) {
    int saved = errno;
    struct header h = {(uint32_t)(sizeof h + n1 + n2), type, flags, a, b, c};
    struct iovec iov[3] = {{&h, sizeof h}, {(void *)p1, n1}, {(void *)p2, n2}};
    pthread_mutex_lock(&mu);
    put_all(iov, 3);
    pthread_mutex_unlock(&mu);
    errno = saved;
}

static void emit_path(uint16_t type, const char *rel) {
    emit(type, 0, 0, 0, 0, rel, strlen(rel), NULL, 0);
}

static void unsupported(const char *call, const char *what) {
    char text[PATH_MAX + 64];
    int n = snprintf(text, sizeof text, "%s %s", call, what);
    emit(REC_UNSUPPORTED, 0, 0, 0, 0, text, (size_t)n, NULL, 0);
}

/* ------------------------------------------------------------------ opening and closing */
static int traced_open(int fd_or_err, const char *rel, int flags, int existed) {
    if (fd_or_err < 0 || rel == OUTSIDE) return fd_or_err;
    struct stat st;
    int saved = errno;
    if (fstat(fd_or_err, &st) != 0) abort();
    errno = saved;
    uint16_t bits = (uint16_t)((existed ? 0 : 1) | (S_ISDIR(st.st_mode) ? 2 : 0));
    if (fd_or_err >= MAX_FDS) {
        unsupported("open", "descriptor number too large");
        return fd_or_err;
    }
    set_watched(fd_or_err, 1);
    emit(REC_OPEN, bits, fd_or_err, flags, (int64_t)st.st_ino, rel, strlen(rel), NULL, 0);
    return fd_or_err;
}

static int exists(int dirfd, const char *path) {
    struct stat st;
    int saved = errno;
    int found = fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0;
    errno = saved;
    return found;
}

static mode_t mode_arg(int flags, va_list ap) {
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, mode_t) : 0;
}

#define OPEN_AT(real_call, dirfd, path, flags)                                             \
    do {                                                                                   \
        char buf_[PATH_MAX];                                                               \
        const char *rel_ = relative(dirfd, path, buf_);                                    \
        if (rel_ != OUTSIDE && (flags & O_TMPFILE) == O_TMPFILE) {                         \
            unsupported("open", "O_TMPFILE");                                              \
        }                                                                                  \
        int existed_ = rel_ == OUTSIDE || !(flags & O_CREAT) || exists(dirfd, path);       \
        return traced_open(real_call, rel_, flags, existed_);                              \
    } while (0)

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    OPEN_AT(REAL(open)(path, flags, mode), AT_FDCWD, path, flags);
}

int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    OPEN_AT(REAL(open64)(path, flags, mode), AT_FDCWD, path, flags);
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    OPEN_AT(REAL(openat)(dirfd, path, flags, mode), dirfd, path, flags);
}

int openat64(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_arg(flags, ap);
    va_end(ap);
    OPEN_AT(REAL(openat64)(dirfd, path, flags, mode), dirfd, path, flags);
}

int creat(const char *path, mode_t mode) {
    return open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
}

int creat64(const char *path, mode_t mode) {
    return open64(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
}

static void forget(int fd) {
    if (is_watched(fd)) {
        emit(REC_CLOSE, 0, fd, 0, 0, NULL, 0, NULL, 0);
        set_watched(fd, 0);
    }
}

int close(int fd) {
    /* Recorded before the real close: once closed, another thread may open the number. */
    forget(fd);
    return REAL(close)(fd);
}

#ifdef CLOSE_RANGE_CLOEXEC /* glibc 2.34 and later */
int close_range(unsigned int first, unsigned int last, int flags) {
    if (!(flags & CLOSE_RANGE_CLOEXEC)) {
        for (unsigned int fd = first; fd <= last && fd < MAX_FDS; fd++) forget((int)fd);
    }
    return REAL(close_range)(first, last, flags);
}
#endif

int dup(int fd) {
    if (is_watched(fd)) unsupported("dup", "of a watched descriptor");
    return REAL(dup)(fd);
}

int dup2(int fd, int target) {
    if (is_watched(fd)) unsupported("dup2", "of a watched descriptor");
    if (fd != target) forget(target);
    return REAL(dup2)(fd, target);
}

int dup3(int fd, int target, int flags) {
    if (is_watched(fd)) unsupported("dup3", "of a watched descriptor");
    forget(target);
    return REAL(dup3)(fd, target, flags);
}

/* ------------------------------------------------------------------ data */
static void record_write(int fd, const void *data, ssize_t done, off_t offset) {
    if (done > 0) emit(REC_WRITE, 0, fd, offset, 0, data, (size_t)done, NULL, 0);
}

ssize_t write(int fd, const void *data, size_t n) {
    ssize_t done = REAL(write)(fd, data, n);
    if (done > 0 && is_watched(fd)) {
        int saved = errno;
        /* After the write the position is its end, with or without O_APPEND. */
        off_t end = lseek(fd, 0, SEEK_CUR);
        errno = saved;
        record_write(fd, data, done, end - done);
    }
    return done;
}

ssize_t writev(int fd, const struct iovec *iov, int count) {
    ssize_t done = REAL(writev)(fd, iov, count);
    if (done > 0 && is_watched(fd)) {
        int saved = errno;
        off_t at = lseek(fd, 0, SEEK_CUR) - done;
        errno = saved;
        ssize_t left = done;
        for (int i = 0; i < count && left > 0; i++) {
            ssize_t n = (ssize_t)iov[i].iov_len < left ? (ssize_t)iov[i].iov_len : left;
            record_write(fd, iov[i].iov_base, n, at);
            at += n;
            left -= n;
        }
    }
    return done;
}

ssize_t pwrite(int fd, const void *data, size_t n, off_t offset) {
    ssize_t done = REAL(pwrite)(fd, data, n, offset);
    if (is_watched(fd)) record_write(fd, data, done, offset);
    return done;
}

ssize_t pwrite64(int fd, const void *data, size_t n, off64_t offset) {
    ssize_t done = REAL(pwrite64)(fd, data, n, offset);
    if (is_watched(fd)) record_write(fd, data, done, offset);
    return done;
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t offset) {
    if (is_watched(fd)) unsupported("pwritev", "on a watched descriptor");
    return REAL(pwritev)(fd, iov, count, offset);
}

ssize_t pwritev2(int fd, const struct iovec *iov, int count, off_t offset, int flags) {
    if (is_watched(fd)) unsupported("pwritev2", "on a watched descriptor");
    return REAL(pwritev2)(fd, iov, count, offset, flags);
}

int ftruncate(int fd, off_t length) {
    int rc = REAL(ftruncate)(fd, length);
    if (rc == 0 && is_watched(fd)) emit(REC_FTRUNCATE, 0, fd, length, 0, NULL, 0, NULL, 0);
    return rc;
}

int ftruncate64(int fd, off64_t length) {
    int rc = REAL(ftruncate64)(fd, length);
    if (rc == 0 && is_watched(fd)) emit(REC_FTRUNCATE, 0, fd, length, 0, NULL, 0, NULL, 0);
    return rc;
}

static int traced_truncate(int rc, const char *path, off64_t length) {
    char buf[PATH_MAX];
    const char *rel = relative(AT_FDCWD, path, buf);
    if (rc == 0 && rel != OUTSIDE) emit(REC_TRUNCATE, 0, 0, length, 0, rel, strlen(rel), NULL, 0);
    return rc;
}

int truncate(const char *path, off_t length) {
    return traced_truncate(REAL(truncate)(path, length), path, length);
}

int truncate64(const char *path, off64_t length) {
    return traced_truncate(REAL(truncate64)(path, length), path, length);
}

int fallocate(int fd, int mode, off_t offset, off_t length) {
    if (is_watched(fd)) unsupported("fallocate", "on a watched descriptor");
    return REAL(fallocate)(fd, mode, offset, length);
}

int fallocate64(int fd, int mode, off64_t offset, off64_t length) {
    if (is_watched(fd)) unsupported("fallocate64", "on a watched descriptor");
    return REAL(fallocate64)(fd, mode, offset, length);
}

int posix_fallocate(int fd, off_t offset, off_t length) {
    if (is_watched(fd)) unsupported("posix_fallocate", "on a watched descriptor");
    return REAL(posix_fallocate)(fd, offset, length);
}

int posix_fallocate64(int fd, off64_t offset, off64_t length) {
    if (is_watched(fd)) unsupported("posix_fallocate64", "on a watched descriptor");
    return REAL(posix_fallocate64)(fd, offset, length);
}

ssize_t copy_file_range(int in, off64_t *in_off, int out, off64_t *out_off, size_t n,
                        unsigned int flags) {
    if (is_watched(out)) unsupported("copy_file_range", "into a watched descriptor");
    return REAL(copy_file_range)(in, in_off, out, out_off, n, flags);
}

ssize_t sendfile(int out, int in, off_t *offset, size_t n) {
    if (is_watched(out)) unsupported("sendfile", "into a watched descriptor");
    return REAL(sendfile)(out, in, offset, n);
}

ssize_t sendfile64(int out, int in, off64_t *offset, size_t n) {
    if (is_watched(out)) unsupported("sendfile64", "into a watched descriptor");
    return REAL(sendfile64)(out, in, offset, n);
}

static void check_mapping(int prot, int flags, int fd) {
    if ((prot & PROT_WRITE) && (flags & MAP_SHARED) && is_watched(fd)) {
        unsupported("mmap", "shared writable mapping of a watched file");
    }
}

void *mmap(void *addr, size_t n, int prot, int flags, int fd, off_t offset) {
    check_mapping(prot, flags, fd);
    return REAL(mmap)(addr, n, prot, flags, fd, offset);
}

void *mmap64(void *addr, size_t n, int prot, int flags, int fd, off64_t offset) {
    check_mapping(prot, flags, fd);
    return REAL(mmap64)(addr, n, prot, flags, fd, offset);
}

/* ------------------------------------------------------------------ durability */
static int traced_sync(int fd, int (*real)(int)) {
    if (!is_watched(fd)) return real(fd);
    int64_t token = __atomic_add_fetch(&tokens, 1, __ATOMIC_RELAXED);
    emit(REC_SYNC_BEGIN, 0, fd, token, 0, NULL, 0, NULL, 0);
    if (sync_delay) usleep(sync_delay);
    int rc = real(fd);
    if (rc == 0) emit(REC_SYNC_END, 0, fd, token, 0, NULL, 0, NULL, 0);
    return rc;
}

int fsync(int fd) { return traced_sync(fd, REAL(fsync)); }

int fdatasync(int fd) { return traced_sync(fd, REAL(fdatasync)); }

/* ------------------------------------------------------------------ names */
static int traced_rename(int rc, int olddir, const char *old, int newdir, const char *new) {
    char a[PATH_MAX], b[PATH_MAX];
    const char *from = relative(olddir, old, a);
    const char *to = relative(newdir, new, b);
    if (rc != 0 || (from == OUTSIDE && to == OUTSIDE)) return rc;
    if (from == OUTSIDE || to == OUTSIDE) {
        unsupported("rename", "across the watched directory's boundary");
        return rc;
    }
    emit(REC_RENAME, 0, 0, 0, 0, from, strlen(from) + 1, to, strlen(to));
    return rc;
}

int rename(const char *old, const char *new) {
    return traced_rename(REAL(rename)(old, new), AT_FDCWD, old, AT_FDCWD, new);
}

int renameat(int olddir, const char *old, int newdir, const char *new) {
    return traced_rename(REAL(renameat)(olddir, old, newdir, new), olddir, old, newdir, new);
}

int renameat2(int olddir, const char *old, int newdir, const char *new, unsigned int flags) {
    int rc = REAL(renameat2)(olddir, old, newdir, new, flags);
    if (flags & RENAME_EXCHANGE) {
        char a[PATH_MAX];
        if (relative(olddir, old, a) != OUTSIDE) unsupported("renameat2", "RENAME_EXCHANGE");
        return rc;
    }
    return traced_rename(rc, olddir, old, newdir, new);
}

static int traced_path(int rc, uint16_t type, int dirfd, const char *path) {
    char buf[PATH_MAX];
    const char *rel = relative(dirfd, path, buf);
    if (rc == 0 && rel != OUTSIDE) emit_path(type, rel);
    return rc;
}

static int traced_mkdir(int rc, int dirfd, const char *path) {
    char buf[PATH_MAX];
    const char *rel = relative(dirfd, path, buf);
    struct stat st;
    if (rc == 0 && rel != OUTSIDE) {
        int saved = errno;
        if (fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) != 0) abort();
        errno = saved;
        emit(REC_MKDIR, 0, 0, 0, (int64_t)st.st_ino, rel, strlen(rel), NULL, 0);
    }
    return rc;
}

int unlink(const char *path) {
    return traced_path(REAL(unlink)(path), REC_UNLINK, AT_FDCWD, path);
}

int unlinkat(int dirfd, const char *path, int flags) {
    uint16_t type = (flags & AT_REMOVEDIR) ? REC_RMDIR : REC_UNLINK;
    return traced_path(REAL(unlinkat)(dirfd, path, flags), type, dirfd, path);
}

int rmdir(const char *path) { return traced_path(REAL(rmdir)(path), REC_RMDIR, AT_FDCWD, path); }

int mkdir(const char *path, mode_t mode) {
    return traced_mkdir(REAL(mkdir)(path, mode), AT_FDCWD, path);
}

int mkdirat(int dirfd, const char *path, mode_t mode) {
    return traced_mkdir(REAL(mkdirat)(dirfd, path, mode), dirfd, path);
}

static void no_links(const char *call, int dirfd, const char *path) {
    char buf[PATH_MAX];
    if (relative(dirfd, path, buf) != OUTSIDE) unsupported(call, path);
}

int link(const char *old, const char *new) {
    no_links("link", AT_FDCWD, new);
    return REAL(link)(old, new);
}

int linkat(int olddir, const char *old, int newdir, const char *new, int flags) {
    no_links("linkat", newdir, new);
    return REAL(linkat)(olddir, old, newdir, new, flags);
}

int symlink(const char *target, const char *path) {
    no_links("symlink", AT_FDCWD, path);
    return REAL(symlink)(target, path);
}

int symlinkat(const char *target, int dirfd, const char *path) {
    no_links("symlinkat", dirfd, path);
    return REAL(symlinkat)(target, dirfd, path);
}
