/*
 * preload_test.c: the semantics a program sees must be the kernel's, with or
 * without libiopath_preload.so. Run by tests/preload.rs twice: as it is (the
 * kernel's answers) and under LD_PRELOAD with IOPATH_FILES matching the
 * scratch directory, for several iopath paths. Every check is an absolute
 * expectation, so both runs must pass.
 *
 * Usage: preload_test DIR. Prints "N passed, M failed"; exits non-zero on failure.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK_CONTEXT() fprintf(stderr, " (errno %d %s)", errno, strerror(errno))
#include "check.h"

#define BS 4096
#define SIZE (1 << 20)

static unsigned char *block(void) {
    void *p;
    if (posix_memalign(&p, BS, 4 * BS)) abort();
    return p;
}
/* Block b of the file holds byte (b * 13 + 5) everywhere, its number first. */
static void fill(unsigned char *p, uint64_t b) {
    memset(p, (int)(b * 13 + 5), BS);
    memcpy(p, &b, sizeof b);
}
static int holds(const unsigned char *p, uint64_t b) {
    uint64_t got;
    memcpy(&got, p, sizeof got);
    if (got != b) return 0;
    for (int i = sizeof b; i < BS; i++)
        if (p[i] != (unsigned char)(b * 13 + 5)) return 0;
    return 1;
}

static void basic(int fd) {
    unsigned char *p = block();
    for (uint64_t b = 0; b < SIZE / BS; b++) {
        fill(p, b);
        if (pwrite(fd, p, BS, b * BS) != BS) {
            CHECK(0, "pwrite block %llu", (unsigned long long)b);
            break;
        }
    }
    int bad = 0;
    for (uint64_t b = 0; b < SIZE / BS; b++) {
        memset(p, 0, BS);
        bad += pread(fd, p, BS, b * BS) != BS || !holds(p, b);
    }
    CHECK(bad == 0, "%d blocks read back wrong", bad);
    /* Short read at the end of the file, and nothing past it. */
    CHECK(pread(fd, p, 2 * BS, SIZE - BS) == BS, "short read at EOF");
    CHECK(holds(p, SIZE / BS - 1), "its data");
    CHECK(pread(fd, p, BS, SIZE) == 0, "read at EOF returns 0");
    CHECK(pread64(fd, p, BS, 5 * BS) == BS && holds(p, 5), "pread64");
    fill(p, 6);
    CHECK(pwrite64(fd, p, BS, 6 * BS) == BS, "pwrite64");
    /* Misaligned requests: the kernel's answer (EINVAL on O_DIRECT). */
    errno = 0;
    CHECK(pread(fd, p + 1, BS, 0) == -1 && errno == EINVAL, "misaligned buffer");
    errno = 0;
    CHECK(pread(fd, p, 100, 0) == -1 && errno == EINVAL, "misaligned length");
    errno = 0;
    CHECK(pread(fd, p, BS, -BS) == -1 && errno == EINVAL, "negative offset");
    CHECK(pread(fd, p, 0, 0) == 0, "zero length");
    CHECK(fsync(fd) == 0, "fsync");
    CHECK(fdatasync(fd) == 0, "fdatasync");
    free(p);
}

static void position(int fd) {
    unsigned char *p = block();
    CHECK(lseek(fd, 8 * BS, SEEK_SET) == 8 * BS, "lseek");
    CHECK(read(fd, p, BS) == BS && holds(p, 8), "read at the position");
    CHECK(lseek(fd, 0, SEEK_CUR) == 9 * BS, "read moved the position");
    int d = dup(fd);
    CHECK(d >= 0, "dup");
    CHECK(read(d, p, BS) == BS && holds(p, 9), "the duplicate shares the position");
    CHECK(lseek(fd, 0, SEEK_CUR) == 10 * BS, "and moves it for both");
    fill(p, 10);
    CHECK(write(fd, p, BS) == BS, "write at the position");
    CHECK(lseek(d, 0, SEEK_CUR) == 11 * BS, "write moved the position");
    /* preadv2 with offset -1 reads at the position too. */
    struct iovec v[2] = {{p, BS}, {p + BS, BS}};
    CHECK(preadv2(d, v, 2, -1, 0) == 2 * BS && holds(p, 11) && holds(p + BS, 12), "preadv2 at the position");
    CHECK(lseek(fd, 0, SEEK_CUR) == 13 * BS, "preadv2 moved it");
    /* Reading at the end of the file by position. */
    CHECK(lseek(fd, SIZE - BS, SEEK_SET) == SIZE - BS, "lseek near EOF");
    CHECK(read(fd, p, 2 * BS) == BS, "short read() at EOF");
    CHECK(read(fd, p, BS) == 0, "read() at EOF");
    /* dup2 onto another descriptor, then close the original. */
    int other = open("/dev/null", O_RDONLY);
    CHECK(dup2(d, other) == other, "dup2");
    close(d);
    CHECK(pread(other, p, BS, 3 * BS) == BS && holds(p, 3), "the dup2 copy works after the original closed");
    close(other);
    errno = 0;
    CHECK(pread(other, p, BS, 0) == -1 && errno == EBADF, "a closed descriptor gives EBADF");
    free(p);
}

