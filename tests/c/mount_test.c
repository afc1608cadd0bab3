/*
 * mount_test.c: a program that keeps its files in DIR sees POSIX semantics,
 * whether DIR is a directory of the kernel's file system or an iopath mount
 * (LD_PRELOAD=libiopath_preload.so IOPATH_MOUNT=DIR=IMAGE). Run by
 * preload/tests/mount.rs both ways; every check is an absolute expectation,
 * except the few where an iopath mount differs by design (a forked child
 * cannot use the parent's descriptors), which take MODE.
 *
 * Usage: mount_test DIR kernel|iopath. Prints "N passed, M failed".
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <glob.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <sys/vfs.h>
#include <sys/uio.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <utime.h>
#include <unistd.h>

#define CHECK_CONTEXT() fprintf(stderr, " (errno %d %s)", errno, strerror(errno))
#include "check.h"

static char dir[2048];
static int iopath_mode;

static const char *at(const char *name) {
    static char paths[8][4200];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 4200, "%s/%s", dir, name);
    return p;
}

#define ERRNO_IS(call, e) CHECK((call) < 0 && errno == (e), "%s: want errno %d", #call, (e))

static void files(void) {
    int fd = open(at("f"), O_CREAT | O_EXCL | O_RDWR, 0666);
    CHECK(fd >= 0, "create");
    ERRNO_IS(open(at("f"), O_CREAT | O_EXCL | O_RDWR, 0666), EEXIST);
    ERRNO_IS(open(at("missing"), O_RDONLY), ENOENT);
    ERRNO_IS(open(at("nodir/x"), O_CREAT | O_RDWR, 0666), ENOENT);
    ERRNO_IS(open(at("f/"), O_RDONLY), ENOTDIR);
    ERRNO_IS(open(at("f"), O_RDONLY | O_DIRECTORY), ENOTDIR);
    CHECK(write(fd, "hello", 5) == 5, "write");
    CHECK(pwrite(fd, "world", 5, 10) == 5, "pwrite past the end");
    struct stat st;
    CHECK(fstat(fd, &st) == 0 && st.st_size == 15 && S_ISREG(st.st_mode) && (st.st_mode & 07777) == 0644,
          "fstat size %lld mode %o", (long long)st.st_size, st.st_mode);
    CHECK(st.st_nlink == 1, "nlink %lu", (unsigned long)st.st_nlink);
    char buf[64] = {0};
    CHECK(pread(fd, buf, sizeof buf, 0) == 15 && !memcmp(buf, "hello\0\0\0\0\0world", 15), "pread with a gap of zeros");
    CHECK(lseek(fd, 0, SEEK_CUR) == 5, "position after write");
    CHECK(lseek(fd, -5, SEEK_END) == 10 && read(fd, buf, 64) == 5 && !memcmp(buf, "world", 5), "SEEK_END and read");
    CHECK(read(fd, buf, 64) == 0, "read at the end");
    ERRNO_IS(lseek(fd, -100, SEEK_CUR), EINVAL);
    CHECK(lseek(fd, 3, SEEK_DATA) == 3, "SEEK_DATA inside");
    ERRNO_IS(lseek(fd, 15, SEEK_DATA), ENXIO);
    CHECK(lseek(fd, 0, SEEK_HOLE) >= 5 && lseek(fd, 0, SEEK_HOLE) <= 15, "SEEK_HOLE");
    /* A sparse file: a block of data, a hole of a MiB less a block, a block of data. */
    {
        int sp = open(at("sparse"), O_CREAT | O_RDWR, 0644);
        char block[4096];
        memset(block, 's', sizeof block);
        CHECK(pwrite(sp, block, 4096, 0) == 4096 && pwrite(sp, block, 4096, 1 << 20) == 4096 && fsync(sp) == 0,
              "sparse file");
        CHECK(lseek(sp, 0, SEEK_HOLE) == 4096, "SEEK_HOLE finds the hole (%lld)", (long long)lseek(sp, 0, SEEK_HOLE));
        CHECK(lseek(sp, 8192, SEEK_HOLE) == 8192, "SEEK_HOLE inside a hole");
        CHECK(lseek(sp, 4096, SEEK_DATA) == 1 << 20, "SEEK_DATA skips it (%lld)", (long long)lseek(sp, 4096, SEEK_DATA));
        CHECK(lseek(sp, 1 << 20, SEEK_HOLE) == (1 << 20) + 4096, "the end is a hole");
        ERRNO_IS(lseek(sp, (1 << 20) + 4096, SEEK_DATA), ENXIO);
        CHECK(close(sp) == 0 && unlink(at("sparse")) == 0, "sparse file removed");
    }
    ERRNO_IS(pread(fd, buf, 1, -1), EINVAL);

    /* Duplicates share one position; F_GETFL shows the access mode. */
    int d = dup(fd);
    CHECK(d >= 0 && d != fd, "dup");
    CHECK(lseek(fd, 2, SEEK_SET) == 2 && lseek(d, 0, SEEK_CUR) == 2, "dup shares the position");
    int d2 = fcntl(fd, F_DUPFD_CLOEXEC, 100);
    CHECK(d2 >= 100, "F_DUPFD_CLOEXEC %d", d2);
    CHECK((fcntl(d2, F_GETFD) & FD_CLOEXEC) && !(fcntl(fd, F_GETFD) & FD_CLOEXEC), "close-on-exec is per number");
    CHECK((fcntl(d2, F_GETFL) & O_ACCMODE) == O_RDWR, "F_GETFL");
    int other = open(at("other"), O_CREAT | O_RDWR, 0600);
    CHECK(other >= 0 && dup2(d, other) == other, "dup2 over another file");
    CHECK(read(other, buf, 3) == 3 && !memcmp(buf, "llo", 3) && lseek(fd, 0, SEEK_CUR) == 5, "dup2 shares too");
    CHECK(close(d) == 0 && close(d2) == 0 && close(other) == 0, "close duplicates");
    CHECK(pread(fd, buf, 5, 0) == 5, "the original still works");
    ERRNO_IS(read(d, buf, 1), EBADF);

    /* O_APPEND writes at the end wherever the position is; F_SETFL turns it on. */
    CHECK(fcntl(fd, F_SETFL, O_APPEND) == 0 && (fcntl(fd, F_GETFL) & O_APPEND), "F_SETFL O_APPEND");
    lseek(fd, 0, SEEK_SET);
    CHECK(write(fd, "!", 1) == 1 && lseek(fd, 0, SEEK_CUR) == 16, "append moves to the end");
    /* pwrite on O_APPEND appends too (Linux), and leaves the position where it was. */
    lseek(fd, 3, SEEK_SET);
    CHECK(pwrite(fd, "?", 1, 0) == 1 && lseek(fd, 0, SEEK_CUR) == 3, "pwrite leaves the position");
    CHECK(pread(fd, buf, 2, 15) == 2 && !memcmp(buf, "!?", 2), "pwrite with O_APPEND appends");
    CHECK(fsync(fd) == 0 && fdatasync(fd) == 0 && syncfs(fd) == 0, "fsync, fdatasync, syncfs");
    CHECK(close(fd) == 0, "close");

    /* Vectors. */
    fd = open(at("f"), O_RDWR);
    struct iovec v[2] = {{"ab", 2}, {"cde", 3}};
    CHECK(pwritev(fd, v, 2, 1) == 5, "pwritev");
    char x[3], y[4];
    struct iovec r[2] = {{x, 3}, {y, 4}};
    CHECK(preadv(fd, r, 2, 0) == 7 && !memcmp(x, "hab", 3) && !memcmp(y, "cde\0", 4), "preadv");
    CHECK(lseek(fd, 0, SEEK_SET) == 0 && readv(fd, r, 2) == 7 && lseek(fd, 0, SEEK_CUR) == 7, "readv moves");
    CHECK(writev(fd, v, 2) == 5 && lseek(fd, 0, SEEK_CUR) == 12, "writev moves");

    /* Sizes: ftruncate, truncate, fallocate. */
    CHECK(ftruncate(fd, 3) == 0 && ftruncate(fd, 8192) == 0, "ftruncate");
    CHECK(pread(fd, buf, 8, 3) == 8 && !memcmp(buf, "\0\0\0\0\0\0\0\0", 8), "grown bytes read zero");
    CHECK(truncate(at("f"), 100) == 0 && fstat(fd, &st) == 0 && st.st_size == 100, "truncate by path");
    CHECK(fallocate(fd, 0, 0, 5000) == 0 && fstat(fd, &st) == 0 && st.st_size == 5000, "fallocate grows");
    CHECK(st.st_blocks >= 5000 / 512, "fallocate allocates (%ld blocks)", (long)st.st_blocks);
    CHECK(pread(fd, buf, 8, 4000) == 8 && !memcmp(buf, "\0\0\0\0\0\0\0\0", 8), "allocated bytes read zero");
    CHECK(fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 90000) == 0 && fstat(fd, &st) == 0 && st.st_size == 5000,
          "KEEP_SIZE keeps it");
    CHECK(st.st_blocks >= 90000 / 512, "KEEP_SIZE allocates past the end (%ld blocks)", (long)st.st_blocks);
    CHECK(pread(fd, buf, 8, 4996) == 4, "reads stop at the end, not at the allocation's");
    ERRNO_IS(fallocate(fd, 0, 0, 0), EINVAL);
    ERRNO_IS(fallocate(fd, 0, -1, 10), EINVAL);
    CHECK(posix_fallocate(fd, 0, 6000) == 0 && fstat(fd, &st) == 0 && st.st_size == 6000, "posix_fallocate");
    /* Holes: PUNCH_HOLE (with KEEP_SIZE) zeroes a range and keeps the size;
     * ZERO_RANGE zeroes, and grows the file without KEEP_SIZE. (A file
     * system that has no ZERO_RANGE, tmpfs, says EOPNOTSUPP: then skipped.) */
    {
        char fill[6000];
        memset(fill, 'z', sizeof fill);
        CHECK(pwrite(fd, fill, sizeof fill, 0) == 6000, "fill for holes");
        CHECK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 100, 5000) == 0 && fstat(fd, &st) == 0 &&
                  st.st_size == 6000,
              "punch hole keeps the size");
        CHECK(pread(fd, buf, 2, 99) == 2 && buf[0] == 'z' && buf[1] == 0, "punched bytes read zero from its start");
        CHECK(pread(fd, buf, 2, 5099) == 2 && buf[0] == 0 && buf[1] == 'z', "to its end");
        CHECK(pread(fd, buf, 2, 4095) == 2 && buf[0] == 0 && buf[1] == 0, "and across a block boundary");
        CHECK(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 5990, 100) == 0 && fstat(fd, &st) == 0 &&
                  st.st_size == 6000,
              "a hole past the end keeps the size");
        ERRNO_IS(fallocate(fd, FALLOC_FL_PUNCH_HOLE, 0, 10), EOPNOTSUPP);
        ERRNO_IS(fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 0), EINVAL);
        int zr = fallocate(fd, FALLOC_FL_ZERO_RANGE, 10, 6000);
        CHECK(zr == 0 || (!iopath_mode && errno == EOPNOTSUPP), "zero range");
        if (zr == 0) {
            CHECK(fstat(fd, &st) == 0 && st.st_size == 6010, "zero range grows the file");
            CHECK(st.st_blocks >= 6010 / 512, "zero range keeps the range allocated (%ld blocks)", (long)st.st_blocks);
            CHECK(pread(fd, buf, 2, 9) == 2 && buf[0] == 'z' && buf[1] == 0, "zero range zeroes");
            CHECK(fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, 0, 9000) == 0 && fstat(fd, &st) == 0 &&
                      st.st_size == 6010 && pread(fd, buf, 1, 0) == 1 && buf[0] == 0,
                  "zero range with KEEP_SIZE");
        }
        CHECK(ftruncate(fd, 6000) == 0, "back to 6000 bytes");
    }
    CHECK(posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL) == 0, "fadvise");
    ERRNO_IS(ftruncate(fd, -1), EINVAL);
    int ro = open(at("f"), O_RDONLY);
    ERRNO_IS(write(ro, "x", 1), EBADF);
    ERRNO_IS(ftruncate(ro, 0), EINVAL);

    /* mmap: a shared map follows the file (a write through another
     * descriptor shows in it; one made read only cannot be made writable), a
     * store into a writable one shows in a read of the file; a private one is
     * a copy of the file's bytes (zeros past the end). */
    char *sm = mmap(NULL, 8192, PROT_READ, MAP_SHARED, ro, 0);
    CHECK(sm != MAP_FAILED, "shared read-only mmap");
    if (sm != MAP_FAILED) {
        CHECK(pread(ro, buf, 16, 100) == 16 && !memcmp(sm + 100, buf, 16), "a shared map holds the file's bytes");
        CHECK(pwrite(fd, "shared!", 7, 100) == 7 && !memcmp(sm + 100, "shared!", 7), "a write shows in a shared map");
        ERRNO_IS(mprotect(sm, 4096, PROT_READ | PROT_WRITE), EACCES);
        CHECK(munmap(sm, 8192) == 0, "munmap of a shared map");
    }
    char *wm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK(wm != MAP_FAILED, "writable shared mmap");
    if (wm != MAP_FAILED) {
        memcpy(wm + 10, "mapped", 6);
        CHECK(pread(ro, buf, 6, 10) == 6 && !memcmp(buf, "mapped", 6), "a store into a shared map shows in a read");
        CHECK(msync(wm, 4096, MS_SYNC) == 0 && munmap(wm, 4096) == 0, "msync and munmap of a writable map");
        CHECK(pread(ro, buf, 6, 10) == 6 && !memcmp(buf, "mapped", 6), "and stays in the file");
    }
    ERRNO_IS((long)mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0), EACCES);
    char want_map[8192];
    CHECK(pread(ro, want_map, 6000, 0) == 6000, "pread for the map");
    memset(want_map + 6000, 0, sizeof want_map - 6000);
    char *pm = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE, ro, 0);
    CHECK(pm != MAP_FAILED && !memcmp(pm, want_map, 8192) && munmap(pm, 8192) == 0, "private mmap, past the end");
    pm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, ro, 4096);
    CHECK(pm != MAP_FAILED && !memcmp(pm, want_map + 4096, 4096), "private mmap at an offset");
    if (pm != MAP_FAILED) {
        pm[0] = 'Z';
        CHECK(pread(ro, buf, 1, 4096) == 1 && buf[0] == want_map[4096] && munmap(pm, 4096) == 0,
              "a private map's writes stay in it");
    }
    ERRNO_IS((long)mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, ro, 100), EINVAL);
    int wo = open(at("f"), O_WRONLY);
    ERRNO_IS((long)mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, wo, 0), EACCES);
    CHECK(close(wo) == 0 && close(ro) == 0 && close(fd) == 0, "close");

    /* O_TRUNC and creat. */
    fd = open(at("f"), O_WRONLY | O_TRUNC);
    CHECK(fd >= 0 && fstat(fd, &st) == 0 && st.st_size == 0, "O_TRUNC");
    close(fd);
    fd = creat(at("c"), 0640);
    CHECK(fd >= 0 && fstat(fd, &st) == 0 && (st.st_mode & 0777) == 0640 && (fcntl(fd, F_GETFL) & O_ACCMODE) == O_WRONLY,
          "creat");
    ERRNO_IS(read(fd, buf, 1), EBADF);
    close(fd);
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The sorted names of directory `path`, joined by spaces. */
static void listing(const char *path, char *out, size_t size) {
    char *names[64];
    int n = 0;
    DIR *d = opendir(path);
    if (!d) {
        snprintf(out, size, "(opendir failed: %s)", strerror(errno));
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, n, sizeof *names, cmp);
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        strncat(out, names[i], size - strlen(out) - 2);
        strcat(out, " ");
        free(names[i]);
    }
}

