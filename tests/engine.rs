//! The engine under concurrency, on every backend, and its error paths.

mod common;

use common::within_two_minutes;

use iopath::device::{Op, open_device};
use iopath::path::{CombinePolling, CompletionKind, CrowdRule, DispatchKind, PathConfig};
use iopath::{Engine, Error, HandleOptions, IoBuf};
use std::sync::Arc;
use std::time::Duration;

fn path(dispatch: DispatchKind, completion: CompletionKind) -> PathConfig {
    PathConfig { timeout: Duration::from_secs(10), ..PathConfig::new(dispatch, completion) }
}

/// Every dispatch x completion combination; the combining ones with both
/// ways of polling.
fn all_paths() -> Vec<PathConfig> {
    let mut out = Vec::new();
    for d in DispatchKind::ALL {
        for c in CompletionKind::ALL {
            out.push(path(d, c));
            if matches!(d, DispatchKind::Combine | DispatchKind::Hybrid) {
                out.push(PathConfig { combine_polling: CombinePolling::Winner, ..path(d, c) });
            }
        }
    }
    out
}

fn pattern(thread: usize, round: usize, block: usize, len: usize) -> IoBuf {
    let seed = (thread as u64) << 40 | (round as u64) << 20 | block as u64;
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut buf = IoBuf::new(len);
    buf.iter_mut().for_each(|b| *b = rng.u8(..));
    buf
}

/// Many threads share one engine through the blocking API; each owns some
/// blocks, rewrites them several times and checks every byte it reads back.
fn hammer(engine: &Engine, threads: usize, blocks_per_thread: usize, bs: usize, rounds: usize) {
    std::thread::scope(|s| {
        for t in 0..threads {
            let engine = engine.clone();
            s.spawn(move || {
                let mut handle = engine.handle(HandleOptions { depth: 1, buffers: 1, buffer_size: bs }).unwrap();
                for round in 0..rounds {
                    for b in 0..blocks_per_thread {
                        let offset = ((t * blocks_per_thread + b) * bs) as u64;
                        let data = pattern(t, round, b, bs);
                        if (t + b + round) % 2 == 0 {
                            engine.write_at(&data, offset).unwrap();
                        } else {
                            handle.buffer(0).unwrap().copy_from_slice(&data);
                            handle.write_from(0, offset, bs).unwrap();
                        }
                    }
                    for b in 0..blocks_per_thread {
                        let offset = ((t * blocks_per_thread + b) * bs) as u64;
                        let expected = pattern(t, round, b, bs);
                        let mut got = IoBuf::new(bs);
                        engine.read_at(&mut got, offset).unwrap();
                        assert_eq!(&got[..], &expected[..], "thread {t} block {b} round {round} (blocking API)");
                        handle.read_into(0, offset, bs).unwrap();
                        assert_eq!(handle.buffer(0).unwrap(), &expected[..], "thread {t} block {b} (handle API)");
                    }
                }
            });
        }
    });
}

#[test]
fn every_path_survives_16_threads_on_the_emulated_ssd() {
    for p in all_paths() {
        let engine = Engine::open("emu:dram-ssd,size=16m", p.clone()).unwrap();
        hammer(&engine, 16, 8, 4096, 3);
        let stats = engine.device().stats();
        assert_eq!(stats.segments as usize, 16 * 8 * 3 * 3, "{}: every request reached the device once", p.label());
        assert!(stats.commands <= stats.segments);
    }
}

#[test]
fn every_path_survives_16_threads_on_a_zero_time_device() {
    // No device time maximises interleaving between threads.
    for p in all_paths() {
        let engine = Engine::open("emu:null,size=8m", p).unwrap();
        hammer(&engine, 16, 16, 512, 4);
    }
}

#[test]
fn psync_and_uring_on_a_file_keep_every_byte() {
    let dir = tempfile::tempdir().unwrap();
    for backend in ["psync", "uring"] {
        let file = dir.path().join(format!("{backend}.img"));
        let spec = format!("{backend}:{}", file.display());
        for p in all_paths() {
            let device = open_device(&spec, Some(8 << 20)).unwrap();
            let engine = Engine::with_device(device, p).unwrap();
            hammer(&engine, 8, 8, 4096, 2);
        }
    }
}

#[test]
fn uring_on_a_loop_device_keeps_every_byte() {
    common::with_loop_device("uring_on_a_loop_device_keeps_every_byte", |dev| {
        for backend in ["uring", "psync"] {
            for p in all_paths() {
                let spec = format!("{backend}:{}", dev.path.display());
                let engine = Engine::open(&spec, p).unwrap();
                hammer(&engine, 8, 8, 4096, 2);
            }
        }
    });
}

/// `auto` on a kernel device: a lone thread sends its own requests; threads
/// blocked at once share one AIO queue whose merged batches any of them
/// completes; threads that pause at random (the crowd growing and
/// shrinking, so each thread's requests take one route, then the other)
/// get every request back with its bytes; `crowd=off` never shares.
#[test]
fn auto_sends_a_crowd_through_one_shared_queue_and_a_lone_thread_direct() {
    within_two_minutes("auto's crowd", || {
        let dir = tempfile::tempdir().unwrap();
        let spec = format!("uring:{}", dir.path().join("crowd.img").display());
        // `always`: other tests of this binary may keep the CPUs busy, which `auto`
        // would rightly answer by going direct.
        let auto = PathConfig { crowd: CrowdRule::Always, ..path(DispatchKind::Auto, CompletionKind::Auto) };
        let engine = Engine::with_device(open_device(&spec, Some(8 << 20)).unwrap(), auto.clone()).unwrap();
        hammer(&engine, 1, 8, 4096, 2);
        assert_eq!(engine.background_stats().merged_requests, 0, "a lone thread goes direct");
        let device_before = engine.device().stats().segments;
        hammer(&engine, 16, 8, 4096, 3);
        let shared = engine.background_stats().merged_requests;
        assert!(shared > 0, "16 threads blocked at once: none went through the shared queue");
        assert_eq!(
            engine.device().stats().segments - device_before,
            16 * 8 * 3 * 3,
            "every request reached the device once, whichever queue it took"
        );

        // Pausing threads: the number blocked at once moves between 1 and 6.
        std::thread::scope(|s| {
            for t in 0..6usize {
                let engine = engine.clone();
                s.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(t as u64);
                    for round in 0..150 {
                        let b = rng.usize(..16);
                        let offset = ((100 + t * 16 + b) * 4096) as u64;
                        let data = pattern(t, round, b, 4096);
                        engine.write_at(&data, offset).unwrap();
                        if rng.bool() {
                            std::thread::sleep(Duration::from_micros(rng.u64(..300)));
                        }
                        let mut got = IoBuf::new(4096);
                        engine.read_at(&mut got, offset).unwrap();
                        assert_eq!(&got[..], &data[..], "thread {t} round {round}");
                    }
                });
            }
        });
        assert!(engine.background_stats().merged_requests > shared);

        let off = PathConfig { crowd: CrowdRule::Off, ..auto };
        let engine = Engine::with_device(open_device(&spec, Some(8 << 20)).unwrap(), off).unwrap();
        hammer(&engine, 16, 8, 4096, 1);
        assert_eq!(engine.background_stats().merged_requests, 0, "crowd=off shares nothing");
    });
}

