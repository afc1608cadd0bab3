/* Four threads that fork at once, 30 times each, while the process holds
 * a mounted file open (as cargo's job threads start rustc): run on a mount
 * by preload/tests/mount.rs with IOPATH_LOG, which must say nothing of a
 * socket it could not make. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static void *forker(void *arg) {
    (void)arg;
    for (int i = 0; i < 30; i++) {
        pid_t pid = fork();
        if (pid == 0) _exit(0);
        if (pid > 0) waitpid(pid, NULL, 0);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: forks_at_once DIR\n");
        return 2;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/held", argv[1]);
    int fd = open(path, O_CREAT | O_WRONLY, 0644);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    pthread_t threads[4];
    for (int t = 0; t < 4; t++) pthread_create(&threads[t], NULL, forker, NULL);
    for (int t = 0; t < 4; t++) pthread_join(threads[t], NULL);
    close(fd);
    puts("done");
    return 0;
}
