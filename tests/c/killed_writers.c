/* Writer threads killed by a signal the program leaves at its default
 * action (run on a mount by preload/tests/mount.rs): each of THREADS
 * threads appends RECORD-byte records to a file of its own, DIR/wN (record
 * i: its number, then the byte 'a' + i % 26); once every thread has
 * written MIN_RECORDS, the main thread, which blocks the signal, sends it
 * to the process, so it lands on a writer, most often in the middle of a
 * write. The test then finds whole records only, at least MIN_RECORDS per
 * file (at most MAX_RECORDS): what the threads wrote is in the files, as
 * on a kernel file system, and DIR/note holds "hello".
 * Exits 2 if the program does not see SIG_DFL for the signal (the library's
 * stand-in handler must not show). With `reraise`, a handler set with
 * signal() sets SIG_DFL back and raises the signal again, as programs that
 * clean up before they die do (git's). With `exit`, a handler set with
 * sigaction() ends the process with _exit(3), as rsync's does, after
 * saying on stderr how many records each thread had written: the test
 * finds at least those (the handler runs at the end of the write it
 * interrupted, and the exit commits them all). Usage: killed_writers DIR SIGNAL [reraise|exit] */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define THREADS 4
#define RECORD 4096
#define MIN_RECORDS 20
#define MAX_RECORDS 2000

static const char *dir;

static void reraise(int sig) {
    signal(sig, SIG_DFL);
    raise(sig);
}

static atomic_ulong written[THREADS];

/* Says on stderr how many records each thread had written (its write calls
 * that returned), then ends the process: only async-signal-safe calls. */
static void exit_3(int sig) {
    (void)sig;
    char line[THREADS * 24], *p = line;
    for (int n = 0; n < THREADS; n++) {
        char digits[24];
        int k = 0;
        unsigned long v = atomic_load(&written[n]);
        do {
            digits[k++] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        while (k) {
            *p++ = digits[--k];
        }
        *p++ = n + 1 < THREADS ? ' ' : '\n';
    }
    ssize_t ignored = write(2, line, (size_t)(p - line));
    (void)ignored;
    _exit(3);
}
static atomic_int ready;

static void *writer(void *arg) {
    long n = (long)arg;
    char path[4096];
    snprintf(path, sizeof path, "%s/w%ld", dir, n);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) {
        perror("open");
        exit(1);
    }
    static _Thread_local char record[RECORD];
    for (unsigned long i = 0;; i++) {
        memset(record, 'a' + (int)(i % 26), sizeof record);
        memcpy(record, &i, sizeof i);
        if (write(fd, record, sizeof record) != (ssize_t)sizeof record) {
            perror("write");
            exit(1);
        }
        atomic_store(&written[n], i + 1);
        if (i + 1 == MIN_RECORDS) {
            atomic_fetch_add(&ready, 1);
        }
        if (i + 1 == MAX_RECORDS) {
            for (;;) {
                pause(); /* (a device of the test's size holds this much) */
            }
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int reraising = argc == 4 && strcmp(argv[3], "reraise") == 0;
    int exiting = argc == 4 && strcmp(argv[3], "exit") == 0;
    if (argc != 3 && !reraising && !exiting) {
        fprintf(stderr, "usage: killed_writers DIR SIGNAL [reraise|exit]\n");
        return 1;
    }
    dir = argv[1];
    int sig = atoi(argv[2]);
    struct sigaction seen;
    if (sigaction(sig, NULL, &seen) != 0 || seen.sa_handler != SIG_DFL) {
        fprintf(stderr, "signal %d does not read as SIG_DFL\n", sig);
        return 2;
    }
    if (reraising && (signal(sig, reraise) != SIG_DFL || signal(sig, reraise) != reraise)) {
        fprintf(stderr, "signal() of %d does not give back SIG_DFL, then its own handler\n", sig);
        return 2;
    }
    if (exiting) {
        struct sigaction exit_action = {.sa_handler = exit_3, .sa_flags = SA_RESETHAND};
        sigemptyset(&exit_action.sa_mask);
        if (sigaction(sig, &exit_action, NULL) != 0 || sigaction(sig, NULL, &seen) != 0 ||
            seen.sa_handler != exit_3 || !(seen.sa_flags & SA_RESETHAND) || (seen.sa_flags & SA_SIGINFO)) {
            fprintf(stderr, "sigaction() of %d does not give back the handler and flags it was given\n", sig);
            return 2;
        }
    }
    /* A few bytes that only the end's commit writes (too few to be written back before). */
    char note[4096];
    snprintf(note, sizeof note, "%s/note", dir);
    int fd = open(note, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0 || write(fd, "hello", 5) != 5 || close(fd) != 0) {
        perror("note");
        return 1;
    }
    pthread_t threads[THREADS];
    for (long n = 0; n < THREADS; n++) {
        if (pthread_create(&threads[n], NULL, writer, (void *)n) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    while (atomic_load(&ready) < THREADS) {
        usleep(1000);
    }
    kill(getpid(), sig);
    for (;;) {
        pause();
    }
}