static void vectored(int fd) {
    unsigned char *p = block();
    fill(p, 20);
    fill(p + BS, 21);
    struct iovec v[2] = {{p, BS}, {p + BS, BS}};
    CHECK(pwritev(fd, v, 2, 20 * BS) == 2 * BS, "pwritev");
    memset(p, 0, 2 * BS);
    CHECK(preadv(fd, v, 2, 20 * BS) == 2 * BS && holds(p, 20) && holds(p + BS, 21), "preadv");
    memset(p, 0, 2 * BS);
    CHECK(preadv64(fd, v, 2, 20 * BS) == 2 * BS && holds(p, 20), "preadv64");
    CHECK(pwritev2(fd, v, 2, 20 * BS, RWF_DSYNC) == 2 * BS, "pwritev2 with RWF_DSYNC");
    CHECK(preadv2(fd, v, 2, 20 * BS, 0) == 2 * BS && holds(p + BS, 21), "preadv2");
    struct iovec odd[2] = {{p, BS}, {p + BS + 1, BS}};
    errno = 0;
    CHECK(preadv(fd, odd, 2, 0) == -1 && errno == EINVAL, "a misaligned piece");
    free(p);
}

struct job { int fd, id, bad; };
static void *hammer(void *arg) {
    struct job *j = arg;
    unsigned char *p = block();
    for (int round = 0; round < 50; round++)
        for (uint64_t b = 64 + j->id; b < 256; b += 8) {
            fill(p, b);
            j->bad += pwrite(j->fd, p, BS, b * BS) != BS;
            memset(p, 0, BS);
            j->bad += pread(j->fd, p, BS, b * BS) != BS || !holds(p, b);
        }
    free(p);
    return NULL;
}

static void threads(int fd) {
    pthread_t t[8];
    struct job j[8];
    for (int i = 0; i < 8; i++) {
        j[i] = (struct job){fd, i, 0};
        pthread_create(&t[i], NULL, hammer, &j[i]);
    }
    int bad = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        bad += j[i].bad;
    }
    CHECK(bad == 0, "%d bad I/Os from 8 threads", bad);
}

static void forked(int fd) {
    pid_t pid = fork();
    if (pid == 0) {
        unsigned char *p = block();
        int ok = pread(fd, p, BS, 7 * BS) == BS && holds(p, 7);
        fill(p, 30);
        ok = ok && pwrite(fd, p, BS, 30 * BS) == BS;
        _exit(ok ? 0 : 1);
    }
    int status = -1;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child after fork reads and writes");
    unsigned char *p = block();
    CHECK(pread(fd, p, BS, 30 * BS) == BS && holds(p, 30), "the parent sees the child's write");
    free(p);
}

static void growth(int fd) {
    unsigned char *p = block();
    fill(p, SIZE / BS);
    CHECK(pwrite(fd, p, BS, SIZE) == BS, "a write past the end extends the file");
    memset(p, 0, BS);
    CHECK(pread(fd, p, BS, SIZE) == BS && holds(p, SIZE / BS), "and reads back");
    CHECK(ftruncate(fd, SIZE) == 0, "ftruncate back");
    CHECK(pread(fd, p, BS, SIZE) == 0, "nothing past the end after truncating");
    free(p);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: preload_test DIR\n");
        return 2;
    }
    char path[4096], other[4096];
    snprintf(path, sizeof path, "%s/data.img", argv[1]);
    snprintf(other, sizeof other, "%s/buffered.img", argv[1]);
    int fd = open64(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
    CHECK(fd >= 0, "open64 %s", path);
    if (fd < 0) return 1;
    CHECK(ftruncate(fd, SIZE) == 0, "ftruncate");
    basic(fd);
    position(fd);
    vectored(fd);
    threads(fd);
    forked(fd);
    growth(fd);
    close(fd);

    /* Opened behind the library's back (as before it was loaded): still right. */
    int raw = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDWR | O_DIRECT);
    unsigned char *p = block();
    CHECK(raw >= 0 && pread(raw, p, BS, 9 * BS) == BS && holds(p, 9), "a descriptor opened with a raw system call");
    close(raw);
    /* Read-only descriptor: writes fail as the kernel says. */
    int ro = open(path, O_RDONLY | O_DIRECT);
    CHECK(pread(ro, p, BS, 4 * BS) == BS && holds(p, 4), "read-only descriptor reads");
    errno = 0;
    CHECK(pwrite(ro, p, BS, 0) == -1 && errno == EBADF, "and refuses writes with EBADF");
    close(ro);
    /* O_APPEND writes append. */
    int ap = open(path, O_WRONLY | O_APPEND | O_DIRECT);
    fill(p, SIZE / BS);
    CHECK(write(ap, p, BS) == BS, "append");
    CHECK(lseek(ap, 0, SEEK_CUR) == SIZE + BS, "at the end");
    close(ap);
    /* Without O_DIRECT nothing is routed, and it still works. */
    int buffered = open(other, O_RDWR | O_CREAT | O_TRUNC, 0644);
    CHECK(write(buffered, "hello", 5) == 5, "buffered write");
    CHECK(pread(buffered, p, 5, 0) == 5 && memcmp(p, "hello", 5) == 0, "buffered read");
    close(buffered);
    free(p);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
