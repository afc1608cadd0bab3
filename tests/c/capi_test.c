/*
 * capi_test.c: the C interface's contract, run by tests/capi.rs (and so by
 * `cargo test`). Usage: capi_test FILE  (FILE: a scratch file path it may create)
 *
 * Checks: bad specs and NULLs give NULL or -EINVAL with a message; misaligned
 * buffers, offsets past the end and zero lengths are refused with -EINVAL;
 * 8 threads on one merging engine write and read back distinct blocks, every
 * byte checked; a queue refuses more than its depth, hands completions out
 * in pieces and waits for its requests when closed; a device error inside a
 * merged batch reaches exactly the request it hit; statistics are JSON;
 * idle polling is in force while held (root) or refused with a reason.
 * Prints "N passed, M failed" and exits non-zero on any failure.
 */
#include <errno.h>
#include <fcntl.h>
#include <iopath.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK_CONTEXT() fprintf(stderr, " (last error: %s)", iopath_last_error())
#include "check.h"

static void *aligned(size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 4096, n) != 0) abort();
    return p;
}

static void errors(const char *file) {
    CHECK(iopath_open("bogus:", NULL) == NULL, "a bad device spec opens nothing");
    CHECK(strstr(iopath_last_error(), "device spec") != NULL, "message names the spec: %s", iopath_last_error());
    CHECK(iopath_open("emu:dram-ssd,size=16m", "no-such-path") == NULL, "a bad path spec opens nothing");
    CHECK(strstr(iopath_last_error(), "no-such-path") != NULL, "message names the path");
    CHECK(iopath_open(NULL, NULL) == NULL, "a NULL spec opens nothing");
    iopath_engine *d = iopath_open("emu:dram-ssd,size=16m", NULL);
    CHECK(d != NULL, "no path spec opens the default path");
    char *stats = d ? iopath_stats_json(d) : NULL;
    CHECK(stats && strstr(stats, "\"path\":\"auto\""), "the default path is auto: %s", stats ? stats : "NULL");
    iopath_string_free(stats);
    iopath_close(d);
    CHECK(iopath_open("uring:/nonexistent-dir/x.img", NULL) == NULL, "a missing file opens nothing");
    CHECK(strlen(iopath_last_error()) > 0, "and says why");
    char buf[16];
    CHECK(iopath_read(NULL, buf, sizeof buf, 0) == -EINVAL, "NULL engine");
    CHECK(iopath_size(NULL) == 0, "NULL engine has no size");

    char spec[512];
    snprintf(spec, sizeof spec, "uring:%s,size=1m", file);
    iopath_engine *e = iopath_open(spec, "sync-path");
    CHECK(e != NULL, "opening %s", spec);
    if (!e) return;
    CHECK(iopath_size(e) == 1 << 20, "size %llu", (unsigned long long)iopath_size(e));
    CHECK(iopath_alignment(e) >= 512, "O_DIRECT alignment %u", iopath_alignment(e));
    unsigned char *b = aligned(8192);
    CHECK(iopath_read(e, b + 1, 4096, 0) == -EINVAL, "misaligned buffer");
    CHECK(strstr(iopath_last_error(), "align") != NULL, "message says alignment: %s", iopath_last_error());
    CHECK(iopath_read(e, b, 4096, 100) == -EINVAL, "misaligned offset");
    CHECK(iopath_read(e, b, 4096, 1 << 20) == -EINVAL, "offset past the end");
    CHECK(iopath_read(e, b, 0, 0) == -EINVAL, "zero length");
    CHECK(iopath_read(e, NULL, 4096, 0) == -EFAULT, "NULL buffer");
    CHECK(iopath_read(e, b, 4096, 0) == 4096, "a good read still works after the bad ones");
    CHECK(iopath_queue_open(e, 0) == NULL, "a queue of depth 0");
    free(b);
    iopath_close(e);
    iopath_close(NULL);
}

struct worker {
    iopath_engine *engine;
    int id, errors;
};

#define THREADS 8
#define PER_THREAD 200

static void *work(void *arg) {
    struct worker *w = arg;
    unsigned char *b = aligned(4096);
    for (int i = 0; i < PER_THREAD; i++) {
        uint64_t block = (uint64_t)i * THREADS + w->id;
        memset(b, (int)(block * 7 + 1), 4096);
        memcpy(b, &block, sizeof block);
        if (iopath_write(w->engine, b, 4096, block * 4096) != 4096) w->errors++;
    }
    for (int i = 0; i < PER_THREAD; i++) {
        uint64_t block = (uint64_t)i * THREADS + w->id, got;
        memset(b, 0, 4096);
        if (iopath_read(w->engine, b, 4096, block * 4096) != 4096) {
            w->errors++;
            continue;
        }
        memcpy(&got, b, sizeof got);
        if (got != block) w->errors++;
        for (int j = sizeof block; j < 4096; j++)
            if (b[j] != (unsigned char)(block * 7 + 1)) {
                w->errors++;
                break;
            }
    }
    free(b);
    return NULL;
}

