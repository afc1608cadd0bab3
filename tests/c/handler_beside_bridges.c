/* A program whose signal handler duplicates and closes its standard output
 * (dup and close are async-signal-safe) while its main loop does the same,
 * with stdout on a mounted file (a bridge): run on a mount by
 * preload/tests/mount.rs. The handler must not run while the call it
 * interrupted holds the bridges' table: it waited for that table for ever.
 * With `exit`, the handler ends the program with _exit(3) at its 500th run
 * (the hang first seen: the exit's commit waited for the table). Otherwise
 * the program runs 3000 handlers (or 5 s), prints "ok N" and exits 0. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t handled;
static int exit_at;

static void on_alarm(int sig) {
    (void)sig;
    int d = dup(1);
    if (d >= 0)
        close(d);
    handled++;
    if (exit_at && handled == exit_at)
        _exit(3);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "exit") != 0)) {
        fprintf(stderr, "usage: handler_beside_bridges [exit]\n");
        return 2;
    }
    exit_at = argc == 2 ? 500 : 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 100}, {0, 100}};
    setitimer(ITIMER_REAL, &every, NULL);
    double start = now();
    while (handled < 3000 && now() - start < 5) {
        int d = dup(1);
        if (d < 0 || close(d) != 0) {
            perror("dup or close of stdout");
            return 1;
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("ok %d\n", (int)handled);
    return handled > 0 ? 0 : 1;
}