/// Opening io_uring on a device without poll queues makes no probe ring: a
/// ring torn down sends task work to every thread that used it, which cut
/// that thread's next blocking read short (`dd if=/dev/urandom bs=1M` onto a
/// mount: "partial read" in every run of 64 reads before).
#[test]
fn opening_uring_on_a_loop_device_leaves_the_thread_blocking_reads_whole() {
    common::with_loop_device("opening_uring_on_a_loop_device_leaves_the_thread_blocking_reads_whole", |dev| {
        let engine = Engine::open(&format!("uring:{}", dev.path.display()), PathConfig::default()).unwrap();
        assert!(engine.device().describe().contains("queue/io_poll"), "{}", engine.device().describe());
        let mut block = IoBuf::new(4096);
        engine.read_at(&mut block, 0).unwrap();
        let mut random = std::fs::File::open("/dev/urandom").unwrap();
        let mut buf = vec![0u8; 1 << 20];
        for i in 0..64 {
            let n = std::io::Read::read(&mut random, &mut buf).unwrap();
            assert_eq!(n, buf.len(), "read {i} of /dev/urandom was cut short");
        }
    });
}

/// A thread that slept for a completion on a ring whose task work is not
/// deferred (the interposer's mounts use `taskrun=coop`) is left with no
/// timer of the ring's armed: the shared watchdog timeout fired up to 100 ms
/// after the wait and cut the thread's blocking read short then.
#[test]
fn a_sleeping_wait_on_a_cooperative_ring_leaves_no_timer_to_interrupt_the_thread() {
    common::with_loop_device("a_sleeping_wait_on_a_cooperative_ring_leaves_no_timer_to_interrupt_the_thread", |dev| {
        let spec = format!("uring:{},taskrun=coop", dev.path.display());
        let engine = Engine::open(&spec, PathConfig::preset("sync-intr").unwrap()).unwrap();
        // Queued reads, waited for by sleeping (completions come from the loop's worker).
        let mut h = engine.handle(HandleOptions { depth: 4, buffers: 4, buffer_size: 4096 }).unwrap();
        let mut done = Vec::new();
        for i in 0..64u64 {
            h.submit(Op::Read, (i % 4) as usize, i * 4096, 4096).unwrap();
            h.commit().unwrap();
            while h.reap(1, &mut done).unwrap() == 0 {}
        }
        assert_eq!(done.len(), 64);
        let mut random = std::fs::File::open("/dev/urandom").unwrap();
        let mut buf = vec![0u8; 1 << 20];
        // (The watchdog fired 100 ms after it was armed.)
        let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
        let mut reads = 0;
        while std::time::Instant::now() < until {
            let n = std::io::Read::read(&mut random, &mut buf).unwrap();
            assert_eq!(n, buf.len(), "read {reads} of /dev/urandom was cut short");
            reads += 1;
        }
    });
}

#[test]
fn queued_api_keeps_every_request_and_batches_them() {
    // A device time long enough that nothing completes before the test looks.
    for spec in ["emu:custom,size=4m,cmd=20ms", "emu:nand,size=4m", "null:size=4m"] {
        for p in [PathConfig::default(), path(DispatchKind::Combine, CompletionKind::Poll)] {
            let what = format!("{spec} on {}", p.label());
            let engine = Engine::open(spec, p.clone()).unwrap();
            let mut h = engine.handle(HandleOptions { depth: 32, buffers: 32, buffer_size: 4096 }).unwrap();
            for i in 0..32 {
                h.buffer(i).unwrap().fill(i as u8 + 1);
                h.submit(Op::Write, i, i as u64 * 8192, 4096).unwrap();
            }
            h.commit().unwrap();
            if p.dispatch == DispatchKind::Direct && spec.contains("cmd=20ms") {
                // One commit handed all 32 to the device before any came back.
                assert_eq!(engine.device().stats().commands, 32, "{what}");
            }
            let mut done = Vec::new();
            while done.len() < 32 {
                h.reap(1, &mut done).unwrap();
            }
            let mut tags: Vec<u64> = done.iter().map(|c| c.tag).collect();
            tags.sort();
            assert_eq!(tags, (0..32).collect::<Vec<_>>(), "{what}");
            assert!(done.iter().all(|c| c.result.is_ok()), "{what}");
            let stats = engine.device().stats();
            assert_eq!(stats.segments, 32, "{what}");
            if p.dispatch == DispatchKind::Combine {
                // Submitted together, so the serving thread merged them.
                assert!(stats.commands < 32, "{what}: {} commands for 32 requests", stats.commands);
            }
            // Read every block back into a buffer that held something else.
            for i in 0..32 {
                h.buffer(i).unwrap().fill(0xee);
                h.submit(Op::Read, i, i as u64 * 8192, 4096).unwrap();
            }
            assert!(h.buffer(0).is_none(), "a buffer in flight is not handed out");
            h.commit().unwrap();
            done.clear();
            while done.len() < 32 {
                h.reap(1, &mut done).unwrap();
            }
            assert!(done.iter().all(|c| c.result.is_ok()), "{what}");
            if !spec.starts_with("null") {
                for i in 0..32 {
                    assert!(h.buffer(i).unwrap().iter().all(|&b| b == i as u8 + 1), "{what}: block {i}");
                }
            }
        }
    }
}

#[test]
fn a_device_error_reaches_exactly_the_requests_it_belongs_to() {
    // Blocks 8..12 fail; every other request in the same batch succeeds.
    let engine = Engine::open("emu:dram-ssd,size=1m,fail_range=32k-48k", PathConfig::default()).unwrap();
    let mut h = engine.handle(HandleOptions { depth: 16, buffers: 16, buffer_size: 4096 }).unwrap();
    for i in 0..16 {
        h.submit(Op::Read, i, i as u64 * 4096, 4096).unwrap();
    }
    h.commit().unwrap();
    let mut done = Vec::new();
    while done.len() < 16 {
        h.reap(1, &mut done).unwrap();
    }
    for c in &done {
        let should_fail = (8..12).contains(&c.tag);
        match &c.result {
            Err(Error::Device { errno, offset, .. }) => {
                assert!(should_fail, "request {} failed but was outside the range", c.tag);
                assert_eq!(*errno, libc::EIO);
                assert_eq!(*offset, c.tag * 4096);
            }
            Err(e) => panic!("unexpected error {e}"),
            Ok(()) => assert!(!should_fail, "request {} should have failed", c.tag),
        }
    }
    let e = engine.read_at(&mut [0u8; 4096], 40 << 10).unwrap_err();
    assert!(e.to_string().contains("device error on read of 4096 bytes at offset 40960"), "{e}");
    engine.read_at(&mut [0u8; 4096], 0).unwrap();
}

