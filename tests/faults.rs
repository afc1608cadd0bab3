//! Every path under every failure point, on every backend: requests complete
//! or report their error, none hangs, none is lost, and no buffer is touched
//! by the device after its request returned.
//!
//! The devices are wrapped by iopath's fault wrapper, whose ownership audit
//! works like late DMA: a read's data lands in the caller's buffer only when
//! the device hands the command back, and a buffer that changed while the
//! device owned it is counted as a violation. A path that returned a request
//! early (an error path that forgot a command in flight) would let the
//! caller reuse the buffer and show up here. The threads and their checks
//! are `iopath soak`'s ([`exercise`]); here they run a fixed matrix.

mod common;

use common::within_two_minutes;
use iopath::Engine;
use iopath::bench::soak::{Exercise, exercise};
use iopath::path::{CombinePolling, CompletionKind, DispatchKind, PathConfig};
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

fn run_case(spec: String, path: PathConfig, must_fail: bool) {
    let what = format!(
        "{spec} on {}{}",
        path.label(),
        if path.combine_polling == CombinePolling::Winner { "@winner" } else { "" }
    );
    within_two_minutes(&what.clone(), move || {
        let engine = Engine::open(&spec, path).unwrap_or_else(|e| panic!("{what}: {e}"));
        let plan = Exercise {
            threads: THREADS,
            ops_per_thread: OPS_PER_THREAD,
            depth: 4,
            blocks_per_thread: BLOCKS_PER_THREAD,
            block_size: BS,
            flush_every: 0,
            fault_errno: libc::EIO,
        };
        // Checks every byte, that no request is lost, and the ownership audit.
        let tally = exercise(&engine, &plan, 0x10_9a7).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(tally.issued, (THREADS * OPS_PER_THREAD) as u64, "{what}: every request was issued");
        let stats = engine.device().stats();
        assert_eq!(stats.ownership_violations, 0, "{what}");
        assert!(stats.faults_injected > 0, "{what}: no fault was injected");
        if must_fail {
            assert!(tally.failed > 0, "{what}: faults were injected but no request failed");
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

/// A device that stopped answering: every wait and reap for completions
/// fails, so no command ever comes back the usual way. Each request must
/// still end (a hang fails the test after two minutes), with a timeout
/// error, soon after its timeout (its command is
/// cancelled, then given up on once the device has not answered for a whole
/// timeout), on every dispatch strategy and completion policy; and the
/// ownership audit must show that no buffer was touched after its request
/// returned. Found by the parsers' property test, where such a device hung
/// `read_at` for good.
#[test]
fn a_device_that_stops_answering_fails_every_request_without_hanging() {
    for dispatch in DispatchKind::ALL {
        for completion in CompletionKind::ALL {
            let path = PathConfig { timeout: TIMEOUT, ..PathConfig::new(dispatch, completion) };
            let what = format!("{} with every wait failing", path.label());
            within_two_minutes(&what.clone(), move || {
                let engine = Engine::open("emu:dram-ssd,size=1m,wait_fail_rate=1", path)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                std::thread::scope(|s| {
                    for t in 0..3u64 {
                        let (engine, what) = (&engine, &what);
                        s.spawn(move || {
                            let mut buf = iopath::IoBuf::new(BS);
                            let read = engine.read_at(&mut buf, t * BS as u64);
                            assert!(matches!(read, Err(iopath::Error::Timeout { .. })), "{what}: read gave {read:?}");
                            let write = engine.write_at(&buf, t * BS as u64);
                            assert!(
                                matches!(write, Err(iopath::Error::Timeout { .. })),
                                "{what}: write gave {write:?}"
                            );
                        });
                    }
                });
                assert_eq!(engine.device().stats().ownership_violations, 0, "{what}");
            });
        }
    }
}