static void directories(void) {
    CHECK(mkdir(at("d"), 0777) == 0, "mkdir");
    struct stat st;
    CHECK(stat(at("d"), &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0755, "mode %o", st.st_mode);
    ERRNO_IS(mkdir(at("d"), 0777), EEXIST);
    ERRNO_IS(mkdir(at("f/x"), 0777), ENOTDIR);
    ERRNO_IS(mkdir(at("no/x"), 0777), ENOENT);
    CHECK(mkdir(at("d/sub"), 0700) == 0 && close(open(at("d/sub/leaf"), O_CREAT | O_WRONLY, 0600)) == 0, "nested");
    ERRNO_IS(rmdir(at("d")), ENOTEMPTY);
    ERRNO_IS(rmdir(at("f")), ENOTDIR);
    ERRNO_IS(unlink(at("d")), EISDIR);
    ERRNO_IS(open(at("d"), O_WRONLY), EISDIR);
    char names[1024];
    listing(at("d"), names, sizeof names);
    CHECK(!strcmp(names, ". .. sub "), "listing '%s'", names);
    listing(dir, names, sizeof names);
    CHECK(!strcmp(names, ". .. c d f other "), "top listing '%s'", names);

    /* *at calls relative to a directory descriptor; fdopendir, rewinddir, dirfd. */
    int dfd = open(at("d"), O_RDONLY | O_DIRECTORY);
    CHECK(dfd >= 0, "open a directory");
    int leaf = openat(dfd, "sub/leaf", O_RDWR);
    CHECK(leaf >= 0 && write(leaf, "leaf", 4) == 4 && close(leaf) == 0, "openat");
    CHECK(fstatat(dfd, "sub/leaf", &st, 0) == 0 && st.st_size == 4, "fstatat");
    CHECK(fstatat(dfd, "", &st, AT_EMPTY_PATH) == 0 && S_ISDIR(st.st_mode), "fstatat AT_EMPTY_PATH");
    struct statx sx;
    CHECK(statx(dfd, "sub/leaf", 0, STATX_BASIC_STATS, &sx) == 0 && sx.stx_size == 4 && S_ISREG(sx.stx_mode), "statx");
    /* libuv (Node.js) asks for statx by number. */
    memset(&sx, 0, sizeof sx);
    CHECK(syscall(SYS_statx, dfd, "sub/leaf", 0, STATX_BASIC_STATS, &sx) == 0 && sx.stx_size == 4, "syscall(SYS_statx)");
    ERRNO_IS(syscall(SYS_statx, dfd, "sub/none", 0, STATX_BASIC_STATS, &sx), ENOENT);
    CHECK(syscall(SYS_getpid) == getpid(), "another syscall by number");
    CHECK(mkdirat(dfd, "made", 0755) == 0 && unlinkat(dfd, "made", AT_REMOVEDIR) == 0, "mkdirat, unlinkat");
    CHECK(fsync(dfd) == 0, "fsync of a directory");
    ERRNO_IS(read(dfd, names, 1), EISDIR);
    DIR *ds = fdopendir(dfd);
    CHECK(ds && dirfd(ds) == dfd, "fdopendir, dirfd");
    int count = 0;
    while (readdir(ds)) count++;
    rewinddir(ds);
    int again = 0;
    while (readdir(ds)) again++;
    CHECK(count == 3 && again == 3, "readdir %d, after rewinddir %d", count, again);
    CHECK(closedir(ds) == 0, "closedir");

    CHECK(access(at("d/sub/leaf"), F_OK) == 0 && access(at("d/sub/leaf"), R_OK | W_OK) == 0, "access");
    ERRNO_IS(access(at("d/nope"), F_OK), ENOENT);
    CHECK(faccessat(AT_FDCWD, at("d"), X_OK, 0) == 0, "faccessat");
    CHECK(lstat(at("d/sub"), &st) == 0 && S_ISDIR(st.st_mode), "lstat");
}

static void renames(void) {
    int keep = open(at("c"), O_RDONLY);
    CHECK(rename(at("f"), at("c")) == 0, "rename over a file");
    struct stat st;
    CHECK(fstat(keep, &st) == 0 && st.st_nlink == 0, "the replaced file is unlinked but open (nlink %lu)",
          (unsigned long)st.st_nlink);
    CHECK(close(keep) == 0, "close it");
    ERRNO_IS(stat(at("f"), &st), ENOENT);
    int a = open(at("a"), O_CREAT | O_RDWR, 0644);
    CHECK(write(a, "A", 1) == 1, "a");
    ERRNO_IS(renameat2(AT_FDCWD, at("a"), AT_FDCWD, at("c"), RENAME_NOREPLACE), EEXIST);
    CHECK(renameat2(AT_FDCWD, at("a"), AT_FDCWD, at("d"), RENAME_EXCHANGE) == 0, "exchange a file and a directory");
    CHECK(stat(at("a"), &st) == 0 && S_ISDIR(st.st_mode) && stat(at("d"), &st) == 0 && S_ISREG(st.st_mode), "swapped");
    ERRNO_IS(rename(at("a"), at("a/sub/inside")), EINVAL);
    CHECK(renameat(AT_FDCWD, at("a/sub"), AT_FDCWD, at("moved")) == 0, "a directory moves with what it holds");
    char buf[8] = {0};
    int leaf = open(at("moved/leaf"), O_RDONLY);
    CHECK(leaf >= 0 && read(leaf, buf, 8) == 4 && !memcmp(buf, "leaf", 4), "its file came along");

    /* Unlinked while open: the data lives until the last close. */
    CHECK(unlink(at("moved/leaf")) == 0, "unlink");
    CHECK(pread(leaf, buf, 4, 0) == 4 && !memcmp(buf, "leaf", 4), "read after unlink");
    ERRNO_IS(open(at("moved/leaf"), O_RDONLY), ENOENT);
    CHECK(close(leaf) == 0 && close(a) == 0, "close");
    CHECK(rmdir(at("moved")) == 0 && rmdir(at("a")) == 0, "rmdir emptied directories");
}

static void locks(void) {
    int one = open(at("lock"), O_CREAT | O_RDWR, 0644);
    int two = open(at("lock"), O_RDWR);
    CHECK(flock(one, LOCK_EX) == 0, "flock");
    ERRNO_IS(flock(two, LOCK_EX | LOCK_NB), EWOULDBLOCK);
    ERRNO_IS(flock(two, LOCK_SH | LOCK_NB), EWOULDBLOCK);
    CHECK(flock(one, LOCK_UN) == 0 && flock(two, LOCK_SH | LOCK_NB) == 0 && flock(one, LOCK_SH | LOCK_NB) == 0,
          "shared locks together");
    CHECK(close(two) == 0 && flock(one, LOCK_EX | LOCK_NB) == 0, "a closed description lets go");
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    CHECK(fcntl(one, F_SETLK, &fl) == 0, "F_SETLK");
    fl.l_type = F_WRLCK;
    CHECK(fcntl(one, F_GETLK, &fl) == 0 && fl.l_type == F_UNLCK, "a process's own lock does not conflict");
    close(one);
}

static void forked(void) {
    int fd = open(at("forked"), O_CREAT | O_RDWR, 0644);
    CHECK(write(fd, "parent", 6) == 6, "write");
    pid_t child = fork();
    if (child == 0) {
        char b[6];
        ssize_t n = pread(fd, b, 6, 0);
        /* The kernel shares the file; an iopath mount's descriptor is the parent's alone. */
        _exit(iopath_mode ? !(n < 0 && errno == EBADF) : n != 6);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's view");
    char b[6];
    CHECK(pread(fd, b, 6, 0) == 6 && !memcmp(b, "parent", 6), "the parent keeps working");
    close(fd);
}

static void stdio_and_metadata(void) {
    FILE *f = fopen(at("s.txt"), "w");
    CHECK(f != NULL, "fopen w");
    CHECK(fprintf(f, "line one\nline %d\n", 2) == 16, "fprintf");
    CHECK(fflush(f) == 0 && fsync(fileno(f)) == 0, "fflush, fsync(fileno)");
    CHECK(fclose(f) == 0, "fclose");
    f = fopen(at("s.txt"), "a+");
    CHECK(f && fputs("three\n", f) >= 0 && fclose(f) == 0, "fopen a+");
    f = fopen(at("s.txt"), "r");
    char line[64];
    CHECK(f && fgets(line, sizeof line, f) && !strcmp(line, "line one\n"), "fgets");
    CHECK(fseek(f, -6, SEEK_END) == 0 && fgets(line, sizeof line, f) && !strcmp(line, "three\n"), "fseek, fgets");
    CHECK(ftell(f) == 22 && fgets(line, sizeof line, f) == NULL && feof(f), "ftell, end of file");
    CHECK(fclose(f) == 0, "fclose r");
    CHECK(fopen(at("nope/x"), "r") == NULL && errno == ENOENT, "fopen of nothing");
    int fd = open(at("s.txt"), O_RDONLY);
    f = fdopen(fd, "r");
    CHECK(f && fileno(f) == fd && fgets(line, sizeof line, f) && fclose(f) == 0, "fdopen");

    struct stat st;
    CHECK(chmod(at("s.txt"), 0600) == 0 && stat(at("s.txt"), &st) == 0 && (st.st_mode & 07777) == 0600, "chmod");
    fd = open(at("s.txt"), O_RDWR);
    CHECK(fchmod(fd, 0640) == 0 && fstat(fd, &st) == 0 && (st.st_mode & 07777) == 0640, "fchmod");
    struct timespec times[2] = {{0, UTIME_OMIT}, {1000000000, 5000}};
    CHECK(utimensat(AT_FDCWD, at("s.txt"), times, 0) == 0 && stat(at("s.txt"), &st) == 0 &&
              st.st_mtim.tv_sec == 1000000000 && st.st_mtim.tv_nsec == 5000,
          "utimensat");
    times[1].tv_sec = 2000000000;
    CHECK(futimens(fd, times) == 0 && fstat(fd, &st) == 0 && st.st_mtim.tv_sec == 2000000000, "futimens");
    /* The older forms (unzip calls utime, rsync lutimes). */
    struct utimbuf ub = {0, 1100000000};
    CHECK(utime(at("s.txt"), &ub) == 0 && stat(at("s.txt"), &st) == 0 && st.st_mtime == 1100000000, "utime");
    struct timeval tv[2] = {{0, 0}, {1200000000, 7}};
    CHECK(utimes(at("s.txt"), tv) == 0 && stat(at("s.txt"), &st) == 0 && st.st_mtim.tv_sec == 1200000000 &&
              st.st_mtim.tv_nsec == 7000,
          "utimes");
    tv[1].tv_sec = 1300000000;
    CHECK(lutimes(at("s.txt"), tv) == 0 && stat(at("s.txt"), &st) == 0 && st.st_mtime == 1300000000, "lutimes");
    tv[1].tv_sec = 1400000000;
    CHECK(futimes(fd, tv) == 0 && fstat(fd, &st) == 0 && st.st_mtime == 1400000000, "futimes");
    tv[1].tv_sec = 1500000000;
    CHECK(futimesat(AT_FDCWD, at("s.txt"), tv) == 0 && stat(at("s.txt"), &st) == 0 && st.st_mtime == 1500000000,
          "futimesat");
    CHECK(lchmod(at("s.txt"), 0604) == 0 && stat(at("s.txt"), &st) == 0 && (st.st_mode & 07777) == 0604, "lchmod");
    ERRNO_IS(utime(at("nope/x"), &ub), ENOENT);
    CHECK(fchown(fd, geteuid(), getegid()) == 0 && chown(at("s.txt"), (uid_t)-1, (gid_t)-1) == 0, "chown to oneself");
    struct statfs sf;
    CHECK(fstatfs(fd, &sf) == 0 && sf.f_bsize > 0 && sf.f_bfree > 0 && sf.f_blocks >= sf.f_bfree, "fstatfs");
    CHECK(statfs(dir, &sf) == 0 && sf.f_namelen >= 255, "statfs");
    close(fd);
    CHECK(unlink(at("s.txt")) == 0, "unlink");
}

/* copy_file_range and sendfile between two files of one file system, and
 * sendfile from a file into a pipe. */
static void copies(void) {
    int src = open(at("src"), O_RDWR | O_CREAT | O_TRUNC, 0644);
    int dst = open(at("dst"), O_RDWR | O_CREAT | O_TRUNC, 0644);
    CHECK(src >= 0 && dst >= 0, "create src and dst");
    static char data[10000], back[10000];
    for (int i = 0; i < (int)sizeof data; i++)
        data[i] = (char)(i * 7 + 3);
    CHECK(write(src, data, sizeof data) == (ssize_t)sizeof data, "write src");
    loff_t in = 100, out = 0;
    CHECK(copy_file_range(src, &in, dst, &out, 5000, 0) == 5000 && in == 5100 && out == 5000,
          "copy_file_range with offsets");
    CHECK(lseek(src, 0, SEEK_CUR) == 10000 && lseek(dst, 0, SEEK_CUR) == 0, "given offsets leave the positions");
    CHECK(pread(dst, back, sizeof back, 0) == 5000 && !memcmp(back, data + 100, 5000), "the bytes copied");
    CHECK(lseek(src, 9000, SEEK_SET) == 9000 && copy_file_range(src, NULL, dst, NULL, 5000, 0) == 1000,
          "copy_file_range from the positions, short at the end");
    CHECK(lseek(src, 0, SEEK_CUR) == 10000 && lseek(dst, 0, SEEK_CUR) == 1000, "the positions moved");
    CHECK(copy_file_range(src, NULL, dst, NULL, 10, 0) == 0, "at the end: 0");
    ERRNO_IS(copy_file_range(src, NULL, dst, NULL, 10, 1), EINVAL);
    in = 0;
    out = 10;
    ERRNO_IS(copy_file_range(src, &in, src, &out, 100, 0), EINVAL);
    int ro = open(at("dst"), O_RDONLY);
    ERRNO_IS(copy_file_range(src, &in, ro, &out, 10, 0), EBADF);
    close(ro);
    off_t so = 20;
    CHECK(lseek(dst, 0, SEEK_SET) == 0 && sendfile(dst, src, &so, 300) == 300 && so == 320 &&
              lseek(dst, 0, SEEK_CUR) == 300,
          "sendfile with an offset");
    CHECK(pread(dst, back, 300, 0) == 300 && !memcmp(back, data + 20, 300), "sendfile's bytes");
    CHECK(lseek(src, 50, SEEK_SET) == 50 && sendfile(dst, src, NULL, 10) == 10 && lseek(src, 0, SEEK_CUR) == 60,
          "sendfile from the position");
    /* ioctl: bytes left to read; a file is not a terminal. */
    int left = -1;
    CHECK(lseek(src, 9990, SEEK_SET) == 9990 && ioctl(src, FIONREAD, &left) == 0 && left == 10, "FIONREAD %d", left);
    CHECK(!isatty(src), "a file is not a terminal");
    /* Out of the file system: a mount says EXDEV (programs then read and write). */
    FILE *host = tmpfile();
    in = 0;
    ssize_t n = host ? copy_file_range(src, &in, fileno(host), NULL, 100, 0) : -1;
    if (iopath_mode)
        CHECK(n < 0 && errno == EXDEV, "copy_file_range out of the mount: EXDEV");
    else
        CHECK(n == 100 || (n < 0 && errno == EXDEV), "copy_file_range to a file elsewhere");
    if (host)
        fclose(host);
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    CHECK(sendfile(p[1], src, &so, 16) == 16 && so == 336 && read(p[0], back, 16) == 16 &&
              !memcmp(back, data + 320, 16),
          "sendfile into a pipe");
    close(p[0]);
    close(p[1]);
    CHECK(close(src) == 0 && close(dst) == 0 && unlink(at("src")) == 0 && unlink(at("dst")) == 0, "clean up");
}

static void other_nodes(void) {
    /* What a mount cannot hold is refused with the errno Linux gives a file system without it;
       on ext4 the same calls succeed, so only the refusal of the mount is checked there. */
    char buf[64];
    struct stat st;
    int fd = open(at("plain"), O_CREAT | O_WRONLY, 0644);
    ERRNO_IS(readlink(at("plain"), buf, sizeof buf), EINVAL);
    ERRNO_IS(readlink(at("none"), buf, sizeof buf), ENOENT);
    if (iopath_mode) {
        ERRNO_IS(linkat(fd, "", AT_FDCWD, at("by-fd"), AT_EMPTY_PATH), ENOENT);
        ERRNO_IS(mknod(at("dev"), S_IFCHR | 0600, makedev(1, 3)), EPERM);
        ERRNO_IS(link(at("plain"), "/tmp/iopath-mount-test-cross-link"), EXDEV);
    }
    CHECK(close(fd) == 0 && unlink(at("plain")) == 0, "unlink");
    /* A FIFO, both ways: made by mkfifo and mknod, a FIFO to stat, bytes through it. */
    CHECK(mkfifo(at("fifo"), 0640) == 0, "mkfifo");
    ERRNO_IS(mkfifo(at("fifo"), 0640), EEXIST);
    mode_t mask = umask(022);
    umask(mask);
    CHECK(lstat(at("fifo"), &st) == 0 && S_ISFIFO(st.st_mode) && (st.st_mode & 0777) == (0640 & ~mask),
          "a FIFO to lstat");
    ERRNO_IS(open(at("fifo"), O_WRONLY | O_NONBLOCK), ENXIO);
    int r = open(at("fifo"), O_RDONLY | O_NONBLOCK);
    int w = open(at("fifo"), O_WRONLY | O_NONBLOCK);
    CHECK(r >= 0 && w >= 0 && fstat(w, &st) == 0 && S_ISFIFO(st.st_mode), "both ends open, without waiting");
    CHECK(write(w, "pipe", 4) == 4 && read(r, buf, sizeof buf) == 4 && !memcmp(buf, "pipe", 4), "bytes through");
    ERRNO_IS(truncate(at("fifo"), 0), EINVAL);
    CHECK(close(r) == 0 && close(w) == 0 && unlink(at("fifo")) == 0, "unlink a FIFO");
    CHECK(mknod(at("fifo2"), S_IFIFO | 0600, 0) == 0 && stat(at("fifo2"), &st) == 0 && S_ISFIFO(st.st_mode),
          "mknod of a FIFO");
    CHECK(unlink(at("fifo2")) == 0, "unlink");
}

static void symlinks(void) {
    char buf[256];
    struct stat st;
    CHECK(mkdir(at("ld"), 0755) == 0, "mkdir");
    int fd = open(at("ld/t"), O_CREAT | O_WRONLY, 0644);
    CHECK(fd >= 0 && write(fd, "target", 6) == 6 && close(fd) == 0, "a target");
    CHECK(symlink("ld/t", at("l")) == 0 && symlink("ld", at("l2d")) == 0, "symlink");
    ERRNO_IS(symlink("x", at("l")), EEXIST);
    CHECK(readlink(at("l"), buf, sizeof buf) == 4 && !memcmp(buf, "ld/t", 4), "readlink");
    CHECK(readlink(at("l"), buf, 2) == 2 && !memcmp(buf, "ld", 2), "readlink cut to the buffer");
    CHECK(lstat(at("l"), &st) == 0 && S_ISLNK(st.st_mode) && st.st_size == 4, "lstat sees the link");
    CHECK(stat(at("l"), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 6, "stat follows it");
    CHECK(fstatat(AT_FDCWD, at("l"), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode), "fstatat nofollow");
    fd = open(at("l"), O_RDONLY);
    CHECK(fd >= 0 && read(fd, buf, sizeof buf) == 6 && !memcmp(buf, "target", 6) && close(fd) == 0, "read through");
    CHECK(stat(at("l2d/t"), &st) == 0 && st.st_size == 6, "a directory through a link");
    CHECK(mkdir(at("ld/sub"), 0755) == 0 && symlink("ld/sub", at("lsub")) == 0, "a link to a subdirectory");
    CHECK(stat(at("lsub/../t"), &st) == 0 && st.st_size == 6, "link/.. is the parent of the link's target");
    CHECK(stat(at("lsub/../../l"), &st) == 0 && st.st_size == 6, "and climbs on from there");
    CHECK(unlink(at("lsub")) == 0 && rmdir(at("ld/sub")) == 0, "clean up the link to a subdirectory");
    ERRNO_IS(open(at("l"), O_RDONLY | O_NOFOLLOW), ELOOP);
    ERRNO_IS(open(at("l"), O_CREAT | O_EXCL | O_WRONLY, 0644), EEXIST);
    ERRNO_IS(rmdir(at("l2d")), ENOTDIR);
    CHECK(symlink("ld/made", at("dangling")) == 0, "a dangling link");
    ERRNO_IS(stat(at("dangling"), &st), ENOENT);
    CHECK(llistxattr(at("dangling"), buf, sizeof buf) >= 0, "llistxattr asks the link itself");
    ERRNO_IS(listxattr(at("dangling"), buf, sizeof buf), ENOENT);
    fd = open(at("dangling"), O_CREAT | O_WRONLY, 0644);
    CHECK(fd >= 0 && close(fd) == 0 && stat(at("ld/made"), &st) == 0, "O_CREAT through a dangling link makes its target");
    CHECK(symlink("loop", at("loop")) == 0, "a loop");
    ERRNO_IS(stat(at("loop"), &st), ELOOP);
    /* Out of DIR and back in: "../NAME/ld/t", NAME being DIR's own name. */
    const char *name = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;
    char up[2100];
    snprintf(up, sizeof up, "../%s/ld/t", name);
    CHECK(symlink(up, at("up")) == 0 && stat(at("up"), &st) == 0 && st.st_size == 6, "a link that climbs out and back");
    /* A link to a file outside DIR, by its absolute path. */
    fd = open("/tmp/iopath-mount-test-outside", O_CREAT | O_TRUNC | O_WRONLY, 0644);
    CHECK(fd >= 0 && write(fd, "outside!", 8) == 8 && close(fd) == 0, "a file outside");
    CHECK(symlink("/tmp/iopath-mount-test-outside", at("out")) == 0, "a link out");
    fd = open(at("out"), O_RDONLY);
    CHECK(fd >= 0 && read(fd, buf, sizeof buf) == 8 && !memcmp(buf, "outside!", 8) && close(fd) == 0,
          "read through a link out");
    CHECK(unlink("/tmp/iopath-mount-test-outside") == 0, "clean up outside");
    struct timespec times[2] = {{0, UTIME_OMIT}, {1000000, 0}};
    CHECK(utimensat(AT_FDCWD, at("l"), times, AT_SYMLINK_NOFOLLOW) == 0 && lstat(at("l"), &st) == 0 &&
              st.st_mtime == 1000000 && stat(at("l"), &st) == 0 && st.st_mtime != 1000000,
          "utimensat nofollow sets the link's time");
    int links = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        links += e->d_type == DT_LNK;
    CHECK(d && closedir(d) == 0 && links == 6, "readdir says DT_LNK (%d)", links);
    CHECK(rename(at("l"), at("l3")) == 0 && readlink(at("l3"), buf, sizeof buf) == 4, "rename a link");
    CHECK(unlink(at("l3")) == 0 && stat(at("ld/t"), &st) == 0, "unlink a link, not its target");
    CHECK(unlink(at("l2d")) == 0 && unlink(at("dangling")) == 0 && unlink(at("loop")) == 0 && unlink(at("up")) == 0 &&
              unlink(at("out")) == 0 && unlink(at("ld/t")) == 0 && unlink(at("ld/made")) == 0 && rmdir(at("ld")) == 0,
          "clean up");
    /* A path that ends in '/' follows a last link even where the call does not
     * (lstat, AT_SYMLINK_NOFOLLOW); a link that climbs out of the directory
     * leads where the kernel says. */
    CHECK(mkdir(at("ldir"), 0755) == 0 && symlink("ldir", at("tolink")) == 0, "a link to a directory");
    CHECK(lstat(at("tolink"), &st) == 0 && S_ISLNK(st.st_mode), "lstat of the link");
    CHECK(lstat(at("tolink/"), &st) == 0 && S_ISDIR(st.st_mode), "lstat of link/ follows it");
    CHECK(fstatat(AT_FDCWD, at("tolink/"), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode),
          "fstatat nofollow of link/ follows it");
    CHECK(symlink("../no-such-dir-above", at("climbs")) == 0, "a link that climbs out");
    ERRNO_IS(lstat(at("climbs/"), &st), ENOENT);
    CHECK(unlink(at("climbs")) == 0 && unlink(at("tolink")) == 0 && rmdir(at("ldir")) == 0, "cleaned up");
}

static void hard_links(void) {
    struct stat a, b;
    char buf[64];
    CHECK(mkdir(at("hd"), 0755) == 0, "mkdir");
    int fd = open(at("hd/f"), O_CREAT | O_RDWR, 0644);
    CHECK(fd >= 0 && write(fd, "first", 5) == 5, "a file");
    CHECK(link(at("hd/f"), at("g")) == 0, "link");
    CHECK(stat(at("hd/f"), &a) == 0 && stat(at("g"), &b) == 0 && a.st_ino == b.st_ino && a.st_nlink == 2 &&
              b.st_nlink == 2,
          "one inode, two names");
    CHECK(fstat(fd, &a) == 0 && a.st_nlink == 2, "fstat counts the names");
    ERRNO_IS(link(at("hd/f"), at("g")), EEXIST);
    ERRNO_IS(link(at("hd"), at("hd2")), EPERM);
    ERRNO_IS(link(at("none"), at("x")), ENOENT);
    ERRNO_IS(link(at("hd/f"), at("none/x")), ENOENT);
    CHECK(pwrite(fd, "FIRST", 5, 0) == 5 && close(fd) == 0, "write through one name");
    fd = open(at("g"), O_RDONLY);
    CHECK(fd >= 0 && read(fd, buf, sizeof buf) == 5 && !memcmp(buf, "FIRST", 5), "read through the other");
    CHECK(unlink(at("hd/f")) == 0 && fstat(fd, &a) == 0 && a.st_nlink == 1 && stat(at("g"), &b) == 0 &&
              b.st_ino == a.st_ino,
          "the first name goes, the file stays, its inode number too");
    CHECK(close(fd) == 0, "close");
    CHECK(symlink("g", at("sl")) == 0, "symlink");
    CHECK(linkat(AT_FDCWD, at("sl"), AT_FDCWD, at("sl-itself"), 0) == 0 && lstat(at("sl-itself"), &a) == 0 &&
              S_ISLNK(a.st_mode) && a.st_nlink == 2,
          "linkat links a symbolic link itself");
    CHECK(linkat(AT_FDCWD, at("sl"), AT_FDCWD, at("sl-target"), AT_SYMLINK_FOLLOW) == 0 &&
              lstat(at("sl-target"), &a) == 0 && S_ISREG(a.st_mode) && a.st_ino == b.st_ino && a.st_nlink == 2,
          "linkat AT_SYMLINK_FOLLOW links its target");
    int dfd = open(at("hd"), O_RDONLY | O_DIRECTORY);
    CHECK(dfd >= 0 && linkat(AT_FDCWD, at("g"), dfd, "via-dirfd", 0) == 0 && stat(at("hd/via-dirfd"), &a) == 0 &&
              a.st_nlink == 3 && close(dfd) == 0,
          "linkat relative to a directory descriptor");
    ERRNO_IS(linkat(AT_FDCWD, at("g"), AT_FDCWD, at("bad-flag"), 0x4000000), EINVAL);
    CHECK(rename(at("g"), at("sl-target")) == 0 && stat(at("g"), &a) == 0 && a.st_nlink == 3,
          "rename between two names of one file does nothing");
    ino_t g = 0, t = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, "g"))
            g = e->d_ino;
        if (!strcmp(e->d_name, "sl-target"))
            t = e->d_ino;
    }
    CHECK(d && closedir(d) == 0 && g != 0 && g == t && g == b.st_ino, "readdir gives both names one inode number");
    CHECK(unlink(at("g")) == 0 && unlink(at("sl-target")) == 0 && stat(at("hd/via-dirfd"), &a) == 0 &&
              a.st_nlink == 1,
          "names go one by one");
    CHECK(unlink(at("hd/via-dirfd")) == 0 && unlink(at("sl")) == 0 && unlink(at("sl-itself")) == 0 &&
              rmdir(at("hd")) == 0,
          "clean up");
}

