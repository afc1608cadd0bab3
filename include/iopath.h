/*
 * iopath.h: the C interface to iopath (libiopath.so, built by `cargo build --release`).
 *
 * An engine is a device plus an I/O path, named by the same strings the
 * `iopath` tool takes:
 *
 *   device spec   "uring:/dev/nvme0n1"   io_uring, O_DIRECT
 *                 "uring:/data/x.img,size=1g"  a file (created and laid out if missing)
 *                 "psync:/dev/loop0"     pread/pwrite
 *                 "emu:dram-ssd"         the emulated ultra-low-latency SSD
 *                 "null"                 completes at once, moves no data
 *   path spec     "auto", "sync-path", "sync-intr", "sync-yield", "stm", "atm", "htm", "2q", "scsi-intr",
 *                 "dispatch+completion" ("stm+hybrid", "combine+adaptive"),
 *                 knobs after '@' ("stm@combine-polling=winner"); NULL = "auto"
 *                 (each caller polls its own completions and yields the CPU between
 *                 looks: safe with more threads than CPUs)
 *
 * Threads: one engine serves any number of threads at once. iopath_read,
 * iopath_write and iopath_flush block the calling thread and may be called by
 * many threads together; that is what lets the merging paths ("stm", "2q")
 * send many threads' requests as one device batch. An iopath_queue belongs to
 * the thread that uses it (one thread at a time).
 *
 * Errors: functions that return a number return a negative errno on failure
 * (-EINVAL for a bad argument or spec, -EIO or the device's errno for a
 * failed I/O, -ETIMEDOUT, -ENOTRECOVERABLE for an internal error); functions
 * that return a pointer return NULL. Either way iopath_last_error() then
 * holds a message that says what is wrong and what to do. Nothing panics
 * into C, and every request accepted either completes or reports its error.
 *
 * Buffers: with O_DIRECT devices ("uring:", "psync:") a buffer's address,
 * the offset and the length must be multiples of iopath_alignment(); use
 * posix_memalign(). A misaligned request fails with -EINVAL and says so.
 */
#ifndef IOPATH_H
#define IOPATH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** An open device and I/O path. */
typedef struct iopath_engine iopath_engine;
/** One thread's queue for asynchronous I/O at depth > 1. */
typedef struct iopath_queue iopath_queue;

/** A finished queued request. */
struct iopath_completion {
    uint64_t tag;   /**< the tag given when it was queued */
    int64_t result; /**< bytes moved, or -errno */
};

/**
 * Opens an engine. Returns NULL on failure (see iopath_last_error()).
 * Example: iopath_open("uring:/dev/nvme0n1", "stm").
 */
iopath_engine *iopath_open(const char *device_spec, const char *path_spec);

/** Closes an engine. Every queue of it must be closed first. NULL is ignored. */
void iopath_close(iopath_engine *engine);

/**
 * The calling thread's last error message ("" if none). Valid until the
 * thread's next failing iopath call; do not free it.
 */
const char *iopath_last_error(void);

/** Usable size of the device in bytes (0 for a NULL engine). */
uint64_t iopath_size(const iopath_engine *engine);

/** Alignment of buffer addresses, offsets and lengths the device needs (1 = none). */
uint32_t iopath_alignment(const iopath_engine *engine);

/** Largest single request in bytes. */
uint32_t iopath_max_io(const iopath_engine *engine);

/**
 * Reads len bytes at offset into buf, blocking. Returns len, or -errno.
 * Requests past the end of the device fail with -EINVAL (they are never
 * shortened).
 */
int64_t iopath_read(iopath_engine *engine, void *buf, size_t len, uint64_t offset);

/** Writes len bytes of buf at offset, blocking. Returns len, or -errno. */
int64_t iopath_write(iopath_engine *engine, const void *buf, size_t len, uint64_t offset);

/** Makes every earlier completed write durable. Returns 0, or -errno. */
int iopath_flush(iopath_engine *engine);

/**
 * Statistics as one JSON object: the device and path, reads, writes,
 * flushes, bytes, errors, and the path's dispatcher counters. Free the
 * string with iopath_string_free(). NULL on failure.
 */
char *iopath_stats_json(const iopath_engine *engine);

/** Frees a string returned by iopath. NULL is ignored. */
void iopath_string_free(char *s);

/** A held request that idle CPUs poll (see iopath_idle_poll_request). */
typedef struct iopath_idle_poll iopath_idle_poll;

/**
 * Asks the kernel that idle CPUs poll instead of halting until the request
 * is released (a PM QoS CPU latency limit of 0 us through
 * /dev/cpu_dma_latency; root only). A wake-up of a thread whose CPU is idle
 * then costs ~2 us instead of leaving a deep idle state (10-40 us on a VM
 * whose idle vCPUs halt): it pays where requests sleep or need a kernel
 * worker. The price is idle CPUs spinning. The request also ends when the
 * process does. NULL on failure (iopath_last_error() says why).
 */
iopath_idle_poll *iopath_idle_poll_request(void);

/** Ends the request. NULL is ignored. */
void iopath_idle_poll_release(iopath_idle_poll *request);

/**
 * Opens a queue for the calling thread with room for depth requests in
 * flight. NULL on failure.
 */
iopath_queue *iopath_queue_open(iopath_engine *engine, uint32_t depth);

/**
 * Closes a queue. Waits for its requests still in the device first (their
 * buffers are the device's until then).
 */
void iopath_queue_close(iopath_queue *queue);

/**
 * Queues a read of len bytes at offset into buf; its completion carries tag.
 * The buffer belongs to the device until the request is reaped: do not read,
 * write or free it before. Returns 0, or -errno (-EINVAL when the queue
 * is full: reap first). Nothing is sent before iopath_queue_commit().
 */
int iopath_queue_read(iopath_queue *queue, void *buf, size_t len, uint64_t offset, uint64_t tag);

/** Queues a write; as iopath_queue_read, and buf must not change until reaped. */
int iopath_queue_write(iopath_queue *queue, const void *buf, size_t len, uint64_t offset, uint64_t tag);

/** Sends every queued request (one system call where the device batches). 0, or -errno. */
int iopath_queue_commit(iopath_queue *queue);

/**
 * Waits until at least min requests have finished (fewer if fewer are
 * outstanding), then stores up to max completions in out. Returns how many
 * were stored, or -errno. A request's own failure is its result, not the
 * return value.
 */
int iopath_queue_reap(iopath_queue *queue, uint32_t min, struct iopath_completion *out, uint32_t max);

/** Requests queued and not yet handed back by iopath_queue_reap(). */
uint32_t iopath_queue_pending(const iopath_queue *queue);

#ifdef __cplusplus
}
#endif

#endif /* IOPATH_H */