#[test]
fn a_hung_command_times_out_instead_of_hanging() {
    for completion in CompletionKind::ALL {
        let p = PathConfig { timeout: Duration::from_millis(50), ..path(DispatchKind::Direct, completion) };
        let engine = Engine::open("emu:dram-ssd,size=1m,hang_nth=2", p).unwrap();
        let mut buf = vec![0u8; 4096];
        engine.read_at(&mut buf, 0).unwrap();
        let e = engine.read_at(&mut buf, 4096).unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        assert!(e.to_string().contains("did not complete within 50 ms"), "{e}");
        engine.read_at(&mut buf, 8192).unwrap();
    }
}

#[test]
fn bad_requests_get_clear_errors() {
    let engine = Engine::open("emu:dram-ssd,size=1m", PathConfig::default()).unwrap();
    let e = engine.read_at(&mut [], 0).unwrap_err();
    assert!(matches!(e, Error::ZeroLength { .. }), "{e}");
    let e = engine.read_at(&mut [0u8; 4096], (1 << 20) - 512).unwrap_err();
    assert!(e.to_string().contains("past the end of the device"), "{e}");
    let e = engine.write_at(&[0u8; 512], u64::MAX - 10).unwrap_err();
    assert!(matches!(e, Error::OutOfRange { .. }), "{e}");
    let big = Engine::open("emu:dram-ssd,size=4m", PathConfig::default()).unwrap();
    let e = big.read_at(&mut vec![0u8; 2 << 20], 0).unwrap_err();
    assert!(matches!(e, Error::TooLarge { len: 0x20_0000, max: 0x10_0000 }), "{e}");
    let mut h = engine.handle(HandleOptions { depth: 2, buffers: 2, buffer_size: 4096 }).unwrap();
    assert!(h.submit(Op::Read, 5, 0, 4096).unwrap_err().to_string().contains("no such buffer"));
    assert!(h.read_into(0, 0, 8192).is_err(), "longer than the buffer");
    h.submit(Op::Read, 0, 0, 4096).unwrap();
    h.submit(Op::Read, 1, 0, 4096).unwrap();
    let e = h.submit(Op::Read, 0, 0, 4096).unwrap_err();
    assert!(e.to_string().contains("in flight") || e.to_string().contains("depth"), "{e}");
}

#[test]
fn misaligned_o_direct_requests_are_refused_before_the_kernel_sees_them() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("direct.img");
    for backend in ["uring", "psync"] {
        let device = open_device(&format!("{backend}:{}", file.display()), Some(1 << 20)).unwrap();
        let align = device.capabilities().alignment as usize;
        assert!(align >= 512);
        let engine = Engine::with_device(device, PathConfig::default()).unwrap();
        let mut h = engine.handle(HandleOptions { depth: 1, buffers: 1, buffer_size: 8192 }).unwrap();
        // A buffer one byte off an aligned address.
        let mut raw = vec![0u8; 3 * align];
        let start = raw.as_ptr().align_offset(align) + 1;
        let e = h.read_at(&mut raw[start..start + align], 0).unwrap_err();
        assert!(e.to_string().contains("buffer address"), "{e}");
        assert!(e.to_string().contains("IoBuf") || e.to_string().contains("aligned"), "{e}");
        let e = h.read_into(0, 100, 4096).unwrap_err();
        assert!(matches!(e, Error::Misaligned { what: "offset", .. }), "{e}");
        let e = h.read_into(0, 0, 1000).unwrap_err();
        assert!(matches!(e, Error::Misaligned { what: "length", .. }), "{e}");
        h.read_into(0, 4096, 4096).unwrap();
    }
}

#[test]
fn engine_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Engine>();
    let engine = Arc::new(Engine::open("emu:null,size=1m", PathConfig::default()).unwrap());
    let e2 = Arc::clone(&engine);
    std::thread::spawn(move || e2.write_at(&[1u8; 512], 0).unwrap()).join().unwrap();
    let mut b = [0u8; 512];
    engine.read_at(&mut b, 0).unwrap();
    assert_eq!(b, [1u8; 512]);
}

#[test]
fn flush_reaches_every_backend_and_the_data_is_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| dir.path().join(name);
    let specs = [
        (format!("emu:dram-ssd,size=1m,file={}", file("emu.img").display()), Some(file("emu.img"))),
        ("null".to_string(), None),
        (format!("psync:{}", file("p.img").display()), Some(file("p.img"))),
        (format!("uring:{}", file("u.img").display()), Some(file("u.img"))),
        (format!("aio:{}", file("a.img").display()), Some(file("a.img"))),
    ];
    for (spec, path) in specs {
        let device = open_device(&spec, Some(1 << 20)).unwrap();
        let engine = Engine::with_device(device, PathConfig::default()).unwrap();
        let mut h = engine.handle(HandleOptions { depth: 1, buffers: 1, buffer_size: 4096 }).unwrap();
        h.buffer(0).unwrap().fill(0x5a);
        h.write_from(0, 8192, 4096).unwrap();
        let before = engine.device().stats().commands;
        h.flush().unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(engine.device().stats().commands, before + 1, "{spec}: the flush reached the device");
        if let Some(path) = path {
            let on_disk = std::fs::read(&path).unwrap();
            assert!(on_disk[8192..12288].iter().all(|&b| b == 0x5a), "{spec}: the write is not in the file");
        }
    }
}

fn merging_paths() -> Vec<PathConfig> {
    all_paths().into_iter().filter(|p| p.dispatch != DispatchKind::Direct).collect()
}

#[test]
fn a_device_error_in_a_merged_command_reaches_only_its_requests() {
    for p in merging_paths() {
        // Blocks 8..12 of 64 fail; 16 threads read all 64 blocks at once, so the
        // failing blocks travel in commands together with good ones.
        let engine = Engine::open("emu:dram-ssd,size=256k,fail_range=32k-48k", p.clone()).unwrap();
        std::thread::scope(|s| {
            for t in 0..16u64 {
                let engine = engine.clone();
                let label = p.label();
                s.spawn(move || {
                    let mut buf = IoBuf::new(4096);
                    for round in 0..20u64 {
                        let block = (t * 4 + round % 4) % 64;
                        let offset = block * 4096;
                        match engine.read_at(&mut buf, offset) {
                            Ok(()) => assert!(!(8..12).contains(&block), "{label}: block {block} should fail"),
                            Err(Error::Device { offset: at, errno, .. }) => {
                                assert!((8..12).contains(&block), "{label}: block {block} failed but is good");
                                assert_eq!((at, errno), (offset, libc::EIO), "{label}");
                            }
                            Err(e) => panic!("{label}: unexpected error {e}"),
                        }
                    }
                });
            }
        });
        let stats = engine.device().stats();
        assert_eq!(stats.segments, 16 * 20, "{}", p.label());
        assert!(stats.commands <= stats.segments, "{}", p.label());
    }
}

