/*
 * example.c: iopath from C, in one page.
 *
 *   cargo build --release
 *   cc -O2 -Iinclude examples/c/example.c -Ltarget/release -liopath -Wl,-rpath,$PWD/target/release -o example
 *   ./example                       # on the emulated DRAM-SSD
 *   ./example uring:/tmp/x.img,size=64m stm
 *
 * Writes a pattern with blocking calls, reads it back through a queue at
 * depth 8, checks every byte, and prints the engine's statistics as JSON.
 */
#include <iopath.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 4096
#define BLOCKS 64

int main(int argc, char **argv) {
    const char *device = argc > 1 ? argv[1] : "emu:dram-ssd,size=64m";
    const char *path = argc > 2 ? argv[2] : "sync-path";
    iopath_engine *engine = iopath_open(device, path);
    if (!engine) {
        fprintf(stderr, "example: %s\n", iopath_last_error());
        return 1;
    }
    size_t align = iopath_alignment(engine) > 64 ? iopath_alignment(engine) : 64;
    unsigned char *buf;
    if (posix_memalign((void **)&buf, align, BLOCK * BLOCKS) != 0) return 1;

    /* Blocking writes: block i is filled with byte i. */
    for (int i = 0; i < BLOCKS; i++) {
        memset(buf + i * BLOCK, i, BLOCK);
        int64_t n = iopath_write(engine, buf + i * BLOCK, BLOCK, (uint64_t)i * BLOCK);
        if (n < 0) {
            fprintf(stderr, "example: write: %s\n", iopath_last_error());
            return 1;
        }
    }
    if (iopath_flush(engine) < 0) fprintf(stderr, "example: flush: %s\n", iopath_last_error());

    /* Queued reads, 8 in flight, into a cleared buffer. */
    memset(buf, 0xff, BLOCK * BLOCKS);
    iopath_queue *queue = iopath_queue_open(engine, 8);
    if (!queue) {
        fprintf(stderr, "example: queue: %s\n", iopath_last_error());
        return 1;
    }
    int next = 0, done = 0, bad = 0;
    struct iopath_completion c[8];
    while (done < BLOCKS) {
        while (next < BLOCKS && iopath_queue_pending(queue) < 8) {
            if (iopath_queue_read(queue, buf + next * BLOCK, BLOCK, (uint64_t)next * BLOCK, next) < 0) {
                fprintf(stderr, "example: queue read: %s\n", iopath_last_error());
                return 1;
            }
            next++;
        }
        iopath_queue_commit(queue);
        int n = iopath_queue_reap(queue, 1, c, 8);
        if (n < 0) {
            fprintf(stderr, "example: reap: %s\n", iopath_last_error());
            return 1;
        }
        for (int i = 0; i < n; i++, done++) {
            if (c[i].result != BLOCK) {
                fprintf(stderr, "example: read of block %llu failed: %lld\n", (unsigned long long)c[i].tag,
                        (long long)c[i].result);
                bad++;
            }
        }
    }
    iopath_queue_close(queue);
    for (int i = 0; i < BLOCKS * BLOCK; i++) bad += buf[i] != (unsigned char)(i / BLOCK);
    char *stats = iopath_stats_json(engine);
    printf("%s\n", stats ? stats : "{}");
    iopath_string_free(stats);
    iopath_close(engine);
    free(buf);
    printf("%s: %d blocks written and read back on %s with %s\n", bad ? "FAILED" : "ok", BLOCKS, device, path);
    return bad ? 1 : 0;
}
