//! The `yield` completion policy next to a CPU hog. In a test binary of its
//! own: the hog, pinned to one CPU, would slow every test sharing that CPU.

use iopath::IoBuf;
use iopath::device::{Command, DeviceSpec, Op, QueueConfig};
use iopath::path::completion::yielding::Yield;
use iopath::path::completion::{CompletionPolicy, Expect, WaitStats};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[test]
fn a_yield_that_a_cpu_hog_keeps_turns_the_following_waits_to_sleeps() {
    // This thread and a spinning one on the same CPU: a yield hands the CPU to
    // the spinner until the scheduler takes it back, a slice later.
    // SAFETY: sched_getcpu takes no arguments and touches no memory of ours.
    let cpu = unsafe { libc::sched_getcpu() }.max(0) as usize;
    let all: Vec<usize> = (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect();
    iopath::sys::pin_to_cpu(cpu).unwrap();
    let (stop, spinning) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let hog = {
        let (stop, spinning) = (Arc::clone(&stop), Arc::clone(&spinning));
        std::thread::spawn(move || {
            iopath::sys::pin_to_cpu(cpu).unwrap();
            spinning.store(true, Ordering::Release);
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    while !spinning.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    let dev = DeviceSpec::parse("emu:nand,size=1m", None).unwrap().open().unwrap();
    let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
    let mut buf = IoBuf::new(4096);
    let mut policy = Yield::default();
    let mut stats = Vec::new();
    for round in 0..4u64 {
        let mut c = Command::with_capacity(1);
        c.reset(Op::Read, round);
        c.push(0, buf.as_mut_ptr(), 4096);
        // SAFETY: the buffer outlives the wait below.
        unsafe { q.submit(c) };
        q.commit().unwrap();
        let (mut out, mut s) = (Vec::new(), WaitStats::default());
        while out.is_empty() {
            policy.wait(q.as_mut(), &mut out, &mut s, u64::MAX, Expect::default()).unwrap();
        }
        assert_eq!(out[0].segments[0].result, 4096);
        stats.push(s);
    }
    stop.store(true, Ordering::Relaxed);
    hog.join().unwrap();
    iopath::sys::pin_to_cpus(&all).unwrap();
    // 80 us of device time: the first wait yields, the hog keeps the CPU for a slice,
    // and the wait sleeps; the three after it sleep without yielding first.
    assert!(stats[0].sleeps >= 1, "the first wait gave up yielding: {:?}", stats[0]);
    for s in &stats[1..] {
        assert_eq!(s.polls, 0, "later waits do not yield first: {stats:?}");
        assert!(s.sleeps >= 1, "{stats:?}");
    }
}