#[test]
fn one_merged_command_with_a_bad_range_fails_exactly_those_requests() {
    // Deterministic: all 16 requests are pending before anyone serves, so the
    // combining winner sends them as one 16-segment command.
    for completion in CompletionKind::ALL {
        let engine =
            Engine::open("emu:dram-ssd,size=1m,fail_range=20k-28k", path(DispatchKind::Combine, completion)).unwrap();
        let mut h = engine.handle(HandleOptions { depth: 16, buffers: 16, buffer_size: 4096 }).unwrap();
        for i in 0..16 {
            // Discontiguous offsets: every other block.
            h.submit(Op::Read, i, i as u64 * 8192, 4096).unwrap();
        }
        h.commit().unwrap();
        let mut done = Vec::new();
        while done.len() < 16 {
            h.reap(16, &mut done).unwrap();
        }
        let stats = engine.device().stats();
        assert_eq!((stats.commands, stats.segments), (1, 16), "one temporally merged command");
        for c in &done {
            // Request 3 is at 24k, inside 20k-28k; its neighbours at 16k and 32k are not.
            assert_eq!(c.result.is_err(), c.tag == 3, "request {}: {:?}", c.tag, c.result);
        }
    }
}

#[test]
fn a_hung_merged_command_fails_its_requests_instead_of_hanging() {
    for p in merging_paths() {
        let p = PathConfig { timeout: Duration::from_millis(100), ..p };
        let engine = Engine::open("emu:dram-ssd,size=1m,hang_nth=3", p.clone()).unwrap();
        let timeouts = std::sync::atomic::AtomicU32::new(0);
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let (engine, timeouts) = (engine.clone(), &timeouts);
                let label = p.label();
                s.spawn(move || {
                    let mut buf = IoBuf::new(4096);
                    for i in 0..5u64 {
                        match engine.read_at(&mut buf, (t * 5 + i) * 4096) {
                            Ok(()) => {}
                            Err(Error::Timeout { timeout_ms, .. }) => {
                                assert_eq!(timeout_ms, 100, "{label}");
                                timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                            Err(e) => panic!("{label}: unexpected error {e}"),
                        }
                    }
                });
            }
        });
        assert!(timeouts.into_inner() >= 1, "{}: the hung command's requests time out", p.label());
    }
}

#[test]
fn single_thread_stm_never_waits_for_a_merge_partner() {
    for completion in CompletionKind::ALL {
        let engine = Engine::open("emu:dram-ssd,size=1m", path(DispatchKind::Combine, completion)).unwrap();
        let mut h = engine.handle(HandleOptions { depth: 1, buffers: 1, buffer_size: 4096 }).unwrap();
        for i in 0..500u64 {
            h.read_into(0, (i % 256) * 4096, 4096).unwrap();
        }
        // The serving role's commands are counted with the path, the requests with the handle.
        let mut s = h.stats();
        s.add(&engine.background_stats());
        assert_eq!((s.requests, s.commands, s.segments), (500, 500, 500), "one command per request, sent at once");
        assert_eq!(s.segments_hist[0], 500);
        // The lone thread always wins the serving role: it never sleeps waiting for a partner.
        match completion {
            CompletionKind::Poll => assert_eq!(s.wait.sleeps, 0),
            // At most one sleep per request: waiting for the device, never for a partner.
            _ => assert!(s.wait.sleeps <= 500, "{}", s.wait.sleeps),
        }
        assert!(s.merge_wait_ns / 500 < 1_000_000, "requests are sent at once, not held for a partner");
    }
}

#[test]
fn merged_paths_flush_every_waiter() {
    let dir = tempfile::tempdir().unwrap();
    for p in merging_paths() {
        let spec = format!("emu:dram-ssd,size=1m,file={}", dir.path().join("f.img").display());
        let engine = Engine::open(&spec, p.clone()).unwrap();
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let engine = engine.clone();
                s.spawn(move || {
                    engine.write_at(&IoBuf::from_slice(&[t as u8; 4096]), t * 4096).unwrap();
                    engine.flush().unwrap();
                });
            }
        });
        let data = std::fs::read(dir.path().join("f.img")).unwrap();
        for t in 0..8usize {
            assert!(data[t * 4096..(t + 1) * 4096].iter().all(|&b| b == t as u8), "{}", p.label());
        }
    }
}

#[test]
fn a_large_batch_for_an_idle_device_is_sent_in_two_halves() {
    // One thread queues 32 requests; the unplug timer is far away, so the
    // dispatcher sends exactly when the 32nd arrives, to an idle device: two
    // commands of 16, so the first half can come back while the second is in service.
    let config = PathConfig { unplug: Some(Duration::from_secs(5)), ..path(DispatchKind::Queue, CompletionKind::Poll) };
    let engine = Engine::open("emu:dram-ssd,size=4m", config).unwrap();
    let mut h = engine.handle(HandleOptions { depth: 32, buffers: 32, buffer_size: 4096 }).unwrap();
    for i in 0..32 {
        h.submit(Op::Write, i, i as u64 * 4096, 4096).unwrap();
    }
    h.commit().unwrap();
    let mut done = Vec::new();
    while done.len() < 32 {
        h.reap(1, &mut done).unwrap();
    }
    assert!(done.iter().all(|c| c.result.is_ok()));
    // The dispatcher publishes its counters once its device queue is empty.
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while engine.background_stats().segments < 32 && std::time::Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(1));
    }
    let s = engine.background_stats();
    assert_eq!((s.commands, s.segments), (2, 32), "{s:?}");
}