static void working_directory(void) {
    char old[4096], now[4096];
    CHECK(getcwd(old, sizeof old) != NULL, "getcwd");
    CHECK(mkdir(at("wd"), 0755) == 0 && mkdir(at("wd/in"), 0755) == 0, "mkdir");
    CHECK(chdir(at("wd/in")) == 0, "chdir into a subdirectory");
    char want[4200];
    snprintf(want, sizeof want, "%s/wd/in", dir);
    CHECK(getcwd(now, sizeof now) && !strcmp(now, want), "getcwd '%s'", now);
    char *alloc = getcwd(NULL, 0);
    CHECK(alloc && !strcmp(alloc, want), "getcwd(NULL)");
    free(alloc);
    CHECK(getcwd(now, 3) == NULL && errno == ERANGE, "getcwd too small");
    int fd = open("here", O_CREAT | O_RDWR, 0644);
    CHECK(fd >= 0 && close(fd) == 0, "a file in the working directory");
    CHECK(access("../in/here", F_OK) == 0 && access(at("wd/in/here"), F_OK) == 0, "found both ways");
    CHECK(chdir("..") == 0 && access("in/here", F_OK) == 0, "chdir ..");
    int wd = open(".", O_RDONLY | O_DIRECTORY);
    CHECK(chdir(old) == 0 && getcwd(now, sizeof now) && !strcmp(now, old), "back out");
    CHECK(fchdir(wd) == 0 && access("in/here", F_OK) == 0, "fchdir");
    CHECK(chdir(old) == 0 && close(wd) == 0, "back out again");
    CHECK(unlink(at("wd/in/here")) == 0 && rmdir(at("wd/in")) == 0 && rmdir(at("wd")) == 0, "clean up");
}

