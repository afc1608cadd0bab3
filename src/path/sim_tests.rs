//! Path logic on simulated time: deterministic checks of device times,
//! timeouts and unplug timers that real clocks on a shared 2-vCPU machine
//! could only check loosely. Every clock read advances simulated time by a
//! small step and every sleep jumps to its deadline (`clock::sim`), so a
//! 50 ms timeout takes 50 simulated milliseconds and almost no real time.

use crate::clock::{now_ns, sim};
use crate::engine::{Engine, HandleOptions};
use crate::error::Error;
use crate::path::{CompletionKind, DispatchKind, PathConfig};
use std::time::Duration;

/// Simulated nanoseconds per clock read.
const STEP_NS: u64 = 10;
const TIMEOUT: Duration = Duration::from_millis(50);

fn path(dispatch: DispatchKind, completion: CompletionKind) -> PathConfig {
    PathConfig { timeout: TIMEOUT, ..PathConfig::new(dispatch, completion) }
}

#[test]
fn a_request_sees_exactly_the_modelled_device_time() {
    for dispatch in [DispatchKind::Direct, DispatchKind::Combine] {
        for completion in [CompletionKind::Poll, CompletionKind::Interrupt] {
            let _sim = sim::start(1_000_000_000, STEP_NS);
            let engine = Engine::open("emu:dram-ssd,size=1m", path(dispatch, completion)).unwrap();
            let mut h = engine.handle(HandleOptions::default()).unwrap();
            let mut buf = [0u8; 4096];
            for i in 0..3u64 {
                let start = now_ns();
                let device_ns = h.read_at(&mut buf, i * 4096).unwrap();
                let took = now_ns() - start;
                // seed 000's DRAM-SSD: 1.52 us per command + 5.48 us per 4 KiB.
                assert_eq!(device_ns, 7_000, "{dispatch:?}+{completion:?}");
                assert!((7_000..9_000).contains(&took), "{dispatch:?}+{completion:?}: {took} ns");
            }
            assert_eq!(h.stats().requests, 3);
            if completion == CompletionKind::Poll {
                // A lone polling thread serves its own requests and never sleeps.
                assert_eq!(h.stats().wait.sleeps, 0, "{dispatch:?}");
            }
        }
    }
}

#[test]
fn a_hung_command_is_cancelled_at_the_timeout_and_fails_as_timed_out() {
    for dispatch in [DispatchKind::Direct, DispatchKind::Combine] {
        for completion in [CompletionKind::Poll, CompletionKind::Interrupt] {
            let what = format!("{dispatch:?}+{completion:?}");
            let _sim = sim::start(1_000_000_000, STEP_NS);
            let engine = Engine::open("emu:dram-ssd,size=1m,hang_nth=2", path(dispatch, completion)).unwrap();
            let mut h = engine.handle(HandleOptions::default()).unwrap();
            let mut buf = [0u8; 4096];
            h.read_at(&mut buf, 0).unwrap();
            let start = now_ns();
            let e = h.read_at(&mut buf, 4096).unwrap_err();
            let took = now_ns() - start;
            assert!(matches!(e, Error::Timeout { timeout_ms: 50, .. }), "{what}: {e}");
            let limit = TIMEOUT.as_nanos() as u64;
            assert!((limit..limit + 1_000_000).contains(&took), "{what}: timed out after {took} ns");
            // Counted on the channel that sent it: the handle's, or the serving role's.
            let cancels = h.stats().cancels + engine.background_stats().cancels;
            assert_eq!(cancels, 1, "{what}: the device was asked to cancel it once");
            // The path goes on working.
            h.read_at(&mut buf, 8192).unwrap();
        }
    }
}

#[test]
fn a_command_slower_than_the_timeout_is_waited_for_and_keeps_its_result() {
    let _sim = sim::start(1_000_000_000, STEP_NS);
    // Every command takes 80 ms more and cannot be cancelled meanwhile.
    let engine = Engine::open(
        "emu:dram-ssd,size=1m,spike_rate=1,spike=80ms",
        path(DispatchKind::Direct, CompletionKind::Interrupt),
    )
    .unwrap();
    let mut h = engine.handle(HandleOptions::default()).unwrap();
    let start = now_ns();
    h.read_at(&mut [0u8; 4096], 0).unwrap();
    let took = now_ns() - start;
    assert!(took >= 80_000_000, "came back early: {took} ns");
    assert_eq!(h.stats().cancels, 1, "cancelled at 50 ms, then waited for");
}

#[test]
fn a_lone_queued_request_waits_for_the_unplug_timer_and_a_full_queue_does_not() {
    let _sim = sim::start(1_000_000_000, STEP_NS);
    let engine = Engine::open("emu:dram-ssd,size=1m", path(DispatchKind::Queue, CompletionKind::Poll)).unwrap();
    let mut h = engine.handle(HandleOptions { depth: 32, buffers: 32, buffer_size: 4096 }).unwrap();
    let mut done = Vec::new();
    h.submit(crate::device::Op::Read, 0, 0, 4096).unwrap();
    h.commit().unwrap();
    h.reap(1, &mut done).unwrap();
    let lone = engine.background_stats();
    assert_eq!(lone.merged_requests, 1);
    // ATM's unplug timer: 20 us (the request waited at least that long to be sent).
    assert!(lone.merge_wait_ns >= 20_000, "sent after {} ns", lone.merge_wait_ns);
    drop(h);
    drop(engine);

    // With a timer that would take 10 s, 32 queued requests reach the unplug threshold
    // and are sent without it. (The dispatcher's clock reads advance the shared
    // simulated time too, so only the bound is exact: far below the timer.)
    let slow_timer =
        PathConfig { unplug: Some(Duration::from_secs(10)), ..path(DispatchKind::Queue, CompletionKind::Poll) };
    let engine = Engine::open("emu:dram-ssd,size=1m", slow_timer).unwrap();
    let mut h = engine.handle(HandleOptions { depth: 32, buffers: 32, buffer_size: 4096 }).unwrap();
    let start = now_ns();
    for i in 0..32 {
        h.submit(crate::device::Op::Read, i, i as u64 * 4096, 4096).unwrap();
    }
    h.commit().unwrap();
    done.clear();
    while done.len() < 32 {
        h.reap(1, &mut done).unwrap();
    }
    assert!(now_ns() - start < 1_000_000_000, "waited for the 10 s timer");
    assert_eq!(engine.background_stats().merged_requests, 32);
    assert!(done.iter().all(|c| c.result.is_ok()));
}