#[test]
fn a_panicking_dispatcher_fails_requests_instead_of_hanging() {
    for dispatch in [DispatchKind::Queue, DispatchKind::TwoQ, DispatchKind::Elevator, DispatchKind::Hybrid] {
        let engine = Engine::open("emu:dram-ssd,size=4m,panic_nth=20", path(dispatch, CompletionKind::Poll)).unwrap();
        let failed = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let (engine, failed) = (&engine, &failed);
                s.spawn(move || {
                    let mut h = engine.handle(HandleOptions { depth: 4, buffers: 4, buffer_size: 4096 }).unwrap();
                    for i in 0..50u64 {
                        // Queued requests (through the dispatcher on every one of these paths).
                        for b in 0..4 {
                            h.submit(Op::Write, b, ((t * 200 + i * 4 + b as u64) % 1024) * 4096, 4096).unwrap();
                        }
                        h.commit().unwrap();
                        let mut done = Vec::new();
                        while done.len() < 4 {
                            h.reap(1, &mut done).unwrap();
                        }
                        let errors = done.iter().filter(|c| c.result.is_err()).count();
                        failed.fetch_add(errors, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        });
        // Every request came back; those after the panic with an error.
        assert!(failed.into_inner() > 0, "{dispatch:?}");
        let mut h = engine.handle(HandleOptions { depth: 1, buffers: 1, buffer_size: 4096 }).unwrap();
        h.submit(Op::Read, 0, 0, 4096).unwrap();
        h.commit().unwrap();
        let mut done = Vec::new();
        h.reap(1, &mut done).unwrap();
        let err = done[0].result.as_ref().unwrap_err().to_string();
        assert!(err.contains("recoverable"), "{dispatch:?}: {err}");
    }
}

#[test]
fn reading_the_path_counters_never_strands_a_waiter() {
    // Reading the combining strategy's counters holds its serving role for a moment; a
    // waiter that finds the role taken then may sleep, and must still be served. (It
    // was not: one thread at a time hung, with the reader gone.)
    for polling in [CombinePolling::Shared, CombinePolling::Winner] {
        for threads in [1u64, 4] {
            let p = PathConfig { combine_polling: polling, ..path(DispatchKind::Combine, CompletionKind::Poll) };
            let engine = Engine::open("emu:dram-ssd,size=1m", p).unwrap();
            within_two_minutes(&format!("{} polling, {threads} thread(s)", polling.name()), move || {
                let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
                std::thread::scope(|s| {
                    let reader = {
                        let (engine, stop) = (engine.clone(), Arc::clone(&stop));
                        s.spawn(move || {
                            let mut reads = 0u64;
                            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                                std::hint::black_box(engine.background_stats());
                                reads += 1;
                            }
                            reads
                        })
                    };
                    let workers: Vec<_> = (0..threads)
                        .map(|t| {
                            let engine = engine.clone();
                            s.spawn(move || {
                                let mut h =
                                    engine.handle(HandleOptions { depth: 1, buffers: 1, buffer_size: 4096 }).unwrap();
                                for i in 0..2000u64 {
                                    h.read_into(0, ((t * 64 + i % 64) % 256) * 4096, 4096).unwrap();
                                }
                            })
                        })
                        .collect();
                    for w in workers {
                        w.join().unwrap();
                    }
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    assert!(reader.join().unwrap() > 0);
                });
                let stats = engine.background_stats();
                assert_eq!(stats.segments, 2000 * threads, "every request was sent exactly once");
            });
        }
    }
}

#[test]
fn queued_requests_through_a_combining_path_keep_every_byte() {
    // The queued API on the combining paths: 8 threads, 8 requests in flight each,
    // written and read back through the same handles.
    for p in all_paths().into_iter().filter(|p| matches!(p.dispatch, DispatchKind::Combine | DispatchKind::Hybrid)) {
        let engine = Engine::open("emu:dram-ssd,size=4m", p.clone()).unwrap();
        std::thread::scope(|s| {
            for t in 0..8usize {
                let engine = engine.clone();
                let label = p.label();
                s.spawn(move || {
                    let mut h = engine.handle(HandleOptions { depth: 8, buffers: 8, buffer_size: 4096 }).unwrap();
                    for round in 0..4 {
                        let offset = |i: usize| ((t * 8 + i) * 4096) as u64;
                        for i in 0..8 {
                            h.buffer(i).unwrap().copy_from_slice(&pattern(t, round, i, 4096));
                            h.submit(Op::Write, i, offset(i), 4096).unwrap();
                        }
                        h.commit().unwrap();
                        let mut done = Vec::new();
                        while done.len() < 8 {
                            h.reap(1, &mut done).unwrap();
                        }
                        assert!(done.iter().all(|c| c.result.is_ok()), "{label}: a write failed");
                        for i in 0..8 {
                            h.buffer(i).unwrap().fill(0);
                            h.submit(Op::Read, i, offset(i), 4096).unwrap();
                        }
                        h.commit().unwrap();
                        done.clear();
                        while done.len() < 8 {
                            h.reap(1, &mut done).unwrap();
                        }
                        for i in 0..8 {
                            assert_eq!(
                                h.buffer(i).unwrap(),
                                &pattern(t, round, i, 4096)[..],
                                "{label}: thread {t} slot {i}"
                            );
                        }
                    }
                });
            }
        });
    }
}

#[test]
fn a_panic_while_combining_hands_the_role_on_instead_of_hanging() {
    // The device panics inside one caller's serving turn. That caller's thread
    // unwinds; every other thread's requests still complete or fail (the panicked
    // command's requests time out), and nobody sleeps forever on a role whose
    // holder is gone.
    for polling in [CombinePolling::Shared, CombinePolling::Winner] {
        let p = PathConfig {
            combine_polling: polling,
            timeout: Duration::from_millis(500),
            ..PathConfig::new(DispatchKind::Combine, CompletionKind::Poll)
        };
        let engine = Engine::open("emu:dram-ssd,size=4m,panic_nth=40", p).unwrap();
        within_two_minutes(&format!("{} polling", polling.name()), move || {
            let outcomes: Vec<std::thread::Result<(usize, usize)>> = std::thread::scope(|s| {
                let threads: Vec<_> = (0..4u64)
                    .map(|t| {
                        let engine = &engine;
                        s.spawn(move || {
                            let mut h =
                                engine.handle(HandleOptions { depth: 1, buffers: 1, buffer_size: 4096 }).unwrap();
                            let (mut ok, mut failed) = (0, 0);
                            for i in 0..100u64 {
                                match h.write_from(0, ((t * 100 + i) % 1024) * 4096, 4096) {
                                    Ok(_) => ok += 1,
                                    Err(_) => failed += 1,
                                }
                            }
                            (ok, failed)
                        })
                    })
                    .collect();
                threads.into_iter().map(|t| t.join()).collect()
            });
            let panicked = outcomes.iter().filter(|o| o.is_err()).count();
            assert_eq!(panicked, 1, "exactly the thread serving when the device panicked unwinds");
            for (ok, failed) in outcomes.into_iter().flatten() {
                assert_eq!(ok + failed, 100, "every request of the other threads came back");
            }
        });
    }
}

#[test]
fn a_device_queue_full_of_finished_commands_does_not_livelock_the_server() {
    // One request per command and more requests than the serving queue has slots:
    // the queue fills with commands the device handed back while a backlog waits.
    // (Found by `iopath soak --seed 1 --round 204 --dir /tmp`: the server kept trying
    // to send the backlog before finishing anything, and spun for good.)
    for dispatch in [DispatchKind::Combine, DispatchKind::Queue, DispatchKind::Hybrid] {
        for spec in ["emu:null,size=1m,spike_rate=0.05,spike=2ms", "emu:dram-ssd,size=1m,spike_rate=0.05,spike=2ms"] {
            let p = PathConfig { max_segments: Some(1), ..path(dispatch, CompletionKind::Poll) };
            let what = format!("{spec} on {}", p.label());
            within_two_minutes(&what.clone(), move || {
                let engine = Engine::open(spec, p).unwrap();
                std::thread::scope(|s| {
                    for t in 0..16u64 {
                        let engine = engine.clone();
                        s.spawn(move || {
                            let mut h =
                                engine.handle(HandleOptions { depth: 4, buffers: 4, buffer_size: 512 }).unwrap();
                            let mut done = Vec::new();
                            for round in 0..50u64 {
                                if t % 2 == 0 {
                                    h.read_into(0, (t * 64 + round % 64) * 512, 512).unwrap();
                                } else {
                                    for slot in 0..4 {
                                        h.submit(Op::Read, slot, (t * 64 + slot as u64) * 512, 512).unwrap();
                                    }
                                    h.commit().unwrap();
                                    while h.queued() > 0 {
                                        h.reap(1, &mut done).unwrap();
                                    }
                                }
                            }
                        });
                    }
                });
            });
        }
    }
}

/// A queue of depth 8 on io_uring over a 1 MiB file `name` in `dir`.
fn uring_queue_on_a_file(dir: &std::path::Path, name: &str) -> Box<dyn iopath::device::Queue> {
    let device = open_device(&format!("uring:{}", dir.join(name).display()), Some(1 << 20)).unwrap();
    device.open_queue(&iopath::device::QueueConfig::depth(8)).unwrap()
}

#[test]
fn uring_cancels_a_command_and_still_hands_it_back() {
    use iopath::device::{Cancel, Command};
    let dir = tempfile::tempdir().unwrap();
    let mut q = uring_queue_on_a_file(dir.path(), "c.img");
    let mut bufs: Vec<IoBuf> = (0..4).map(|_| IoBuf::new(4096)).collect();
    for (tag, buf) in bufs.iter_mut().enumerate() {
        let mut c = Command::with_capacity(1);
        c.reset(Op::Read, tag as u64);
        c.push(tag as u64 * 4096, buf.as_mut_ptr(), 4096);
        // SAFETY: the buffers outlive the waits below.
        unsafe { q.submit(c) };
    }
    q.commit().unwrap();
    // Cancel one (it may already be done: then it keeps its result) and all the rest.
    q.cancel(Cancel::Tag(1)).unwrap();
    q.cancel(Cancel::All).unwrap();
    let mut out = Vec::new();
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while out.len() < 4 && std::time::Instant::now() < give_up {
        q.wait(&mut out, 10_000_000).unwrap();
    }
    assert_eq!(out.len(), 4, "every command came back exactly once");
    assert_eq!(q.in_flight(), 0);
    for c in &out {
        let r = c.segments[0].result;
        assert!(r == 4096 || r == -libc::ECANCELED, "tag {}: {r}", c.tag);
    }
    // The cancellations' own completions are not mistaken for commands: the ring works on.
    let mut c = Command::with_capacity(1);
    c.reset(Op::Read, 9);
    c.push(0, bufs[0].as_mut_ptr(), 4096);
    // SAFETY: the buffer outlives the wait below.
    unsafe { q.submit(c) };
    q.commit().unwrap();
    out.clear();
    while out.is_empty() {
        q.wait(&mut out, 10_000_000).unwrap();
    }
    assert_eq!((out[0].tag, out[0].segments[0].result), (9, 4096));
}

#[test]
fn a_uring_wait_or_look_sends_what_was_left_uncommitted() {
    // A sleeping caller leaves its commit to the wait (one io_uring_enter submits
    // and sleeps); a policy that looks first must send it too, or nothing ever comes.
    use iopath::device::{Command, QueueConfig};
    let dir = tempfile::tempdir().unwrap();
    let mut q = uring_queue_on_a_file(dir.path(), "s.img");
    assert!(q.sends_when_waiting());
    let mut buf = IoBuf::new(4096);
    let mut out = Vec::new();
    for (round, wait) in [(0u64, true), (1, false), (2, true)] {
        let mut c = Command::with_capacity(1);
        c.reset(Op::Read, round);
        c.push(round * 4096, buf.as_mut_ptr(), 4096);
        // SAFETY: the buffer outlives the waits below.
        unsafe { q.submit(c) };
        out.clear();
        if wait {
            // One wait, long enough that a wait which sent nothing fails the test.
            assert_eq!(q.wait(&mut out, 60_000_000_000).unwrap(), 1, "round {round}");
        } else {
            let give_up = std::time::Instant::now() + Duration::from_secs(10);
            while out.is_empty() && std::time::Instant::now() < give_up {
                q.reap(&mut out).unwrap();
            }
        }
        assert_eq!(out.len(), 1, "round {round}");
        assert_eq!((out[0].tag, out[0].segments[0].result), (round, 4096));
    }
    // An SQPOLL ring's thread takes what is queued: only a commit sends there.
    let spec = format!("uring:{},size=1m,sqpoll=1", dir.path().join("sq.img").display());
    let q = open_device(&spec, None).unwrap().open_queue(&QueueConfig::depth(8)).unwrap();
    assert!(!q.sends_when_waiting());
}

/// Bytes this thread's read and write system calls moved so far
/// (`/proc/thread-self/io`: `rchar` and `wchar`; I/O through a ring counts in
/// neither). Bytes, not calls: a yielding wait reads `/proc/loadavg` now and
/// then to see whether others want the CPUs, a few dozen bytes a call, and on
/// a loaded machine (the test binaries run in a loop three at a time) those
/// calls alone reached 30 in 50 writes and reads.
fn thread_io_bytes() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/thread-self/io").unwrap();
    let field =
        |name: &str| -> u64 { text.lines().find_map(|l| l.strip_prefix(name)).unwrap().trim().parse().unwrap() };
    (field("rchar:"), field("wchar:"))
}

