/* Signal handlers that write to the mount while threads write there too (run
 * on a mount by preload/tests/mount.rs). THREADS writer threads append
 * RECORD-byte records to files of their own (DIR/wN) until told to stop;
 * the main thread, which blocks every signal it sends, sends SIGNALS
 * signals to the process, so they land on the writers, most often in the
 * middle of a write: SIGCHLD and SIGWINCH with plain handlers, and
 * SIGRTMIN+1 with an SA_SIGINFO handler through sigqueue(), with a value.
 * Each handler appends one byte (its signal's letter) to DIR/handled with
 * write(2) on a descriptor opened before; the SA_SIGINFO one first checks
 * that the siginfo is the sender's (si_code SI_QUEUE, si_pid this process,
 * si_value the number sent) and counts a mismatch. The main thread waits
 * until every signal was handled (sigqueue's queue never drops one; the
 * other two are sent one at a time, the next after the last was handled),
 * stops the writers and checks: every handler ran once per signal, every
 * siginfo was the sender's, DIR/handled holds one byte per signal, every
 * writer's file whole records in order. A handler that ran in the middle
 * of the library's write would wait for the lock that write holds: the
 * program hangs (the test's timeout ends it).
 * Usage: handlers_on_mount DIR */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK_CONTEXT() ((void)0)
#include "check.h"

#define THREADS 4
#define RECORD 4096
#define SIGNALS 300

static int handled_fd;
static atomic_int handled[3], wrong_info, stop;
static atomic_ulong written[THREADS];

static void append(char letter) {
    if (write(handled_fd, &letter, 1) != 1) {
        atomic_fetch_add(&wrong_info, 1000000);
    }
}

static void on_child(int sig) {
    (void)sig;
    append('c');
    atomic_fetch_add(&handled[0], 1);
}

static void on_winch(int sig) {
    (void)sig;
    append('w');
    atomic_fetch_add(&handled[1], 1);
}

static void on_queued(int sig, siginfo_t *info, void *context) {
    (void)context;
    int expected = atomic_load(&handled[2]);
    if (sig != SIGRTMIN + 1 || info->si_code != SI_QUEUE || info->si_pid != getpid() ||
        info->si_value.sival_int != expected) {
        atomic_fetch_add(&wrong_info, 1);
    }
    append('q');
    atomic_fetch_add(&handled[2], 1);
}

/* Blocks or unblocks (how) the signals main sends, on the calling thread. */
static void mask_sent(int how) {
    sigset_t sent;
    sigemptyset(&sent);
    sigaddset(&sent, SIGCHLD);
    sigaddset(&sent, SIGWINCH);
    sigaddset(&sent, SIGRTMIN + 1);
    pthread_sigmask(how, &sent, NULL);
}

static void *writer(void *arg) {
    long n = (long)arg;
    char path[4096];
    snprintf(path, sizeof path, "%s/w%ld", getenv("D"), n);
    int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) {
        perror("open");
        exit(1);
    }
    mask_sent(SIG_UNBLOCK);
    static _Thread_local char record[RECORD];
    for (unsigned long i = 0; !atomic_load(&stop); i++) {
        memset(record, 'a' + (int)(i % 26), sizeof record);
        memcpy(record, &i, sizeof i);
        if (write(fd, record, sizeof record) != (ssize_t)sizeof record) {
            perror("write");
            exit(1);
        }
        atomic_store(&written[n], i + 1);
        if (i % 64 == 63 && ftruncate(fd, 0) == 0) {
            lseek(fd, 0, SEEK_SET);
            i = (unsigned long)-1;
        }
    }
    close(fd);
    return NULL;
}

static void install(int sig, void (*plain)(int), void (*full)(int, siginfo_t *, void *)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    if (full) {
        sa.sa_sigaction = full;
        sa.sa_flags = SA_SIGINFO | SA_RESTART;
    } else {
        sa.sa_handler = plain;
        sa.sa_flags = SA_RESTART;
    }
    if (sigaction(sig, &sa, NULL) != 0) {
        perror("sigaction");
        exit(1);
    }
}

/* Waits until handled[i] reaches want (at most 20 s). */
static void wait_handled(int i, int want) {
    for (int spins = 0; atomic_load(&handled[i]) < want && spins < 2000000; spins++) {
        struct timespec pause = {0, 10000};
        nanosleep(&pause, NULL);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: handlers_on_mount DIR\n");
        return 2;
    }
    setenv("D", argv[1], 1);
    char path[4096];
    snprintf(path, sizeof path, "%s/handled", argv[1]);
    handled_fd = open(path, O_CREAT | O_TRUNC | O_WRONLY | O_APPEND, 0644);
    if (handled_fd < 0) {
        perror("open handled");
        return 1;
    }
    install(SIGCHLD, on_child, NULL);
    install(SIGWINCH, on_winch, NULL);
    install(SIGRTMIN + 1, NULL, on_queued);
    mask_sent(SIG_BLOCK);
    pthread_t threads[THREADS];
    for (long n = 0; n < THREADS; n++) {
        pthread_create(&threads[n], NULL, writer, (void *)n);
    }
    for (int n = 0; n < THREADS; n++) {
        while (atomic_load(&written[n]) < 8) {
            usleep(100);
        }
    }
    for (int s = 0; s < SIGNALS; s++) {
        switch (s % 3) {
        case 0:
            kill(getpid(), SIGCHLD);
            wait_handled(0, s / 3 + 1);
            break;
        case 1:
            kill(getpid(), SIGWINCH);
            wait_handled(1, s / 3 + 1);
            break;
        default: {
            union sigval value = {.sival_int = s / 3};
            if (sigqueue(getpid(), SIGRTMIN + 1, value) != 0) {
                perror("sigqueue");
                return 1;
            }
            wait_handled(2, s / 3 + 1);
        }
        }
    }
    atomic_store(&stop, 1);
    for (int n = 0; n < THREADS; n++) {
        pthread_join(threads[n], NULL);
    }
    for (int i = 0; i < 3; i++) {
        CHECK(atomic_load(&handled[i]) == SIGNALS / 3, "handler %d ran %d times", i, atomic_load(&handled[i]));
    }
    CHECK(atomic_load(&wrong_info) == 0, "%d wrong siginfo or failed writes", atomic_load(&wrong_info));
    close(handled_fd);
    int fd = open(path, O_RDONLY);
    static char bytes[SIGNALS + 1];
    ssize_t got = fd < 0 ? -1 : read(fd, bytes, sizeof bytes);
    CHECK(got == SIGNALS, "DIR/handled holds %zd bytes", got);
    for (int n = 0; n < THREADS; n++) {
        snprintf(path, sizeof path, "%s/w%d", argv[1], n);
        fd = open(path, O_RDONLY);
        static char record[RECORD];
        unsigned long i = 0;
        int bad = 0;
        while (fd >= 0 && read(fd, record, sizeof record) == (ssize_t)sizeof record) {
            unsigned long number;
            memcpy(&number, record, sizeof number);
            bad += number != i || record[RECORD - 1] != 'a' + (int)(i % 26);
            i++;
        }
        CHECK(fd >= 0 && bad == 0, "w%d: %d wrong records of %lu", n, bad, i);
        close(fd);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