static void relative(void) {
    char old[4096];
    CHECK(getcwd(old, sizeof old) != NULL, "getcwd");
    CHECK(chdir(dir) == 0, "chdir into DIR");
    int fd = open("rel", O_CREAT | O_RDWR, 0644);
    CHECK(fd >= 0 && write(fd, "r", 1) == 1 && close(fd) == 0, "a relative path");
    struct stat st;
    CHECK(stat("./rel", &st) == 0 && st.st_size == 1 && stat("../" "", &st) == 0, "relative stat");
    CHECK(unlink("rel") == 0, "relative unlink");
    CHECK(chdir(old) == 0, "chdir back");
}

/* The C library's own walkers of paths and directories (realpath, mkstemp,
 * scandir, nftw, glob, statvfs, pathconf): glibc calls the kernel from
 * inside them, not through the functions a program calls. */
static int walked, walked_dirs_after, walked_links;
static int on_walk(const char *path, const struct stat *st, int kind, struct FTW *ftw) {
    (void)path, (void)st;
    walked++;
    if (kind == FTW_DP && ftw->level == 0) walked_dirs_after = walked;
    if (kind == FTW_SL) walked_links++;
    return 0;
}
static int on_ftw(const char *path, const struct stat *st, int kind) {
    (void)path, (void)st, (void)kind;
    walked++;
    return 0;
}
static int not_dot(const struct dirent *e) { return e->d_name[0] != '.'; }