#[test]
fn a_request_whose_waiter_sleeps_is_the_kernels_own_blocking_call() {
    // A thread that sleeps per request gains nothing from a ring: on io_uring,
    // sync-intr reads and writes with pread/pwrite (counted in the thread's rchar
    // and wchar, which ring I/O is not), and sync-yield goes through the ring.
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("uring:{}", dir.path().join("b.img").display());
    for (path, blocking) in [("sync-intr", true), ("sync-yield", false)] {
        let engine = Engine::open(&format!("{spec},size=1m"), PathConfig::preset(path).unwrap()).unwrap();
        let mut block = IoBuf::new(4096);
        let mut back = IoBuf::new(4096);
        let before = thread_io_bytes();
        for i in 0..50u64 {
            block.fill(i as u8);
            engine.write_at(&block, i * 4096).unwrap();
            engine.read_at(&mut back, i * 4096).unwrap();
            assert!(back.iter().all(|&b| b == i as u8), "{path}: block {i}");
        }
        let after = thread_io_bytes();
        let (read, written) = (after.0 - before.0, after.1 - before.1);
        if blocking {
            assert!(read >= 50 * 4096 && written >= 50 * 4096, "{path}: {read} bytes read, {written} written");
        } else {
            assert!(read < 25 * 4096 && written < 25 * 4096, "{path}: {read} bytes read, {written} written");
        }
    }
}

