//! Every path under every failure point, on every backend: requests complete
//! or report their error, none hangs, none is lost, and no buffer is touched
//! by the device after its request returned.
//!
//! The devices are wrapped by iopath's fault wrapper, whose ownership audit
//! works like late DMA: a read's data lands in the caller's buffer only when
//! the device hands the command back, and a buffer that changed while the
//! device owned it is counted as a violation. A path that returned a request
//! early (an error path that forgot a command in flight) would let the
//! caller reuse the buffer and show up here.

mod common;

use common::within_two_minutes;
use iopath::path::{CombinePolling, CompletionKind, DispatchKind, PathConfig};
use iopath::{Engine, Error, HandleOptions, IoBuf};
use std::time::Duration;

const BS: usize = 4096;
const BLOCKS_PER_THREAD: u64 = 8;
const THREADS: usize = 8;
const OPS_PER_THREAD: usize = 48;
/// The path timeout: long enough that only a hung or deliberately slow
/// command times out, short enough to keep the matrix quick.
const TIMEOUT: Duration = Duration::from_millis(100);

/// The faults tried, each alone: (name, device options).
const FAULTS: &[(&str, &str)] = &[
    ("segment errors", "fail_rate=0.03"),
    ("refused commands", "fail_nth=20"),
    ("failed commits", "commit_fail_rate=0.03"),
    ("failed waits", "wait_fail_rate=0.02"),
    ("a hung command", "hang_nth=30"),
    ("latency spikes", "spike_rate=0.05,spike=500us"),
    // Cancelled at the timeout, but (like block I/O under way) it cannot stop: it
    // comes back late, and its data lands in the buffer only then.
    ("commands slower than the timeout", "spike_rate=0.04,spike=150ms"),
];

/// The versions a block may hold: one after a successful write or read, more
/// after writes that failed (a failed write may or may not have reached the
/// device).
#[derive(Clone, Debug)]
struct Expect(Vec<u64>);

impl Expect {
    fn new() -> Expect {
        Expect(vec![0])
    }

    fn allows(&self, v: u64) -> bool {
        self.0.contains(&v)
    }

    fn is(&mut self, v: u64) {
        self.0.clear();
        self.0.push(v);
    }

    fn maybe(&mut self, v: u64) {
        self.0.push(v);
    }
}

/// Version `version` of block `block` of thread `thread`: a header naming it,
/// then bytes derived from it.
fn fill(buf: &mut [u8], thread: usize, block: u64, version: u64) {
    if version == 0 {
        buf.fill(0);
        return;
    }
    buf[0..8].copy_from_slice(&(thread as u64).to_le_bytes());
    buf[8..16].copy_from_slice(&block.to_le_bytes());
    buf[16..24].copy_from_slice(&version.to_le_bytes());
    let mut rng = fastrand::Rng::with_seed((thread as u64) << 48 ^ block << 32 ^ version);
    buf[24..].iter_mut().for_each(|b| *b = rng.u8(..));
}

/// The version a read block holds, after checking every byte of it.
fn version_of(buf: &[u8], thread: usize, block: u64, what: &str) -> u64 {
    let word = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().unwrap());
    let version = if buf.iter().all(|&b| b == 0) { 0 } else { word(16) };
    let mut want = vec![0u8; buf.len()];
    fill(&mut want, thread, block, version);
    assert!(buf == &want[..], "{what}: thread {thread} block {block} holds torn or foreign data (header v{version})");
    version
}

#[derive(Default, Debug)]
struct Tally {
    ok: u64,
    failed: u64,
}

fn check_error(e: &Error, what: &str) {
    match e {
        Error::Device { errno, .. } if *errno == libc::EIO => {}
        Error::Timeout { .. } => {}
        other => panic!("{what}: unexpected error kind: {other}"),
    }
}

/// A thread using the blocking API.
fn blocking_thread(engine: &Engine, t: usize, what: &str) -> Tally {
    let mut tally = Tally::default();
    let mut rng = fastrand::Rng::with_seed(t as u64);
    let mut expect = vec![Expect::new(); BLOCKS_PER_THREAD as usize];
    let mut buf = IoBuf::new(BS);
    for op in 0..OPS_PER_THREAD {
        let b = rng.u64(..BLOCKS_PER_THREAD);
        let offset = (t as u64 * BLOCKS_PER_THREAD + b) * BS as u64;
        if rng.bool() {
            let version = (op + 1) as u64;
            fill(&mut buf, t, b, version);
            match engine.write_at(&buf, offset) {
                Ok(()) => {
                    tally.ok += 1;
                    expect[b as usize].is(version);
                }
                Err(e) => {
                    check_error(&e, what);
                    tally.failed += 1;
                    expect[b as usize].maybe(version);
                }
            }
        } else {
            buf.fill(0xee);
            match engine.read_at(&mut buf, offset) {
                Ok(()) => {
                    tally.ok += 1;
                    let v = version_of(&buf, t, b, what);
                    assert!(
                        expect[b as usize].allows(v),
                        "{what}: block {b} of thread {t} holds v{v}, expected {:?}",
                        expect[b as usize]
                    );
                    expect[b as usize].is(v);
                }
                Err(e) => {
                    check_error(&e, what);
                    tally.failed += 1;
                }
            }
        }
    }
    tally
}