static void library_walkers(void) {
    CHECK(mkdir(at("walk"), 0755) == 0 && mkdir(at("walk/sub"), 0755) == 0, "mkdir");
    int fd = open(at("walk/f"), O_CREAT | O_WRONLY, 0644);
    CHECK(fd >= 0 && write(fd, "walk", 4) == 4 && close(fd) == 0, "a file");
    CHECK(symlink("sub", at("walk/link")) == 0, "a link");

    /* realpath and its relatives */
    char *base = realpath(dir, NULL);
    CHECK(base != NULL, "realpath of DIR");
    char want[4200], got[PATH_MAX];
    snprintf(want, sizeof want, "%s/walk/sub", base ? base : "");
    CHECK(realpath(at("walk/link"), got) && !strcmp(got, want), "realpath through a link: '%s'", got);
    snprintf(want, sizeof want, "%s/walk/f", base ? base : "");
    CHECK(realpath(at("walk/sub/../link/..//f"), got) && !strcmp(got, want), "realpath with .. after a link: '%s'", got);
    char *c = canonicalize_file_name(at("walk/./f"));
    CHECK(c && !strcmp(c, want), "canonicalize_file_name '%s'", c ? c : "(null)");
    free(c);
    CHECK(realpath(at("walk/missing"), got) == NULL && errno == ENOENT, "realpath of nothing");
    CHECK(realpath(at("walk/f/"), got) == NULL && errno == ENOTDIR, "realpath of a file with a slash");
    CHECK(euidaccess(at("walk/f"), R_OK | W_OK) == 0 && eaccess(at("walk/missing"), F_OK) < 0 && errno == ENOENT,
          "euidaccess");
    free(base);

    /* temporary files and directories */
    char tmpl[4200];
    snprintf(tmpl, sizeof tmpl, "%s", at("walk/tmpXXXXXX"));
    fd = mkstemp(tmpl);
    struct stat st;
    CHECK(fd >= 0 && strstr(tmpl, "XXXXXX") == NULL && fstat(fd, &st) == 0 && (st.st_mode & 0777) == 0600,
          "mkstemp '%s' mode %o", tmpl, st.st_mode);
    CHECK(write(fd, "t", 1) == 1 && close(fd) == 0 && stat(tmpl, &st) == 0 && st.st_size == 1 && unlink(tmpl) == 0,
          "mkstemp's file is there");
    snprintf(tmpl, sizeof tmpl, "%s", at("walk/tmpXXXXXX.log"));
    fd = mkostemps(tmpl, 4, O_CLOEXEC);
    CHECK(fd >= 0 && (fcntl(fd, F_GETFD) & FD_CLOEXEC) && strstr(tmpl, ".log") && close(fd) == 0 && unlink(tmpl) == 0,
          "mkostemps '%s'", tmpl);
    snprintf(tmpl, sizeof tmpl, "%s", at("walk/tmpXXXXX"));
    ERRNO_IS(mkstemp(tmpl), EINVAL);
    snprintf(tmpl, sizeof tmpl, "%s", at("walk/dXXXXXX"));
    CHECK(mkdtemp(tmpl) == tmpl && stat(tmpl, &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700 &&
              rmdir(tmpl) == 0,
          "mkdtemp '%s'", tmpl);

    /* space and limits */
    struct statvfs v;
    CHECK(statvfs(at("walk"), &v) == 0 && v.f_bsize > 0 && v.f_blocks > 0 && v.f_namemax == 255, "statvfs");
    fd = open(at("walk/f"), O_RDONLY);
    CHECK(fd >= 0 && fstatvfs(fd, &v) == 0 && v.f_namemax == 255, "fstatvfs");
    CHECK(fpathconf(fd, _PC_NAME_MAX) == 255 && close(fd) == 0, "fpathconf");
    CHECK(pathconf(at("walk"), _PC_NAME_MAX) == 255 && pathconf(at("walk"), _PC_PATH_MAX) == 4096, "pathconf");
    ERRNO_IS(pathconf(at("walk/missing"), _PC_NAME_MAX), ENOENT);

    /* directory walkers */
    struct dirent **list = NULL;
    int n = scandir(at("walk"), &list, not_dot, alphasort);
    CHECK(n == 3 && !strcmp(list[0]->d_name, "f") && !strcmp(list[1]->d_name, "link") &&
              !strcmp(list[2]->d_name, "sub"),
          "scandir %d", n);
    for (int i = 0; i < n; i++) free(list[i]);
    free(list);
    ERRNO_IS(scandir(at("walk/missing"), &list, NULL, NULL), ENOENT);
    walked = walked_dirs_after = walked_links = 0;
    CHECK(nftw(at("walk"), on_walk, 8, FTW_PHYS | FTW_DEPTH) == 0 && walked == 4 && walked_dirs_after == 4 &&
              walked_links == 1,
          "nftw: %d visits, the root's at %d, %d links", walked, walked_dirs_after, walked_links);
    walked = 0;
    /* (Without FTW_PHYS the link is followed to sub, which was seen already.) */
    CHECK(ftw(at("walk"), on_ftw, 8) == 0 && walked >= 3, "ftw: %d visits", walked);
    ERRNO_IS(nftw(at("walk/missing"), on_walk, 8, 0), ENOENT);
    glob_t g;
    char pattern[4200];
    snprintf(pattern, sizeof pattern, "%s/*", at("walk"));
    CHECK(glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc == 3, "glob");
    globfree(&g);
    snprintf(pattern, sizeof pattern, "%s/s?b/", at("walk"));
    CHECK(glob(pattern, GLOB_MARK, NULL, &g) == 0 && g.gl_pathc == 1, "glob of a directory");
    globfree(&g);
    snprintf(pattern, sizeof pattern, "%s/z*", at("walk"));
    CHECK(glob(pattern, 0, NULL, &g) == GLOB_NOMATCH, "glob with no match");

    /* A path opened one component at a time from "/" (as MariaDB opens its files). */
    int dfd = open("/", O_PATH | O_DIRECTORY);
    char comps[4200];
    snprintf(comps, sizeof comps, "%s", at("walk/f"));
    char *save = NULL, *part = strtok_r(comps + 1, "/", &save), *next;
    while (dfd >= 0 && part && (next = strtok_r(NULL, "/", &save))) {
        int sub = openat(dfd, part, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        close(dfd);
        dfd = sub;
        part = next;
    }
    fd = dfd >= 0 && part ? openat(dfd, part, O_RDONLY | O_NOFOLLOW) : -1;
    char buf[8] = {0};
    CHECK(fd >= 0 && read(fd, buf, 8) == 4 && !strcmp(buf, "walk"), "openat a component at a time");
    if (fd >= 0) close(fd);
    if (dfd >= 0) close(dfd);

    /* freopen: the kernel's turns a stream into another file's; a mount's file refuses it. */
    FILE *f = fopen("/dev/null", "r");
    f = freopen(at("walk/f"), "r", f);
    if (iopath_mode) {
        CHECK(f == NULL && errno == EOPNOTSUPP, "freopen onto a mounted file is refused");
    } else {
        CHECK(f && fgets(buf, sizeof buf, f) && !strcmp(buf, "walk") && fclose(f) == 0, "freopen");
    }
    CHECK(unlink(at("walk/f")) == 0 && unlink(at("walk/link")) == 0 && rmdir(at("walk/sub")) == 0 &&
              rmdir(at("walk")) == 0,
          "clean up");
}

/* A symbolic link of the kernel's (outside DIR) that leads to DIR: what is
 * made, listed or opened through it is DIR's, not the directory a mount
 * sits on. */
static void kernel_links(void) {
    char link[64], p[4200];
    snprintf(link, sizeof link, "/tmp/iopath-mount-test-link-%d", (int)getpid());
    unlink(link);
    CHECK(symlink(dir, link) == 0, "a kernel link to DIR");
    snprintf(p, sizeof p, "%s/made-via-link", link);
    int fd = open(p, O_CREAT | O_WRONLY, 0644);
    CHECK(fd >= 0 && write(fd, "v", 1) == 1 && close(fd) == 0, "create through a kernel link");
    struct stat st;
    CHECK(stat(at("made-via-link"), &st) == 0 && st.st_size == 1, "it is in DIR");
    snprintf(p, sizeof p, "%s/dir-via-link", link);
    CHECK(mkdir(p, 0755) == 0 && stat(at("dir-via-link"), &st) == 0 && S_ISDIR(st.st_mode),
          "mkdir through a kernel link");
    char listed[4096];
    listing(link, listed, sizeof listed);
    CHECK(strstr(listed, "made-via-link") && strstr(listed, "dir-via-link"), "opendir through a kernel link: %s",
          listed);
    int dfd = open(link, O_RDONLY | O_DIRECTORY);
    CHECK(dfd >= 0 && faccessat(dfd, "made-via-link", F_OK, 0) == 0 && close(dfd) == 0,
          "a directory opened through a kernel link");
    char q[4200];
    snprintf(p, sizeof p, "%s/sym-via-link", link);
    snprintf(q, sizeof q, "%s/renamed-via-link", link);
    CHECK(symlink("made-via-link", p) == 0 && lstat(at("sym-via-link"), &st) == 0 && S_ISLNK(st.st_mode),
          "symlink through a kernel link");
    CHECK(rename(p, q) == 0 && lstat(at("renamed-via-link"), &st) == 0 && S_ISLNK(st.st_mode),
          "rename through a kernel link");
    CHECK(unlink(at("made-via-link")) == 0 && unlink(at("renamed-via-link")) == 0 && rmdir(at("dir-via-link")) == 0 &&
              unlink(link) == 0,
          "clean up");
}

/* A signal sent to the process reaches the thread that waits for it, not a
 * thread of iopath's (which would die of SIGUSR1's default action). */
static void signals(void) {
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGUSR1);
    CHECK(pthread_sigmask(SIG_BLOCK, &s, NULL) == 0, "block SIGUSR1");
    CHECK(kill(getpid(), SIGUSR1) == 0, "kill");
    struct timespec wait = {5, 0};
    CHECK(sigtimedwait(&s, NULL, &wait) == SIGUSR1, "the waiting thread got it");
}

/* The whole of a small file, NUL-terminated (empty on error). */
static const char *contents(const char *path) {
    static char buf[256];
    buf[0] = 0;
    int fd = open(path, O_RDONLY);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, sizeof buf - 1);
    buf[n > 0 ? n : 0] = 0;
    if (fd >= 0) close(fd);
    return buf;
}