#[test]
fn a_uring_queue_makes_blocking_calls_for_everything_but_trims() {
    use iopath::device::{Command, Durability};
    let dir = tempfile::tempdir().unwrap();
    let mut q = uring_queue_on_a_file(dir.path(), "p.img");
    let mut buf = IoBuf::new(4096);
    buf.fill(0x3c);
    let mut c = Command::with_capacity(1);
    c.reset(Op::Write, 1);
    c.push(8192, buf.as_mut_ptr(), 4096);
    // SAFETY: the buffer outlives the call.
    assert!(unsafe { q.run_blocking(&mut c) });
    assert_eq!(c.segments[0].result, 4096);
    let mut back = IoBuf::new(4096);
    c.reset(Op::Read, 2);
    c.push(8192, back.as_mut_ptr(), 4096);
    // SAFETY: as above.
    assert!(unsafe { q.run_blocking(&mut c) });
    assert_eq!(c.segments[0].result, 4096);
    assert!(back.iter().all(|&b| b == 0x3c));
    // A flush is a datasync, and a durable write a write and a datasync (an
    // ordered one a datasync first): on io_uring each ran on the kernel's
    // workers, two more wake-ups for a thread that sleeps anyway.
    c.reset(Op::Flush, 3);
    // SAFETY: no buffer.
    assert!(unsafe { q.run_blocking(&mut c) });
    assert_eq!(c.result, 0);
    for (tag, durability) in [(4, Durability::Ordered), (5, Durability::Fua)] {
        buf.fill(tag as u8);
        c.reset(Op::Write, tag);
        c.durability = durability;
        c.push(0, buf.as_mut_ptr(), 4096);
        // SAFETY: as above.
        assert!(unsafe { q.run_blocking(&mut c) });
        assert_eq!((c.result, c.segments[0].result), (0, 4096), "{durability:?}");
        c.reset(Op::Read, 6);
        c.push(0, back.as_mut_ptr(), 4096);
        // SAFETY: as above.
        assert!(unsafe { q.run_blocking(&mut c) });
        assert!(back.iter().all(|&b| b == tag as u8), "{durability:?}");
    }
    // Trims go through the ring.
    c.reset(Op::Trim, 7);
    c.push(0, std::ptr::null_mut(), 4096);
    // SAFETY: a trim has no buffer to touch.
    assert!(!unsafe { q.run_blocking(&mut c) });
    assert_eq!(q.in_flight(), 0);
}

#[test]
fn long_uring_waits_sleep_under_a_watchdog_whose_completion_is_no_command() {
    // A wait of a second or more sleeps with no timer of its own under a watchdog
    // timeout (100 ms) that stays in the ring after the wait is over; when it fires,
    // its completion must not be taken for a command's, and later waits re-arm it.
    use iopath::device::Command;
    let dir = tempfile::tempdir().unwrap();
    let mut q = uring_queue_on_a_file(dir.path(), "w.img");
    let mut buf = IoBuf::new(4096);
    let mut out = Vec::new();
    for round in 0..3u64 {
        let mut c = Command::with_capacity(1);
        c.reset(Op::Read, round);
        c.push(round * 4096, buf.as_mut_ptr(), 4096);
        // SAFETY: the buffer outlives the waits below.
        unsafe { q.submit(c) };
        q.commit().unwrap();
        out.clear();
        let give_up = std::time::Instant::now() + Duration::from_secs(10);
        while out.is_empty() && std::time::Instant::now() < give_up {
            q.wait(&mut out, 5_000_000_000).unwrap();
        }
        assert_eq!(out.len(), 1, "round {round}");
        assert_eq!((out[0].tag, out[0].segments[0].result), (round, 4096));
        assert_eq!(q.in_flight(), 0);
        // Let the watchdog fire; the next look drains its completion.
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(q.reap(&mut out).unwrap(), 0);
    }
}

#[test]
fn requests_to_a_block_device_are_no_larger_than_it_takes_whole() {
    // A request the kernel would split never goes out: split polled requests hang on
    // Debian's 6.1 NVMe driver (found by scripts/nvme-guest).
    common::with_loop_device("requests_to_a_block_device_are_no_larger_than_it_takes_whole", |dev| {
        let name = dev.path.file_name().unwrap().to_string_lossy().into_owned();
        let read = |f: &str| -> u32 {
            std::fs::read_to_string(format!("/sys/block/{name}/queue/{f}")).unwrap().trim().parse().unwrap()
        };
        let limit = (read("max_sectors_kb") * 1024).min(read("max_segments") * 4096).min(1 << 20);
        for backend in ["uring", "psync"] {
            let device = open_device(&format!("{backend}:{}", dev.path.display()), None).unwrap();
            assert_eq!(device.capabilities().max_segment_bytes, limit, "{backend}");
        }
        let err = common::fails(&[
            "bench",
            "--device",
            &format!("uring:{}", dev.path.display()),
            "--bs",
            &format!("{}", limit * 2),
            "--ios",
            "1",
        ]);
        assert!(err.contains("--bs") && err.contains("in one request"), "{err}");
    });
}

#[test]
fn an_sqpoll_ring_works_and_refuses_task_work_flags_with_a_reason() {
    // The kernel takes no task-work flag on an SQPOLL ring (EINVAL): iopath once
    // asked for COOP_TASKRUN there and every sqpoll=1 run failed at setup.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sq.img");
    let spec = format!("uring:{},size=1m,sqpoll=1", file.display());
    for path in ["sync-path", "sync-intr", "sync-yield"] {
        let engine = Engine::open(&spec, PathConfig::preset(path).unwrap()).unwrap();
        let mut block = IoBuf::new(4096);
        block.fill(path.len() as u8);
        engine.write_at(&block, 8192).unwrap();
        let mut back = IoBuf::new(4096);
        engine.read_at(&mut back, 8192).unwrap();
        assert!(back.iter().all(|&b| b == path.len() as u8), "{path}");
    }
    let Err(e) = Engine::open(&format!("{spec},taskrun=coop"), PathConfig::preset("sync-path").unwrap()) else {
        panic!("taskrun=coop with sqpoll=1 was accepted")
    };
    assert!(e.to_string().contains("sqpoll"), "{e}");
}

