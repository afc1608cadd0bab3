/*
 * crash_writer.c: writes records into DIR and says on stdout which ones are
 * durable, until it is killed. Run by preload/tests/crash.rs on an iopath
 * mount and killed with SIGKILL at a random moment; the test then checks
 * that every record acknowledged here is on the device, byte for byte.
 *
 * A record is 64 bytes: "REC" seq(8) file(1) payload(48, from seq) crc-ish sum(4).
 * Each step, by a seed: append a record to log-F (F in 0..3) and fdatasync
 * it, or replace "state" atomically (write state.tmp, fsync, rename, fsync
 * the directory) with the last seq, or create and remove scratch files in
 * sub/. After a record is durable it prints "A <seq> <file>" (or
 * "S <seq>" for a state replaced) and flushes stdout.
 *
 * Usage: crash_writer DIR SEED FIRST_SEQ
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t rng;
static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static void die(const char *what) {
    fprintf(stderr, "crash_writer: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* The record of `seq` in file `f`. */
static void record(unsigned char *r, uint64_t seq, int f) {
    memcpy(r, "REC", 3);
    memcpy(r + 3, &seq, 8);
    r[11] = (unsigned char)f;
    uint64_t x = seq * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 12; i < 60; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        r[i] = (unsigned char)x;
    }
    uint32_t sum = 0;
    for (int i = 0; i < 60; i++) sum = sum * 31 + r[i];
    memcpy(r + 60, &sum, 4);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s DIR SEED FIRST_SEQ\n", argv[0]);
        return 2;
    }
    char dir[2048];
    snprintf(dir, sizeof dir, "%s", argv[1]);
    rng = strtoull(argv[2], NULL, 10) * 2654435761u + 88172645463325252ull;
    uint64_t seq = strtoull(argv[3], NULL, 10);
    char path[4400], tmp[4400], sub[4200];
    int logs[4];
    for (int f = 0; f < 4; f++) {
        snprintf(path, sizeof path, "%s/log-%d", dir, f);
        logs[f] = open(path, O_CREAT | O_WRONLY | O_APPEND, 0644);
        if (logs[f] < 0) die(path);
    }
    snprintf(sub, sizeof sub, "%s/sub", dir);
    if (mkdir(sub, 0755) < 0 && errno != EEXIST) die("mkdir sub");
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd < 0) die("open dir");
    unsigned char r[64];
    for (;; seq++) {
        uint64_t pick = next() % 10;
        if (pick < 7) {
            int f = (int)(next() % 4);
            record(r, seq, f);
            /* Sometimes in two pieces, so a torn record is possible if durability were wrong. */
            if (next() % 2) {
                if (write(logs[f], r, 64) != 64) die("write");
            } else {
                if (write(logs[f], r, 20) != 20 || write(logs[f], r + 20, 44) != 44) die("write pieces");
            }
            if (fdatasync(logs[f]) < 0) die("fdatasync");
            printf("A %llu %d\n", (unsigned long long)seq, f);
        } else if (pick < 9) {
            snprintf(tmp, sizeof tmp, "%s/state.tmp", dir);
            snprintf(path, sizeof path, "%s/state", dir);
            int t = open(tmp, O_CREAT | O_TRUNC | O_WRONLY, 0644);
            if (t < 0) die("open state.tmp");
            record(r, seq, 9);
            if (write(t, r, 64) != 64 || fsync(t) < 0 || close(t) < 0) die("write state.tmp");
            if (rename(tmp, path) < 0 || fsync(dfd) < 0) die("rename state");
            printf("S %llu\n", (unsigned long long)seq);
        } else {
            /* Churn: files made and removed in a subdirectory (no promises about them). */
            snprintf(path, sizeof path, "%s/scratch-%llu", sub, (unsigned long long)(seq % 5));
            int s = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
            if (s < 0) die("scratch");
            if (write(s, r, 64) != 64) die("scratch write");
            close(s);
            if (next() % 2) unlink(path);
        }
        fflush(stdout);
    }
}