static void threads(const char *path) {
    iopath_engine *e = iopath_open("emu:dram-ssd,size=16m", path);
    CHECK(e != NULL, "open with %s", path);
    if (!e) return;
    pthread_t t[THREADS];
    struct worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (struct worker){e, i, 0};
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    int errors = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        errors += w[i].errors;
    }
    CHECK(errors == 0, "%d bad blocks with %s", errors, path);
    char *stats = iopath_stats_json(e);
    CHECK(stats && strstr(stats, "\"reads\":1600"), "stats count every read: %s", stats ? stats : "NULL");
    iopath_string_free(stats);
    iopath_close(e);
}

static void queue(void) {
    iopath_engine *e = iopath_open("emu:dram-ssd,size=16m", "sync-path");
    CHECK(e != NULL, "open");
    if (!e) return;
    iopath_queue *q = iopath_queue_open(e, 4);
    CHECK(q != NULL, "queue");
    unsigned char *b = aligned(5 * 4096);
    for (int i = 0; i < 4; i++) CHECK(iopath_queue_read(q, b + i * 4096, 4096, i * 4096, 100 + i) == 0, "queue %d", i);
    CHECK(iopath_queue_read(q, b + 4 * 4096, 4096, 0, 9) == -EINVAL, "a fifth request on a queue of 4");
    CHECK(iopath_queue_pending(q) == 4, "4 pending");
    CHECK(iopath_queue_commit(q) == 0, "commit");
    struct iopath_completion c[4];
    int seen = 0, tags = 0;
    while (seen < 4) {
        int n = iopath_queue_reap(q, 1, c, 1);
        CHECK(n == 1, "reap one at a time: %d", n);
        if (n != 1) break;
        CHECK(c[0].result == 4096, "result %lld", (long long)c[0].result);
        tags |= 1 << (c[0].tag - 100);
        seen++;
    }
    CHECK(tags == 15, "every tag came back once: %x", tags);
    CHECK(iopath_queue_pending(q) == 0, "nothing pending");
    CHECK(iopath_queue_reap(q, 1, c, 4) == 0, "reaping an empty queue returns 0 at once");
    /* Closing with requests in flight waits for them. */
    for (int i = 0; i < 4; i++) iopath_queue_write(q, b + i * 4096, 4096, i * 4096, i);
    iopath_queue_commit(q);
    iopath_queue_close(q);
    free(b);
    iopath_close(e);
}

/* A device error in the middle of a merged batch reaches exactly its request. */
static void device_error(void) {
    iopath_engine *e = iopath_open("emu:dram-ssd,size=16m,fail_range=40k-44k", "2q");
    CHECK(e != NULL, "open with fail_range");
    if (!e) return;
    iopath_queue *q = iopath_queue_open(e, 16);
    unsigned char *b = aligned(16 * 4096);
    for (int i = 0; i < 16; i++) iopath_queue_read(q, b + i * 4096, 4096, (uint64_t)i * 4096, i);
    iopath_queue_commit(q);
    struct iopath_completion c[16];
    int got = 0, bad = 0;
    while (got < 16) {
        int n = iopath_queue_reap(q, 16 - got, c, 16);
        if (n <= 0) break;
        for (int i = 0; i < n; i++) {
            if (c[i].tag == 10) CHECK(c[i].result == -EIO, "block 10 fails with -EIO: %lld", (long long)c[i].result);
            else bad += c[i].result != 4096;
        }
        got += n;
    }
    CHECK(got == 16, "every request came back: %d", got);
    CHECK(bad == 0, "%d others failed", bad);
    CHECK(iopath_read(e, b, 4096, 40 * 1024) == -EIO, "a blocking read of the bad block fails with -EIO");
    CHECK(strstr(iopath_last_error(), "offset 40960") != NULL, "and names the offset: %s", iopath_last_error());
    iopath_queue_close(q);
    free(b);
    iopath_close(e);
}

/* Idle polling: granted to root (and then in force until released), refused with a reason otherwise. */
static void idle_poll(void) {
    int root = access("/dev/cpu_dma_latency", W_OK) == 0;
    iopath_idle_poll *p = iopath_idle_poll_request();
    if (root) {
        CHECK(p != NULL, "root may ask that idle CPUs poll: %s", iopath_last_error());
        int fd = open("/dev/cpu_dma_latency", O_RDONLY);
        int32_t limit = -1;
        CHECK(fd >= 0 && read(fd, &limit, sizeof limit) == sizeof limit && limit == 0, "limit %d while held", limit);
        if (fd >= 0) close(fd);
    } else {
        CHECK(p == NULL && strstr(iopath_last_error(), "cpu_dma_latency") != NULL, "refused: %s", iopath_last_error());
    }
    iopath_idle_poll_release(p);
    iopath_idle_poll_release(NULL);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: capi_test SCRATCH-FILE\n");
        return 2;
    }
    errors(argv[1]);
    threads("stm");
    threads("2q");
    threads("sync-intr");
    queue();
    device_error();
    idle_poll();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