#[test]
fn a_dropped_engine_lets_go_of_its_device_in_every_thread_that_used_it() {
    use iopath::device::Device;
    let device: Arc<dyn Device> = open_device("emu:null,size=1m", None).unwrap();
    let engine = Engine::with_device(Arc::clone(&device), PathConfig::preset("sync-path").unwrap()).unwrap();
    let mut buf = vec![0u8; 4096];
    engine.read_at(&mut buf, 0).unwrap(); // keeps a handle for this thread
    assert!(Arc::strong_count(&device) > 1);
    drop(engine);
    // The next use of any engine by this thread drops the dead engine's handle.
    let other = Engine::open("emu:null,size=1m", PathConfig::preset("sync-path").unwrap()).unwrap();
    other.read_at(&mut buf, 0).unwrap();
    assert_eq!(Arc::strong_count(&device), 1, "the dropped engine's thread handle still holds the device");
}

/// A polled read of a file's hole never reaches a device, so it "worked" and
/// IOPOLL was turned on for a sparse file on a device without poll queues;
/// every read of written data then failed with EOPNOTSUPP (found through the
/// LD_PRELOAD interposer, whose programs make sparse files with ftruncate).
#[test]
fn uring_on_a_sparse_file_does_not_mistake_a_hole_for_kernel_polling() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sparse.img");
    std::fs::File::create(&file).unwrap().set_len(1 << 20).unwrap();
    let engine = Engine::open(&format!("uring:{}", file.display()), PathConfig::preset("sync-path").unwrap()).unwrap();
    let data = IoBuf::from_slice(&[0x5a; 4096]);
    engine.write_at(&data, 8192).unwrap();
    let mut back = IoBuf::new(4096);
    engine.read_at(&mut back, 8192).expect("a read of written data on a sparse file");
    assert_eq!(&back[..], &data[..]);
}

/// Ordered (flush, then a FUA write, one command) and FUA writes work on
/// every backend and through the merging paths, and are never merged with
/// plain writes: every byte of many threads' mixed writes lands.
#[test]
fn durable_writes_land_on_every_backend_and_path_beside_plain_ones() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("durable.img");
    std::fs::File::create(&file).unwrap().set_len(1 << 20).unwrap();
    let specs = [
        "emu:null,size=1m,wcache=1".to_string(),
        format!("uring:{}", file.display()),
        format!("psync:{}", file.display()),
        format!("aio:{}", file.display()),
        "emu:null,size=1m,audit=1,spike_rate=0.2,spike=20us".to_string(),
    ];
    for spec in &specs {
        for path in ["sync-path", "sync-yield", "stm", "htm", "2q"] {
            let engine = Arc::new(Engine::open(spec, PathConfig::preset(path).unwrap()).unwrap());
            std::thread::scope(|s| {
                for t in 0..4u64 {
                    let engine = Arc::clone(&engine);
                    s.spawn(move || {
                        for i in 0..16u64 {
                            let block = t * 16 + i;
                            let data = IoBuf::from_slice(&[(block as u8) ^ 0xa5; 4096]);
                            match i % 3 {
                                0 => engine.write_at(&data, block * 4096).unwrap(),
                                1 => engine.write_durable_at(&data, block * 4096).unwrap(),
                                _ => engine.write_fua_at(&data, block * 4096).unwrap(),
                            }
                        }
                    });
                }
            });
            for block in 0..64u64 {
                let mut back = IoBuf::new(4096);
                engine.read_at(&mut back, block * 4096).unwrap();
                assert!(back.iter().all(|&b| b == (block as u8) ^ 0xa5), "{spec} {path}: block {block}");
            }
        }
    }
}

/// A durable write that cannot be written reports its error (no hang, no
/// silent success), the device's own where its flush failed first.
#[test]
fn a_failed_durable_write_reports_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ro.img");
    std::fs::File::create(&file).unwrap().set_len(1 << 20).unwrap();
    for spec in [format!("uring:{},readonly=1", file.display()), format!("psync:{},readonly=1", file.display())] {
        let engine = Engine::open(&spec, PathConfig::preset("sync-path").unwrap()).unwrap();
        let e = engine.write_durable_at(&IoBuf::from_slice(&[1u8; 4096]), 0).unwrap_err();
        assert!(!e.to_string().is_empty(), "{spec}");
        assert!(engine.write_fua_at(&IoBuf::from_slice(&[1u8; 4096]), 0).is_err(), "{spec}");
    }
    let engine = Engine::open("emu:null,size=1m,fail_range=0-4k", PathConfig::preset("stm").unwrap()).unwrap();
    assert!(engine.write_durable_at(&IoBuf::from_slice(&[1u8; 4096]), 0).is_err());
    engine.write_durable_at(&IoBuf::from_slice(&[1u8; 4096]), 8192).unwrap();
}

/// io_uring cancels what a thread sent that still waits for its workers (a
/// flush, a `RWF_DSYNC` write) when that thread exits; on a queue that threads
/// take turns on (`combine`'s) the sender may leave before anyone waits. Such
/// a command is sent again by whoever reaps it, never handed back cancelled
/// (seen as a rare ECANCELED of `stm`'s durable writes on a file).
#[test]
fn a_command_the_kernel_cancels_when_its_sender_exits_is_sent_again() {
    use iopath::device::{Command, Durability, QueueConfig};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("leaver.img");
    let device = open_device(&format!("uring:{}", file.display()), Some(1 << 20)).unwrap();
    for round in 0..40u64 {
        let mut buf = IoBuf::from_slice(&[round as u8; 4096]);
        let addr = buf.as_mut_ptr() as usize;
        let mut queue = device.open_queue(&QueueConfig { shared: true, ..QueueConfig::depth(4) }).unwrap();
        // Sent by a thread that exits at once; reaped by this one.
        let mut queue = std::thread::scope(|s| {
            s.spawn(move || {
                let mut c = Command::with_capacity(1);
                c.reset(Op::Write, round);
                c.durability = if round % 2 == 0 { Durability::Ordered } else { Durability::Fua };
                c.push(round * 4096, addr as *mut u8, 4096);
                // SAFETY: the buffer outlives the command, which is reaped below.
                unsafe { queue.submit(c) };
                queue.commit().unwrap();
                queue
            })
            .join()
            .unwrap()
        });
        let mut out = Vec::new();
        while out.is_empty() {
            queue.wait(&mut out, 1_000_000_000).unwrap();
        }
        let c = &out[0];
        assert!(
            c.result >= 0 && c.segments[0].result == 4096,
            "round {round}: {:?} {}",
            c.result,
            c.segments[0].result
        );
    }
}
