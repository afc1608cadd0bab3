/* A program whose signal handler ends it with _exit while its main loop is
 * in the middle of file calls (as rsync's does on Ctrl-C): run on a mount
 * by preload/tests/mount.rs, it must end, with the handler's status. With
 * a second argument `print` it also prints each round's number on stdout
 * (which the test puts on a mounted file). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

static void on_alarm(int sig) {
    (void)sig;
    _exit(3);
}

int main(int argc, char **argv) {
    if (argc != 2 && !(argc == 3 && strcmp(argv[2], "print") == 0)) {
        fprintf(stderr, "usage: exit_in_handler DIR [print]\n");
        return 2;
    }
    int print = argc == 3;
    static char block[65536];
    memset(block, 'b', sizeof block);
    char path[4096], next[4096];
    snprintf(path, sizeof path, "%s/.part", argv[1]);
    signal(SIGALRM, on_alarm);
    struct itimerval in = {{0, 0}, {0, 300000}};
    setitimer(ITIMER_REAL, &in, NULL);
    for (unsigned long i = 0;; i++) {
        int fd = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        if (fd < 0 || write(fd, block, sizeof block) != (ssize_t)sizeof block || fsync(fd) != 0 || close(fd) != 0) {
            perror("file calls");
            return 1;
        }
        if (print && (printf("%lu\n", i) < 0 || fflush(stdout) != 0)) {
            perror("printf");
            return 1;
        }
        snprintf(next, sizeof next, "%s/f%lu", argv[1], i % 16);
        struct stat st;
        if (rename(path, next) != 0 || stat(next, &st) != 0) {
            perror("rename");
            return 1;
        }
    }
}
