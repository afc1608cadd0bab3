/* A program compiled as strict POSIX (no _DEFAULT_SOURCE), whose `signal`
 * is the C library's `__sysv_signal`, and one calling `sysv_signal`,
 * `bsd_signal` and `sigset` by name, on a process with a mount: each handler must be
 * installed behind the interposer's wrapper (the kernel holds another
 * address than the program's handler, as rt_sigaction without the C library
 * shows), read back as itself, run when the signal comes with the System V
 * or BSD semantics asked for (reset to the default as it runs, or kept),
 * and write to a file on the mount from inside. Run by
 * preload/tests/mount.rs with the mount's directory. Prints "N passed, M
 * failed". */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHECK_CONTEXT() ((void)0)
#include "check.h"

/* The C library's other names for `signal` (declared only with _DEFAULT_SOURCE). */
typedef void (*handler_t)(int);
extern handler_t sysv_signal(int, handler_t);
extern handler_t bsd_signal(int, handler_t);
extern handler_t sigset(int, handler_t);
#define HOLD ((handler_t)2) /* SIG_HOLD */
extern long syscall(long number, ...);

static const char *dir;
static volatile sig_atomic_t ran, wrote;

static void handler(int sig) {
    ran++;
    char path[4096];
    snprintf(path, sizeof path, "%s/handled", dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0 && write(fd, "+", 1) == 1 && close(fd) == 0) wrote++;
    (void)sig;
}

/* The handler the kernel holds for `sig` (the raw system call: no hook). */
static void *kernel_handler(int sig) {
    struct {
        void *handler;
        unsigned long flags;
        void *restorer;
        unsigned long mask;
    } k;
    memset(&k, 0, sizeof k);
    if (syscall(SYS_rt_sigaction, sig, NULL, &k, 8) != 0) return NULL;
    return k.handler;
}

/* Installs `handler` on `sig` with `install`, raises it twice, and checks
 * what each step should give: `resets` for the System V forms. */
static void one(const char *name, handler_t (*install)(int, handler_t), int sig, int resets) {
    ran = wrote = 0;
    handler_t before = install(sig, handler);
    CHECK(before != SIG_ERR, "%s: %s\n", name, strerror(errno));
    CHECK(kernel_handler(sig) != (void *)handler, "%s: the kernel holds the program's handler bare", name);
    struct sigaction now;
    CHECK(sigaction(sig, NULL, &now) == 0 && now.sa_handler == handler, "%s: does not read back as itself", name);
    CHECK(raise(sig) == 0 && ran == 1 && wrote == 1, "%s: ran %d, wrote %d", name, (int)ran, (int)wrote);
    CHECK(sigaction(sig, NULL, &now) == 0 && (now.sa_handler == SIG_DFL) == (resets != 0),
          "%s: after it ran the handler reads %s", name, now.sa_handler == SIG_DFL ? "SIG_DFL" : "as itself");
    if (!resets) {
        CHECK(raise(sig) == 0 && ran == 2 && wrote == 2, "%s: second: ran %d, wrote %d", name, (int)ran,
              (int)wrote);
    }
    CHECK(install(sig, SIG_DFL) != SIG_ERR, "%s: back to SIG_DFL: %s", name, strerror(errno));
    CHECK(install(sig, SIG_ERR) == SIG_ERR && errno == EINVAL, "%s: SIG_ERR is refused", name);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: sysv_signal DIR\n");
        return 2;
    }
    dir = argv[1];
    one("signal (strict POSIX: __sysv_signal)", signal, SIGUSR1, 1);
    one("sysv_signal", sysv_signal, SIGUSR2, 1);
    one("bsd_signal", bsd_signal, SIGWINCH, 0);
    one("sigset", sigset, SIGURG, 0);
    /* sigset's SIG_HOLD blocks the signal (and says what was set); the next
     * disposition unblocks it, says it was held, and the held one runs. */
    ran = wrote = 0;
    CHECK(sigset(SIGURG, handler) == SIG_DFL && sigset(SIGURG, HOLD) == handler, "sigset: SIG_HOLD");
    sigset_t mask;
    CHECK(sigprocmask(SIG_BLOCK, NULL, &mask) == 0 && sigismember(&mask, SIGURG) == 1, "sigset: not blocked");
    CHECK(raise(SIGURG) == 0 && ran == 0, "sigset: a held signal ran");
    CHECK(sigset(SIGURG, handler) == HOLD && ran == 1 && wrote == 1, "sigset: released: ran %d, wrote %d", (int)ran,
          (int)wrote);
    CHECK(sigset(SIGURG, SIG_DFL) == handler, "sigset: back to SIG_DFL");
    char path[4096];
    snprintf(path, sizeof path, "%s/handled", dir);
    int fd = open(path, O_RDONLY);
    char got[16] = {0};
    ssize_t n = fd >= 0 ? read(fd, got, sizeof got - 1) : -1;
    CHECK(n == 7 && strcmp(got, "+++++++") == 0, "the mounted file holds \"%s\" (%zd bytes)", got, n);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
