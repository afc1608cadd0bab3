//! The opt-in timestamps inside the paths (`iopath::path::timing`): off, they
//! record nothing; on, a handed-over request shows when its completion was
//! noticed and when its owner woke, and a direct one when it was noticed.
//! Its own test binary: the switch is process-wide.

use iopath::bench::{BenchConfig, run};
use iopath::path::{PathSpec, timing};
use std::time::Duration;

fn measure(path: &str) -> iopath::bench::stats::Measurements {
    let config = BenchConfig {
        device: "emu:dram-ssd".into(),
        path: PathSpec::parse(path).unwrap().config().unwrap(),
        path_name: path.into(),
        size: Some(64 << 20),
        runtime: Some(Duration::from_millis(200)),
        ..BenchConfig::default()
    };
    run(&config).unwrap().measurements
}

#[test]
fn steps_are_recorded_only_when_asked_for() {
    timing::set(false);
    let m = measure("2q");
    assert_eq!((m.path.noticed, m.path.woken), (0, 0), "off: nothing recorded");

    timing::set(true);
    let handed = measure("2q");
    let direct = measure("sync-path");
    timing::set(false);
    // 2q: a dispatcher thread completes the caller's requests.
    assert!(handed.path.noticed > 0 && handed.path.woken > 0, "{:?}", handed.path);
    assert!(handed.woken_share() > 0.5, "{}", handed.woken_share());
    // sync-path: the caller notices its own completion; nobody wakes it.
    assert_eq!(direct.path.noticed, direct.total_ios());
    assert_eq!(direct.path.woken, 0);
    // A poller notices within microseconds of the device finishing (bounded loosely:
    // a preempted poller can be late, never early).
    assert!(direct.noticed_ns_mean() >= 0.0 && direct.noticed_ns_mean() < direct.latency_ns_mean());
}