/* A forked child that puts `in` on its standard input and `out` on its
 * standard output (where not -1) and runs `argv`: its exit status (100 +
 * errno if a dup2 failed, 127 if the program could not run, -1 if it did
 * not exit). */
static int run_child_on(int in, int out, char *const argv[]) {
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        if ((in >= 0 && dup2(in, 0) != 0) || (out >= 0 && dup2(out, 1) != 1)) _exit(100 + errno);
        execvp(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    return waitpid(child, &status, 0) == child && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* A child that runs `argv` with standard input and output as they are. */
static int run_child(char *const argv[]) {
    return run_child_on(-1, -1, argv);
}

/* Standard streams on mounted files, as a shell's redirections make them:
 * dup2 of a file onto 0, 1 and 2, then stdio (which calls the kernel
 * directly) and a child program on them; freopen of stderr (as servers do
 * for their logs); an open that gets number 1. */
static void standard_streams(void) {
    fflush(stdout);
    int saved_out = dup(1), saved_err = dup(2), saved_in = dup(0);
    int fd = open(at("out"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(dup2(fd, 1) == 1 && close(fd) == 0, "dup2 onto 1");
    printf("printf %d\n", 1);
    fflush(stdout);
    CHECK(dup2(1, 2) == 2, "2>&1");
    fprintf(stderr, "stderr\n");
    dup2(saved_err, 2); /* (a child's own stderr, where the interposer logs, stays out) */
    char *echo[] = {"echo", "child", NULL};
    int child = run_child(echo);
    CHECK(write(1, "write\n", 6) == 6, "write(1)");
    dup2(saved_out, 1);
    CHECK(child == 0, "a child writing to the file as its standard output: %d", child);
    CHECK(!strcmp(contents(at("out")), "printf 1\nstderr\nchild\nwrite\n"), "what stdio, a child and write left: %s",
          contents(at("out")));

    fd = open(at("out"), O_WRONLY | O_APPEND);
    CHECK(dup2(fd, 1) == 1 && close(fd) == 0, "dup2 of an O_APPEND file onto 1");
    printf("appended\n");
    fflush(stdout);
    dup2(saved_out, 1);
    CHECK(!strcmp(contents(at("out")), "printf 1\nstderr\nchild\nwrite\nappended\n"), ">>: %s", contents(at("out")));

    fd = open(at("in"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(write(fd, "alpha\nbeta\n", 11) == 11 && close(fd) == 0, "write the input");
    fd = open(at("in"), O_RDONLY);
    CHECK(dup2(fd, 0) == 0 && close(fd) == 0, "dup2 onto 0");
    int counted[2];
    CHECK(pipe(counted) == 0, "pipe");
    CHECK(dup2(counted[1], 1) == 1 && close(counted[1]) == 0, "a kernel pipe onto 1");
    char *wc[] = {"wc", "-c", NULL};
    child = run_child(wc);
    dup2(saved_out, 1);
    char got[32] = {0};
    CHECK(read(counted[0], got, sizeof got - 1) > 0 && atoi(got) == 11 && child == 0,
          "a child reading the file as its standard input: %s", got);
    close(counted[0]);
    dup2(saved_in, 0);
    fd = open(at("in"), O_RDONLY);
    CHECK(dup2(fd, 0) == 0 && close(fd) == 0, "dup2 onto 0 again");
    clearerr(stdin);
    char line[32];
    CHECK(fgets(line, sizeof line, stdin) && !strcmp(line, "alpha\n") && fgets(line, sizeof line, stdin) &&
              !strcmp(line, "beta\n") && !fgets(line, sizeof line, stdin),
          "stdio reading the file: %s", line);
    dup2(saved_in, 0);
    clearerr(stdin);

    CHECK(freopen(at("log"), "w", stderr) == stderr && fileno(stderr) == 2, "freopen of stderr onto a file");
    fprintf(stderr, "to the log\n");
    fflush(stderr); /* (a freopen'd stream is buffered as a file's) */
    dup2(saved_err, 2);
    CHECK(!strcmp(contents(at("log")), "to the log\n"), "a freopen'd stderr: %s", contents(at("log")));

    /* Calls on the file itself through a standard stream (touch opens its file
     * onto 0 and sets the time there; a program may sync its output). */
    fd = open(at("touched"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(dup2(fd, 0) == 0 && close(fd) == 0, "a file opened onto 0");
    struct timespec when[2] = {{0, UTIME_OMIT}, {978307200, 0}};
    struct stat st;
    CHECK(futimens(0, when) == 0 && fchmod(0, 0600) == 0 && fsync(0) == 0 && fdatasync(0) == 0,
          "futimens, fchmod, fsync on it");
    dup2(saved_in, 0);
    CHECK(stat(at("touched"), &st) == 0 && st.st_mtime == 978307200 && (st.st_mode & 07777) == 0600,
          "the file's time and mode: %ld %o", (long)st.st_mtime, st.st_mode & 07777);
    fd = open(at("synced"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(dup2(fd, 1) == 1 && close(fd) == 0, "a file onto 1");
    printf("synced\n");
    fflush(stdout);
    CHECK(fsync(1) == 0, "fsync(1)");
    CHECK(!strcmp(contents(at("synced")), "synced\n"), "what fsync(1) made durable is there: %s",
          contents(at("synced")));
    dup2(saved_out, 1);
    CHECK(unlink(at("touched")) == 0 && unlink(at("synced")) == 0, "unlink them");

    close(1);
    fd = open(at("low"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd == 1, "open takes the lowest free number: %d", fd);
    printf("low\n");
    fflush(stdout);
    dup2(saved_out, 1);
    CHECK(!strcmp(contents(at("low")), "low\n"), "an open that got 1: %s", contents(at("low")));
    close(saved_out);
    close(saved_err);
    close(saved_in);
    CHECK(unlink(at("out")) == 0 && unlink(at("in")) == 0 && unlink(at("low")) == 0 && unlink(at("log")) == 0, "unlink");
}

/* A forked child puts its parent's open files on its standard streams and
 * executes a program (Python's subprocess with stdout=f, a shell's `cmd >&3`):
 * the parent holds the files, and the child's program reads and writes them. */
static void forked_streams(void) {
    int out = open(at("fo"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(out >= 0 && write(out, "first\n", 6) == 6, "open");
    char *echo[] = {"echo", "from a forked child", NULL};
    int status = run_child_on(-1, out, echo);
    CHECK(status == 0, "a forked child's program writing into its parent's file: %d", status);
    CHECK(lseek(out, 0, SEEK_CUR) == 26, "the shared position moved: %ld", (long)lseek(out, 0, SEEK_CUR));
    CHECK(write(out, "last\n", 5) == 5 && close(out) == 0, "the parent writes after it");
    CHECK(!strcmp(contents(at("fo")), "first\nfrom a forked child\nlast\n"), "what both wrote: %s", contents(at("fo")));

    int in = open(at("fo"), O_RDONLY);
    out = open(at("fo2"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(in >= 0 && out >= 0 && lseek(in, 6, SEEK_SET) == 6, "open both");
    char *cat[] = {"cat", NULL};
    status = run_child_on(in, out, cat);
    CHECK(status == 0, "a forked child's program copying from one of its parent's files to another: %d", status);
    CHECK(close(in) == 0 && close(out) == 0, "close");
    CHECK(!strcmp(contents(at("fo2")), "from a forked child\nlast\n"), "what cat copied: %s", contents(at("fo2")));

    /* A forked child's program that reads part of its parent's file (`exec
     * 3< f; head -c 6 <&3; cat <&3`): the parent reads on after what the
     * child consumed, as with the kernel's file. The bridge had fed the
     * whole file into the child's pipe, and the position stood at its end. */
    in = open(at("fo"), O_RDONLY);
    int devnull = open("/dev/null", O_WRONLY);
    char *head[] = {"head", "-c", "6", NULL};
    status = run_child_on(in, devnull, head);
    char rest[64] = {0};
    CHECK(status == 0 && read(in, rest, sizeof rest - 1) == 25 && !strcmp(rest, "from a forked child\nlast\n"),
          "the parent reads on where the child stopped: %d, '%s'", status, rest);
    status = run_child_on(in, devnull, head);
    CHECK(status == 0 && lseek(in, 0, SEEK_CUR) == 31, "a child at the end of the file: %d, at %ld", status,
          (long)lseek(in, 0, SEEK_CUR));
    CHECK(close(in) == 0 && close(devnull) == 0, "close");

    /* A grandchild (a subshell's command): its parent passes the request up. */
    out = open(at("fo3"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        char *echo_deep[] = {"echo", "from a grandchild", NULL};
        _exit(run_child_on(-1, out, echo_deep));
    }
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "a grandchild's program writing into the file: %d", WEXITSTATUS(status));
    CHECK(close(out) == 0 && !strcmp(contents(at("fo3")), "from a grandchild\n"), "what it wrote: %s",
          contents(at("fo3")));
    CHECK(unlink(at("fo")) == 0 && unlink(at("fo2")) == 0 && unlink(at("fo3")) == 0, "clean up");
}

/* Whether process `pid` runs `name` now (its exec is done). */
static int runs(pid_t pid, const char *name) {
    char path[64], comm[64] = {0};
    snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
    int fd = open(path, O_RDONLY);
    ssize_t n = fd < 0 ? -1 : read(fd, comm, sizeof comm - 1);
    if (fd >= 0) close(fd);
    return n > 0 && !strncmp(comm, name, strlen(name)) && comm[strlen(name)] == '\n';
}

/* Descriptors open in this process, counted from /proc/self/fd. */
static int open_descriptors(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d) return -1;
    while (readdir(d)) n++;
    closedir(d);
    return n;
}

/* Many synced writes leave the process with the descriptors it had: the
 * interposer's wait policy reads /proc/loadavg, and its copy of that
 * descriptor was given back closed, so each read opened the file again
 * and kept the copy (19,000 descriptors after 2 s of fsyncs, up to the
 * limit). */
static void descriptors_stay_few(void) {
    int fd = open(at("synced"), O_CREAT | O_RDWR, 0644);
    CHECK(fd >= 0, "create synced");
    int before = open_descriptors(), ok = 1;
    for (int i = 0; i < 2000 && ok; i++)
        ok = pwrite(fd, "0123456789abcdef", 16, (i % 64) * 16) == 16 && fdatasync(fd) == 0;
    int after = open_descriptors();
    CHECK(ok, "2000 writes, each synced");
    CHECK(before > 0 && after - before <= 2, "descriptors open: %d before, %d after", before, after);
    CHECK(close(fd) == 0 && unlink(at("synced")) == 0, "close and unlink synced");
}

/* Many children on the parent's files at once (each a bridge in the parent
 * when on a mount), then a forked child that does not exec: it must hold
 * none of the parent's bridge ends, or a child reading a file the parent
 * feeds it would not see the end of the file while that one lives. */
static void many_bridges(void) {
    int out = open(at("mb"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = open(at("mb-in"), O_RDWR | O_CREAT | O_TRUNC, 0644);
    CHECK(out >= 0 && in >= 0 && write(in, "x\n", 2) == 2 && lseek(in, 0, SEEK_SET) == 0, "open");
    enum { SLEEPERS = 20 };
    pid_t kids[SLEEPERS + 1];
    fflush(stdout);
    for (int i = 0; i <= SLEEPERS; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            /* The last one reads the file on its standard input (a feeding bridge). */
            if (i < SLEEPERS ? dup2(out, 1) != 1 : dup2(in, 0) != 0) _exit(100 + errno);
            execlp("sleep", "sleep", "60", (char *)NULL);
            _exit(127);
        }
    }
    /* Each child's end of its pipe (its fd 1, the reader's fd 0), once its exec is done. */
    static char links[SLEEPERS + 1][64];
    int pipes = 0;
    for (int i = 0; i <= SLEEPERS; i++) {
        for (int t = 0; t < 1000 && !runs(kids[i], "sleep"); t++) usleep(10000);
        char theirs[64];
        snprintf(theirs, sizeof theirs, "/proc/%d/fd/%d", (int)kids[i], i < SLEEPERS ? 1 : 0);
        ssize_t n = readlink(theirs, links[i], sizeof links[i] - 1);
        links[i][n > 0 ? n : 0] = 0;
        pipes += !strncmp(links[i], "pipe:", 5);
    }
    CHECK(pipes == 0 || pipes == SLEEPERS + 1, "every child's stream is a pipe on a mount, none on the kernel's: %d",
          pipes);
    pid_t child = fork();
    if (child == 0) {
        /* Does this forked child hold any of the pipes the parent's bridges keep? */
        DIR *fds = opendir("/proc/self/fd");
        struct dirent *e;
        int held = 0;
        while (fds && (e = readdir(fds))) {
            char mine[300], target[64];
            snprintf(mine, sizeof mine, "/proc/self/fd/%s", e->d_name);
            ssize_t m = readlink(mine, target, sizeof target - 1);
            target[m > 0 ? m : 0] = 0;
            for (int i = 0; m > 0 && i <= SLEEPERS; i++) held += !strncmp(target, "pipe:", 5) && !strcmp(target, links[i]);
        }
        _exit(held);
    }
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "a forked child holds none of %d bridges' ends: it holds %d", SLEEPERS + 1, WEXITSTATUS(status));
    for (int i = 0; i <= SLEEPERS; i++) kill(kids[i], SIGKILL);
    int reaped = 0;
    for (int i = 0; i <= SLEEPERS; i++) reaped += waitpid(kids[i], &status, 0) == kids[i];
    CHECK(reaped == SLEEPERS + 1, "reaped %d", reaped);
    CHECK(close(out) == 0 && close(in) == 0 && unlink(at("mb")) == 0 && unlink(at("mb-in")) == 0, "clean up");
}

/* A child's output, read from a pipe until it ends (at most 255 bytes). */
static const char *read_all(int fd) {
    static char got[256];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof got - 1 && (r = read(fd, got + n, sizeof got - 1 - n)) > 0) n += (size_t)r;
    got[n] = 0;
    return got;
}

/* Mounted descriptors above 2 across exec: a process that opened the file
 * itself executes a program that uses the descriptor (a shell's `cmd 9< f`),
 * its duplicates sharing one position; a forked child of the holder does
 * (`exec 4> f; sh -c 'echo x >&4'`), after clearing close-on-exec with
 * ioctl as Python's pass_fds does; and a standard stream read through a
 * bridge, then replaced, leaves the file's position after what was read. */
static void descriptors_across_exec(void) {
    int fd = open(at("xa"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && write(fd, "one\ntwo\nthree\n", 14) == 14 && close(fd) == 0, "write");
    int out[2];
    CHECK(pipe(out) == 0, "pipe");
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        int in = open(at("xa"), O_RDONLY);
        char line[4];
        if (in < 0 || read(in, line, 4) != 4 || dup2(in, 9) != 9 || dup2(out[1], 1) != 1) _exit(100 + errno);
        char *cat[] = {"sh", "-c", "cat <&9", NULL};
        execvp(cat[0], cat);
        _exit(127);
    }
    close(out[1]);
    const char *got = read_all(out[0]);
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "a program given descriptor 9 by the process that opened it: %d", WEXITSTATUS(status));
    CHECK(!strcmp(got, "two\nthree\n"), "it read from the position: %s", got);
    close(out[0]);

    fflush(stdout);
    child = fork();
    if (child == 0) {
        int w = open(at("xb"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (w < 0 || write(w, "a\n", 2) != 2 || dup2(w, 8) != 8 || dup2(w, 7) != 7) _exit(100 + errno);
        char *echo[] = {"sh", "-c", "echo b >&8; echo c >&7", NULL};
        execvp(echo[0], echo);
        _exit(127);
    }
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "a program writing descriptors 8 and 7: %d", WEXITSTATUS(status));
    CHECK(!strcmp(contents(at("xb")), "a\nb\nc\n"), "one open file behind both: %s", contents(at("xb")));

    int held = open(at("xc"), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK(held >= 0 && write(held, "first\n", 6) == 6, "open");
    char script[64];
    snprintf(script, sizeof script, "echo from a child >&%d", held);
    fflush(stdout);
    child = fork();
    if (child == 0) {
        if (ioctl(held, FIONCLEX) != 0) _exit(100 + errno);
        char *echo[] = {"sh", "-c", script, NULL};
        execvp(echo[0], echo);
        _exit(127);
    }
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "a forked child's program writing its parent's descriptor %d: %d", held, WEXITSTATUS(status));
    CHECK(write(held, "last\n", 5) == 5 && close(held) == 0, "the parent writes after it");
    CHECK(!strcmp(contents(at("xc")), "first\nfrom a child\nlast\n"), "what both wrote: %s", contents(at("xc")));

    int saved_in = dup(0);
    {
        int in = open(at("xa"), O_RDONLY);
        char line[5] = {0};
        CHECK(in >= 0 && dup2(in, 0) == 0 && read(0, line, 4) == 4 && !strcmp(line, "one\n"), "read standard input");
        CHECK(dup2(saved_in, 0) == 0, "put standard input back");
        CHECK(lseek(in, 0, SEEK_CUR) == 4, "the position is after what was read: %ld", (long)lseek(in, 0, SEEK_CUR));
        CHECK(read(in, line, 4) == 4 && !strcmp(line, "two\n"), "the next read: %s", line);
        close(in);
    }
    close(saved_in);
    CHECK(unlink(at("xa")) == 0 && unlink(at("xb")) == 0 && unlink(at("xc")) == 0, "clean up");
}

/* execvp and posix_spawnp find a program by a bare name in a directory of
 * PATH that is in DIR. */
static void path_search(void) {
    CHECK(mkdir(at("pbin"), 0755) == 0, "mkdir");
    int fd = open(at("pbin/iopath-tool"), O_WRONLY | O_CREAT | O_TRUNC, 0755);
    const char *script = "#!/bin/sh\necho tool $1\n";
    CHECK(fd >= 0 && write(fd, script, strlen(script)) == (ssize_t)strlen(script) && close(fd) == 0, "a script");
    char *old = getenv("PATH"), saved[4096], path[8192];
    snprintf(saved, sizeof saved, "%s", old ? old : "/usr/bin:/bin");
    snprintf(path, sizeof path, "%s:%s:%s", at("none"), at("pbin"), saved);
    setenv("PATH", path, 1);
    int p[2];
    CHECK(pipe(p) == 0, "pipe");
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        dup2(p[1], 1);
        close(p[0]);
        execlp("iopath-tool", "iopath-tool", "ran", (char *)NULL);
        _exit(100 + errno);
    }
    close(p[1]);
    const char *got = read_all(p[0]);
    close(p[0]);
    int status = 0;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
              !strcmp(got, "tool ran\n"),
          "execvp of a program in DIR by its name: %d, '%s'", WEXITSTATUS(status), got);

    CHECK(pipe(p) == 0, "pipe");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    char *argv[] = {"iopath-tool", "spawned", NULL};
    int err = posix_spawnp(&child, "iopath-tool", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(p[1]);
    got = err == 0 ? read_all(p[0]) : "";
    close(p[0]);
    CHECK(err == 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
              !strcmp(got, "tool spawned\n"),
          "posix_spawnp of it: %d, '%s'", err, got);

    child = fork();
    if (child == 0) {
        execlp("iopath-no-such-tool", "iopath-no-such-tool", (char *)NULL);
        _exit(errno == ENOENT ? 0 : 100 + errno);
    }
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "execvp of a name nowhere: ENOENT: %d", WEXITSTATUS(status));
    setenv("PATH", saved, 1);
    CHECK(unlink(at("pbin/iopath-tool")) == 0 && rmdir(at("pbin")) == 0, "clean up");
}

extern char **environ;

/* posix_spawn of `argv` with `actions`; the child's exit status, or -1000 - the spawn's error. */
static int spawn_and_wait(posix_spawn_file_actions_t *actions, char *const argv[]) {
    pid_t child;
    int err = posix_spawnp(&child, argv[0], actions, NULL, argv, environ);
    if (err != 0) return -1000 - err;
    int status = 0;
    return waitpid(child, &status, 0) == child && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* posix_spawn's file actions on files in DIR: the C library's child carries
 * them out with system calls of its own, before the new program runs. */
static void spawned(void) {
    posix_spawn_file_actions_t fa;
    char *echo_dup2[] = {"echo", "dup2 of an open file", NULL};
    int fd = open(at("sp"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0 && write(fd, "first\n", 6) == 6, "open");
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, 1);
    int status = spawn_and_wait(&fa, echo_dup2);
    posix_spawn_file_actions_destroy(&fa);
    CHECK(status == 0, "a child with an open file as its output (dup2 action): %d", status);
    CHECK(lseek(fd, 0, SEEK_CUR) == 27, "the child moved the shared position: %ld", (long)lseek(fd, 0, SEEK_CUR));
    CHECK(write(fd, "last\n", 5) == 5 && close(fd) == 0, "the parent writes after it");
    CHECK(!strcmp(contents(at("sp")), "first\ndup2 of an open file\nlast\n"), "what both wrote: %s", contents(at("sp")));

    /* A spawned child that reads part of its parent's open file: the
     * parent reads on after it (the bridge had fed it the whole file). */
    char *head[] = {"head", "-c", "6", NULL};
    int in = open(at("sp"), O_RDONLY);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    status = spawn_and_wait(&fa, head);
    posix_spawn_file_actions_destroy(&fa);
    char rest[64] = {0};
    CHECK(status == 0 && read(in, rest, sizeof rest - 1) == 26 && !strcmp(rest, "dup2 of an open file\nlast\n"),
          "the parent reads on where the spawned child stopped: %d, '%s'", status, rest);
    CHECK(close(in) == 0, "close");

    char *echo_open[] = {"echo", "opened by the action", NULL};
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, at("sp2"), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    status = spawn_and_wait(&fa, echo_open);
    posix_spawn_file_actions_destroy(&fa);
    struct stat st;
    CHECK(status == 0 && stat(at("sp2"), &st) == 0 && (st.st_mode & 0777) == 0600, "an open action makes a file: %d",
          status);
    CHECK(!strcmp(contents(at("sp2")), "opened by the action\n"), "its contents: %s", contents(at("sp2")));

    char *cat[] = {"cat", NULL};
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, at("sp2"), O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, at("sp3"), O_WRONLY | O_CREAT | O_APPEND, 0644);
    status = spawn_and_wait(&fa, cat);
    status += spawn_and_wait(&fa, cat);
    posix_spawn_file_actions_destroy(&fa);
    CHECK(status == 0, "a child reading one file and appending to another, twice: %d", status);
    CHECK(!strcmp(contents(at("sp3")), "opened by the action\nopened by the action\n"), "what cat copied: %s",
          contents(at("sp3")));

    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, at("sp3"), O_WRONLY | O_CREAT | O_EXCL, 0644);
    status = spawn_and_wait(&fa, echo_open);
    posix_spawn_file_actions_destroy(&fa);
    CHECK(status == -1000 - EEXIST, "O_EXCL on a file there: the spawn fails with EEXIST: %d", status);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, at("none/such"), O_RDONLY, 0);
    status = spawn_and_wait(&fa, cat);
    posix_spawn_file_actions_destroy(&fa);
    CHECK(status == -1000 - ENOENT, "a missing file: ENOENT: %d", status);

    /* A chdir action into DIR; the child looks there by a relative path. */
    CHECK(mkdir(at("spd"), 0755) == 0 && close(open(at("spd/here"), O_CREAT | O_WRONLY, 0644)) == 0, "mkdir");
    char want[4200], script[4400];
    snprintf(want, sizeof want, "%s/spd", dir);
    snprintf(script, sizeof script, "test \"$(pwd)\" = '%s' && test -f here", want);
    char *sh[] = {"sh", "-c", script, NULL};
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addchdir_np(&fa, at("spd"));
    status = spawn_and_wait(&fa, sh);
    posix_spawn_file_actions_destroy(&fa);
    CHECK(status == 0, "a child started in a directory of DIR (chdir action): %d", status);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addchdir_np(&fa, at("spd/here"));
    status = spawn_and_wait(&fa, sh);
    posix_spawn_file_actions_destroy(&fa);
    CHECK(status == -1000 - ENOTDIR, "chdir action onto a file: ENOTDIR: %d", status);
    /* And out of DIR, from a working directory in it. */
    char old[4096];
    CHECK(getcwd(old, sizeof old) != NULL && chdir(at("spd")) == 0, "chdir into DIR");
    char *sh_tmp[] = {"sh", "-c", "test \"$(pwd)\" = /tmp", NULL};
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addchdir_np(&fa, "/tmp");
    status = spawn_and_wait(&fa, sh_tmp);
    posix_spawn_file_actions_destroy(&fa);
    CHECK(status == 0, "a child started out of DIR from a working directory in it: %d", status);
    CHECK(chdir(old) == 0, "back out");
    CHECK(unlink(at("sp")) == 0 && unlink(at("sp2")) == 0 && unlink(at("sp3")) == 0 && unlink(at("spd/here")) == 0 &&
              rmdir(at("spd")) == 0,
          "clean up");
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DIR kernel|iopath\n", argv[0]);
        return 2;
    }
    snprintf(dir, sizeof dir, "%s", argv[1]);
    iopath_mode = !strcmp(argv[2], "iopath");
    umask(022);
    files();
    directories();
    renames();
    locks();
    forked();
    relative();
    stdio_and_metadata();
    working_directory();
    copies();
    symlinks();
    hard_links();
    other_nodes();
    library_walkers();
    kernel_links();
    standard_streams();
    spawned();
    forked_streams();
    descriptors_across_exec();
    many_bridges();
    descriptors_stay_few();
    path_search();
    signals();
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
