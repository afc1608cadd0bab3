/* A program's calls that make descriptors (pipe, socket, eventfd, epoll,
 * memfd, timerfd, signalfd, inotify, accept) take the lowest free numbers,
 * while another of its threads keeps putting its stdout on a mounted file
 * and back (each time the interposer makes a bridge's pipe, whose end sits
 * on the lowest free number for a moment before it moves up): run on a
 * mount by preload/tests/mount.rs. Prints "N passed, M failed". */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static atomic_int stop;
static const char *dir;
static int passed, failed;

static void check(int ok, const char *what, int got, int want) {
    if (ok) {
        passed++;
    } else {
        failed++;
        printf("FAIL %s: got %d, want %d\n", what, got, want);
    }
}

/* The mounted file, and the program's stdout, kept above the numbers looked at. */
static int file = -1, saved = -1;

/* Puts stdout on the mounted file and back, again and again. */
static void *redirector(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        dup2(file, 1);
        dup2(saved, 1);
    }
    return NULL;
}

static int listener = -1;
static struct sockaddr_un address;

static int one_socket(void) { return socket(AF_UNIX, SOCK_STREAM, 0); }
static int one_eventfd(void) { return eventfd(0, 0); }
static int one_epoll(void) { return epoll_create1(0); }
static int one_memfd(void) { return memfd_create("lowest", 0); }
static int one_timerfd(void) { return timerfd_create(CLOCK_MONOTONIC, 0); }
static int one_inotify(void) { return inotify_init1(0); }
static int one_signalfd(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR2);
    return signalfd(-1, &set, 0);
}
/* The accepted end of a connection made to the listener (the connecting
 * end is put above the numbers looked at). */
static int one_accept(void) {
    int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int high = fcntl(c, F_DUPFD_CLOEXEC, 200);
    close(c);
    if (high < 0 || connect(high, (struct sockaddr *)&address, sizeof address) != 0)
        return -1;
    int fd = accept4(listener, NULL, NULL, 0);
    close(high);
    return fd;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: lowest_numbers DIR\n");
        return 2;
    }
    dir = argv[1];
    setvbuf(stdout, NULL, _IONBF, 0);
    memset(&address, 0, sizeof address);
    address.sun_family = AF_UNIX;
    snprintf(address.sun_path, sizeof address.sun_path, "/tmp/lowest-%d", (int)getpid());
    unlink(address.sun_path);
    int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    listener = fcntl(l, F_DUPFD_CLOEXEC, 300);
    close(l);
    if (listener < 0 || bind(listener, (struct sockaddr *)&address, sizeof address) != 0 ||
        listen(listener, 8) != 0) {
        perror("listener");
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/out", dir);
    int f = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    file = fcntl(f, F_DUPFD_CLOEXEC, 100);
    close(f);
    saved = fcntl(1, F_DUPFD_CLOEXEC, 100);
    if (file < 0 || saved < 0) {
        perror("the mounted file");
        return 1;
    }
    /* The numbers below `lowest` stay taken; `lowest` is the first free one. */
    int lowest = open("/dev/null", O_RDONLY);
    close(lowest);
    pthread_t thread;
    pthread_create(&thread, NULL, redirector, NULL);
    struct {
        const char *name;
        int (*make)(void);
    } single[] = {{"socket", one_socket}, {"eventfd", one_eventfd},   {"epoll_create1", one_epoll},
                  {"memfd_create", one_memfd}, {"timerfd_create", one_timerfd}, {"inotify_init1", one_inotify},
                  {"signalfd", one_signalfd}, {"accept4", one_accept}};
    int pipe_bad = 0, pair_bad = 0, single_bad[8] = {0}, rounds = 0;
    time_t end = time(NULL) + 2;
    for (; time(NULL) <= end; rounds++) {
        int p[2];
        if (pipe(p) != 0 || p[0] != lowest || p[1] != lowest + 1) {
            if (!pipe_bad++)
                fprintf(stderr, "pipe gave %d and %d, %d and %d were free\n", p[0], p[1], lowest, lowest + 1);
        }
        close(p[0]);
        close(p[1]);
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, p) != 0 || p[0] != lowest || p[1] != lowest + 1) {
            if (!pair_bad++)
                fprintf(stderr, "socketpair gave %d and %d, %d and %d were free\n", p[0], p[1], lowest, lowest + 1);
        }
        close(p[0]);
        close(p[1]);
        for (int i = 0; i < 8; i++) {
            int fd = single[i].make();
            if (fd != lowest && !single_bad[i]++)
                fprintf(stderr, "%s gave %d, %d was free\n", single[i].name, fd, lowest);
            if (fd >= 0)
                close(fd);
        }
    }
    atomic_store(&stop, 1);
    pthread_join(thread, NULL);
    unlink(address.sun_path);
    check(pipe_bad == 0, "pipe off the lowest numbers (rounds)", pipe_bad, 0);
    check(pair_bad == 0, "socketpair off the lowest numbers (rounds)", pair_bad, 0);
    for (int i = 0; i < 8; i++)
        check(single_bad[i] == 0, single[i].name, single_bad[i], 0);
    fprintf(stderr, "%d rounds\n", rounds);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
