/* A multi-threaded program that forks while another of its threads works
 * on a mount (as cargo does when it runs a build script while its other
 * threads write fingerprints): each fork gives the idle mount back, the
 * worker thread mounts it again at once, and the child, which exits
 * straight away, needs the mount for one file of its own. Every child must
 * be able to use the mount: run on a mount by preload/tests/mount.rs.
 * Prints "N passed, M failed". */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK_CONTEXT() ((void)0)
#include "check.h"

static const char *dir;
static atomic_int stop;

/* Writes and closes a file of its own, over and over: the mount is
 * mounted again after every fork gave it back. */
static void *worker(void *arg) {
    (void)arg;
    char path[4096];
    snprintf(path, sizeof path, "%s/worker", dir);
    while (!atomic_load(&stop)) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            if (write(fd, "w", 1) != 1) perror("worker write");
            close(fd);
        }
        usleep(500); /* (one that never pauses keeps the mount from every child) */
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: fork_while_mounting DIR FORKS\n");
        return 2;
    }
    dir = argv[1];
    int forks = atoi(argv[2]);
    pthread_t thread;
    pthread_create(&thread, NULL, worker, NULL);
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            char path[4096];
            snprintf(path, sizeof path, "%s/child-%d", dir, i);
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd < 0) _exit(10 + errno % 100);
            int ok = write(fd, "c", 1) == 1 && close(fd) == 0 && unlink(path) == 0;
            _exit(ok ? 0 : 1);
        }
        int status = 0;
        CHECK(pid > 0 && waitpid(pid, &status, 0) == pid, "fork %d: %s", i, strerror(errno));
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: status %d (10 + errno)", i,
              WEXITSTATUS(status));
    }
    atomic_store(&stop, 1);
    pthread_join(thread, NULL);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