/// A thread using the queued API at depth 4, on 4 distinct blocks at a time.
fn queued_thread(engine: &Engine, t: usize, what: &str) -> Tally {
    const DEPTH: usize = 4;
    let mut tally = Tally::default();
    let mut rng = fastrand::Rng::with_seed(t as u64);
    let mut expect = vec![Expect::new(); BLOCKS_PER_THREAD as usize];
    let mut h = engine.handle(HandleOptions { depth: DEPTH as u32, buffers: DEPTH, buffer_size: BS }).unwrap();
    let mut done = Vec::new();
    for round in 0..OPS_PER_THREAD / DEPTH {
        let mut blocks: Vec<u64> = (0..BLOCKS_PER_THREAD).collect();
        rng.shuffle(&mut blocks);
        let mut writes = [None; DEPTH];
        for (slot, &b) in blocks[..DEPTH].iter().enumerate() {
            let offset = (t as u64 * BLOCKS_PER_THREAD + b) * BS as u64;
            let op = if rng.bool() {
                let version = (round * DEPTH + slot + 1) as u64;
                fill(h.buffer(slot).unwrap(), t, b, version);
                writes[slot] = Some(version);
                iopath::device::Op::Write
            } else {
                h.buffer(slot).unwrap().fill(0xee);
                iopath::device::Op::Read
            };
            h.submit(op, slot, offset, BS).unwrap();
        }
        h.commit().unwrap();
        while h.queued() > 0 {
            h.reap(1, &mut done).unwrap();
        }
        for c in done.drain(..) {
            let slot = c.tag as usize;
            let b = blocks[slot];
            match (&c.result, writes[slot]) {
                (Ok(()), Some(v)) => expect[b as usize].is(v),
                (Ok(()), None) => {
                    let v = version_of(h.buffer(slot).unwrap(), t, b, what);
                    assert!(expect[b as usize].allows(v), "{what}: queued block {b} of thread {t} holds v{v}");
                    expect[b as usize].is(v);
                }
                (Err(e), Some(v)) => {
                    check_error(e, what);
                    expect[b as usize].maybe(v);
                }
                (Err(e), None) => check_error(e, what),
            }
            if c.result.is_ok() {
                tally.ok += 1;
            } else {
                tally.failed += 1;
            }
        }
    }
    tally
}

fn run_case(spec: String, path: PathConfig, must_fail: bool) {
    let what = format!(
        "{spec} on {}{}",
        path.label(),
        if path.combine_polling == CombinePolling::Winner { "@winner" } else { "" }
    );
    within_two_minutes(&what.clone(), move || {
        let engine = Engine::open(&spec, path).unwrap_or_else(|e| panic!("{what}: {e}"));
        let tallies: Vec<Tally> = std::thread::scope(|s| {
            let threads: Vec<_> =
                (0..THREADS)
                    .map(|t| {
                        let (engine, what) = (&engine, &what);
                        s.spawn(move || {
                            if t % 2 == 0 { blocking_thread(engine, t, what) } else { queued_thread(engine, t, what) }
                        })
                    })
                    .collect();
            threads.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let ok: u64 = tallies.iter().map(|t| t.ok).sum();
        let failed: u64 = tallies.iter().map(|t| t.failed).sum();
        let expected = (THREADS / 2 * OPS_PER_THREAD + THREADS / 2 * (OPS_PER_THREAD / 4 * 4)) as u64;
        assert_eq!(ok + failed, expected, "{what}: every request completes or reports its error");
        let stats = engine.device().stats();
        assert_eq!(stats.ownership_violations, 0, "{what}: a buffer was touched while the device owned it");
        assert!(stats.faults_injected > 0, "{what}: no fault was injected");
        if must_fail {
            assert!(failed > 0, "{what}: faults were injected but no request failed");
        }
    });
}

fn paths() -> Vec<PathConfig> {
    let mut out = Vec::new();
    for d in DispatchKind::ALL {
        for c in [CompletionKind::Poll, CompletionKind::Interrupt] {
            let p = PathConfig { timeout: TIMEOUT, ..PathConfig::new(d, c) };
            if d == DispatchKind::Combine {
                out.push(PathConfig { combine_polling: CombinePolling::Winner, ..p.clone() });
            }
            out.push(p);
        }
    }
    out.push(PathConfig { timeout: TIMEOUT, ..PathConfig::new(DispatchKind::Combine, CompletionKind::Adaptive) });
    out
}

/// Spikes and failed waits make requests slower, not failed.
fn must_fail(options: &str) -> bool {
    !options.starts_with("spike") && !options.starts_with("wait_fail")
}

#[test]
fn every_path_under_every_fault_on_the_emulated_ssd() {
    for (_, options) in FAULTS {
        for path in paths() {
            run_case(format!("emu:dram-ssd,size=1m,{options}"), path, must_fail(options));
        }
    }
}

#[test]
fn every_fault_on_psync_and_uring_files() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("faults.img");
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let subset: Vec<PathConfig> = paths()
        .into_iter()
        .filter(|p| matches!(p.dispatch, DispatchKind::Direct | DispatchKind::Combine | DispatchKind::TwoQ))
        .collect();
    for backend in ["psync", "uring"] {
        for (_, options) in FAULTS {
            for path in &subset {
                // Each case starts from zeros: the checker knows only what this case wrote.
                std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
                run_case(format!("{backend}:{},{options}", file.display()), path.clone(), must_fail(options));
            }
        }
    }
}
