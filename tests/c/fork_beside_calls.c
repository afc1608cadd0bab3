/* A program whose two threads call on a mount without pause (open,
 * write, dup, close, directory streams, stdio streams, stat, dlopen of a
 * file that is no library, which the interposer copies first, and fsync
 * of a pipe, which looks in the table of standard streams on mounted files:
 * the program's standard input is one) while its main thread forks: every
 * child makes the same calls once, puts a mounted file on its own standard
 * input, reads it there, and exits. A
 * lock of the interposer held by a worker at the instant of a fork stays
 * held for ever in the child, whose own call then waits for it: each
 * child has an alarm, and one it kills counts as a failure. Run on a mount
 * by preload/tests/mount.rs. Prints "N passed, M failed". */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK_CONTEXT() ((void)0)
#include "check.h"

static const char *dir;
static atomic_int stop;
/* A pipe: an fsync of it fails (EINVAL) after the interposer has looked
 * whether it is one of its standard streams on a mounted file. */
static int pipe_fds[2];
/* What a standard input on a mounted file holds. */
#define INPUT "input on the mount\n"

/* Puts the mounted file `name` (created holding INPUT) on descriptor 0:
 * what the reopening returned (0 if it worked), or -1 (errno says why). */
static int input_from(const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, INPUT, strlen(INPUT)) != (ssize_t)strlen(INPUT) || close(fd) != 0) return -1;
    errno = 0;
    if (close(0) != 0) return -1;
    return open(path, O_RDONLY);
}
/* A worker's first COPIES rounds copy its library, of LIBRARY bytes (each
 * copy stays open, and in memory, until 5 s after the next one); a child's
 * is a page. */
#define COPIES 200
#define LIBRARY (128 << 10)

/* Fails the round at step `n` if `cond` does not hold. */
#define STEP(n, cond)                                          \
    do {                                                       \
        if (!(cond)) {                                         \
            fprintf(stderr, "%s: step %d (%s): %s\n", who, n, \
                    #cond, strerror(errno));                   \
            return n;                                          \
        }                                                      \
    } while (0)

/* One round of every kind of call, on files named after `who`: 0 if each
 * did what it should, else the number of the first step that did not. */
static int calls(const char *who, size_t library_bytes) {
    char path[4096], library[4096];
    snprintf(path, sizeof path, "%s/%s", dir, who);
    snprintf(library, sizeof library, "%s/%s.so", dir, who);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    STEP(1, fd >= 0);
    STEP(2, write(fd, who, strlen(who)) == (ssize_t)strlen(who));
    int copy = dup(fd);
    STEP(3, copy >= 0 && close(copy) == 0);
    STEP(4, close(fd) == 0);
    DIR *d = opendir(dir);
    STEP(5, d != NULL);
    while (readdir(d) != NULL) {
    }
    STEP(6, closedir(d) == 0);
    FILE *f = fopen(path, "a");
    STEP(7, f != NULL);
    STEP(8, fprintf(f, "+") == 1 && fclose(f) == 0);
    struct stat st;
    STEP(9, stat(path, &st) == 0 && st.st_size == (off_t)strlen(who) + 1);
    /* Not a library: the loader refuses the copy made of it, a new one
     * each time the file changed (each stays open: a few hundred only). */
    if (library_bytes > 0) {
        static char junk[LIBRARY];
        int lib = open(library, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        STEP(10, lib >= 0 && write(lib, junk, library_bytes) == (ssize_t)library_bytes && close(lib) == 0);
        STEP(11, dlopen(library, RTLD_NOW) == NULL);
    }
    for (int i = 0; i < 50; i++) STEP(12, fsync(pipe_fds[0]) == -1 && errno == EINVAL);
    return 0;
}

static void *worker(void *arg) {
    char who[32];
    snprintf(who, sizeof who, "worker-%d", (int)(long)arg);
    for (int round = 0; !atomic_load(&stop); round++) {
        if (calls(who, round < COPIES ? LIBRARY : 0) != 0) {
            failed++;
            return NULL;
        }
        usleep(100); /* (one that never pauses keeps the mount from every child) */
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fork_beside_calls DIR FORKS\n");
        return 2;
    }
    dir = argv[1];
    int forks = atoi(argv[2]);
    CHECK(pipe(pipe_fds) == 0 && input_from("parent-input") == 0, "standard input on the mount: %s",
          strerror(errno));
    pthread_t threads[2];
    for (long t = 0; t < 2; t++) pthread_create(&threads[t], NULL, worker, (void *)t);
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(20);
            char who[32];
            snprintf(who, sizeof who, "child-%d", i);
            int step = calls(who, 4096);
            char name[64], got[64] = {0};
            snprintf(name, sizeof name, "%s-input", who);
            if (step == 0) {
                int from = input_from(name);
                int from_errno = errno;
                ssize_t n = from == 0 ? read(0, got, sizeof got - 1) : -2;
                if (n != (ssize_t)strlen(INPUT) || strcmp(got, INPUT) != 0) {
                    fprintf(stderr, "%s: step 13: input_from %d (%s), read %zd (%s), got \"%s\"\n", who, from,
                            strerror(from_errno), n, strerror(errno), got);
                    step = 13;
                }
            }
            char path[4096], library[4096];
            snprintf(path, sizeof path, "%s/%s", dir, who);
            snprintf(library, sizeof library, "%s/%s.so", dir, who);
            snprintf(path, sizeof path, "%s/%s-input", dir, who);
            if (step == 0 && unlink(path) != 0) step = 14;
            snprintf(path, sizeof path, "%s/%s", dir, who);
            _exit(step != 0 ? step : unlink(path) != 0 || unlink(library) != 0 ? 12 : 0);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork %d: %s", i, strerror(errno));
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: %s %d", i,
              WIFSIGNALED(status) ? "killed by signal (hung: 14 is its alarm)" : "failed at step",
              WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    }
    atomic_store(&stop, 1);
    for (int t = 0; t < 2; t++) pthread_join(threads[t], NULL);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
