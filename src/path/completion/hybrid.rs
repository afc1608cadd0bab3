//! `hybrid`: sleep for a learned share of the expected service time, then spin.
//!
//! Linux's old block-layer hybrid polling slept half the mean latency; that
//! half is wrong whenever the wake-up itself costs a large share of the
//! device time (here a timed sleep overshoots by 17-32 µs) and it "shelves":
//! oversleeping inflates the mean it learns from. This policy instead follows
//! PAS (DPAS, FAST'26; ../shared/notes/adaptive-completion.md §3):
//!
//! - per bucket (direction x power-of-two size) a wake target `T` (ns after
//!   submission) moved by binary feedback: OVER (the command was already
//!   complete on the first look after waking: slept too long) or UNDER (had
//!   to spin). Two OVERs in a row shrink `T` faster and faster, two UNDERs
//!   grow it faster and faster, an alternation resets the step; the steps
//!   themselves heat up on repeats and cool down on alternation. The sleep
//!   settles where about 9% of wake-ups oversleep;
//! - the timer's own overshoot `W` is measured around every sleep (EWMA) and
//!   subtracted, so the thread asks to wake `W` early;
//! - the mean latency `L` is learned only from exact samples (completions seen
//!   while spinning), never from oversleeps, so it cannot shelve; it clamps
//!   `T` to at most 4 `L`;
//! - `T` never falls below what a sleep can reach (`W` plus [`MIN_SLEEP_NS`]),
//!   or it could never climb back; when even that is too late (the device is
//!   faster than a wake-up, a "timer-floor hit", the DRAM-SSD here) the
//!   policy just polls.

use super::poll;
use super::{CompletionPolicy, Expect, WaitStats};
use crate::clock::{now_ns, sleep_until_ns};
use crate::device::{Command, Op, Queue};
use crate::error::Result;

/// Shortest sleep worth taking.
pub const MIN_SLEEP_NS: u64 = 2_000;
/// The lowest wake target a sleep can reach: the timer's overshoot plus
/// twice the shortest sleep worth taking (the wait starts a moment after
/// submission).
fn sleep_floor_ns(overshoot_ns: f64) -> f64 {
    overshoot_ns + 2.0 * MIN_SLEEP_NS as f64
}

/// Whether a device with mean latency `latency_ns` can be slept on, given the
/// timer's overshoot: a sleep must be able to end before the device does.
pub fn sleep_feasible(latency_ns: f64, overshoot_ns: f64) -> bool {
    latency_ns > sleep_floor_ns(overshoot_ns)
}

/// Timer overshoot assumed before the first measurement (typical on these VMs).
const INITIAL_OVERSHOOT_NS: f64 = 20_000.0;
const SIZE_BUCKETS: usize = 24;
/// While an overshoot estimate that may be stale rules out sleeping, one
/// wait in this many takes a calibration sleep to refresh it.
const RECALIBRATE_EVERY: u32 = 64;

/// A latency sample over this many times the learned mean is a late sighting,
/// not a measurement (see [`Bucket::learn_latency`]).
pub const LATE_FACTOR: f64 = 4.0;
/// A learned mean this many times over a completion's upper bound is wrong
/// (see [`Bucket::learn_bound`]).
pub const BOUND_FACTOR: f64 = 2.0;
/// Late sightings in a row that mean the device itself has slowed down.
pub const LATE_RUN: u32 = 8;

/// PAS state of one (direction, size) bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bucket {
    /// Wake target after submission (0 = not learned yet).
    pub target_ns: f64,
    /// Mean latency from exact samples (0 = none yet).
    pub latency_ns: f64,
    adj: f64,
    up: f64,
    dn: f64,
    last: Option<bool>,
    /// Samples over [`LATE_FACTOR`] times the mean seen in a row.
    late_run: u32,
    /// The fastest of them.
    late_min_ns: f64,
}

impl Default for Bucket {
    fn default() -> Self {
        Bucket {
            target_ns: 0.0,
            latency_ns: 0.0,
            adj: 1.0,
            up: 0.01,
            dn: 0.1,
            last: None,
            late_run: 0,
            late_min_ns: 0.0,
        }
    }
}

impl Bucket {
    /// Feeds one exact latency sample (a completion seen while spinning).
    ///
    /// A spinning thread that was preempted, or that looked at a ring whose
    /// completion the kernel had not posted yet, sees the completion late, and
    /// such a sample says nothing about the device. Samples up to
    /// [`LATE_FACTOR`] times the mean move it by an eighth of the difference;
    /// a later one is set aside, unless [`LATE_RUN`] come in a row: then the
    /// device really is slower, and the mean restarts from the fastest of them.
    /// (Before this rule a sample counted for up to twice the mean, and a run
    /// of late sightings grew a 50 us device to seconds by an eighth a sample.)
    pub fn learn_latency(&mut self, sample_ns: f64) {
        if self.latency_ns == 0.0 {
            self.latency_ns = sample_ns;
            self.target_ns = sample_ns / 2.0;
        } else if sample_ns > LATE_FACTOR * self.latency_ns {
            self.late_run += 1;
            self.late_min_ns = if self.late_run == 1 { sample_ns } else { self.late_min_ns.min(sample_ns) };
            if self.late_run >= LATE_RUN {
                self.latency_ns = self.late_min_ns;
                self.target_ns = self.latency_ns / 2.0;
                self.late_run = 0;
            }
        } else {
            self.late_run = 0;
            self.latency_ns += (sample_ns - self.latency_ns) / 8.0;
        }
        debug_assert!(self.latency_ns.is_finite() && self.latency_ns >= 0.0);
    }

    /// Feeds an upper bound of the latency: a command found complete after a
    /// sleep (hybrid's oversleep, an interrupt's wake-up) took no longer than
    /// that. A mean over [`BOUND_FACTOR`] times the bound was learned from
    /// late sightings (a first wait among CPU hogs: 6.4 ms on an 80 us
    /// device), and a hybrid sleeping for it oversleeps every command by
    /// milliseconds while PAS shrinks its target a tenth at a time: the mean
    /// and the target drop to the bound at once. Within the factor the bound
    /// is only PAS's usual oversleep, and nothing changes.
    pub fn learn_bound(&mut self, bound_ns: f64) {
        if self.latency_ns > BOUND_FACTOR * bound_ns {
            self.latency_ns = bound_ns;
            self.target_ns = self.target_ns.min(bound_ns);
            self.late_run = 0;
        }
    }

    /// Applies one PAS feedback: `over` = the sleep ended after completion.
    /// The target stays within `[floor_ns, 4 L]`: below the floor (the timer's
    /// overshoot plus the shortest useful sleep) a sleep could not be taken at
    /// all, and the target would have no way back up.
    pub fn feedback(&mut self, over: bool, floor_ns: f64) {
        match (self.last, over) {
            (Some(true), true) => self.adj -= self.dn,
            (Some(true), false) => self.adj = 1.0 + self.up,
            (Some(false), true) => self.adj = 1.0 - self.dn,
            (Some(false), false) => self.adj += self.up,
            (None, true) => self.adj = 1.0 - self.dn,
            (None, false) => self.adj = 1.0 + self.up,
        }
        if self.adj <= 0.0 {
            self.adj = 1.0;
        }
        // Step sizes heat up on repeats and cool down on alternation (DPAS1).
        if self.last == Some(over) {
            self.dn = (self.dn * 1.05).min(0.1);
            self.up = self.dn / 10.0;
        } else if self.last.is_some() {
            self.up = (self.up * 0.9).max(0.001);
            self.dn = self.up * 10.0;
        }
        self.last = Some(over);
        let ceiling = (4.0 * self.latency_ns).max(100.0);
        self.target_ns = (self.target_ns * self.adj).clamp(floor_ns.clamp(100.0, ceiling), ceiling);
    }
}

/// The hybrid policy (one per channel).
#[derive(Debug, Clone)]
pub struct Hybrid {
    buckets: Vec<Bucket>,
    last_index: usize,
    overshoot_ns: f64,
    /// The smallest overshoot ever sampled: what the timer can do at best.
    best_overshoot_ns: f64,
    /// Waits that polled because the overshoot estimate ruled out sleeping.
    polled_since_sleep: u32,
}

impl Default for Hybrid {
    fn default() -> Self {
        Hybrid::new()
    }
}

fn bucket_index(op: Op, bytes: u64) -> usize {
    let size = (u64::BITS - bytes.max(1).leading_zeros()) as usize;
    let dir = if op == Op::Read { 0 } else { 1 };
    dir * SIZE_BUCKETS + size.min(SIZE_BUCKETS - 1)
}

impl Hybrid {
    /// A policy that has learned nothing yet.
    pub fn new() -> Hybrid {
        Hybrid {
            buckets: vec![Bucket::default(); 2 * SIZE_BUCKETS],
            last_index: 0,
            overshoot_ns: INITIAL_OVERSHOOT_NS,
            best_overshoot_ns: INITIAL_OVERSHOOT_NS,
            polled_since_sleep: 0,
        }
    }

    /// The learned state for a direction and size.
    pub fn bucket(&self, op: Op, bytes: u64) -> &Bucket {
        &self.buckets[bucket_index(op, bytes)]
    }

    /// The lowest wake target a sleep can reach.
    fn floor_ns(&self) -> f64 {
        sleep_floor_ns(self.overshoot_ns)
    }

    /// Mean latency of the bucket used last (0 = unknown).
    pub fn bucket_latency_any(&self) -> f64 {
        self.buckets[self.last_index].latency_ns
    }

    /// Learns an exact latency sample: the command described by `expect` was
    /// seen complete at `seen_ns` by a thread that was spinning.
    pub fn learn(&mut self, expect: Expect, seen_ns: u64) {
        let index = bucket_index(expect.op, expect.bytes);
        self.last_index = index;
        self.buckets[index].learn_latency(seen_ns.saturating_sub(expect.since_ns) as f64);
    }

    /// Feeds the upper bound a sleeping wait gives: the command described by
    /// `expect` was complete when the waiter saw it at `seen_ns`.
    pub fn learn_bound(&mut self, expect: Expect, seen_ns: u64) {
        if expect.since_ns > 0 {
            let bound = seen_ns.saturating_sub(expect.since_ns) as f64;
            self.buckets[bucket_index(expect.op, expect.bytes)].learn_bound(bound);
        }
    }

    /// The measured timer overshoot.
    pub fn overshoot_ns(&self) -> f64 {
        self.overshoot_ns
    }

    /// Feeds one overshoot sample (how late a timed sleep ended).
    fn learn_overshoot(&mut self, late_ns: u64) {
        // A preempted sleeper can oversleep by milliseconds; cap each sample so one
        // outlier cannot push the estimate past every target (sleeps would stop,
        // and with them the measurements that bring it back).
        let sample = (late_ns as f64).min(2.0 * self.overshoot_ns + 10_000.0);
        self.overshoot_ns += (sample - self.overshoot_ns) / 16.0;
        self.best_overshoot_ns = self.best_overshoot_ns.min(late_ns as f64);
    }

    /// Whether the last bucket's device latency is too short to sleep on with
    /// the timer as measured, but long enough with the timer at its best: the
    /// overshoot estimate may be stale, and only a sleep can refresh it.
    pub fn overshoot_may_be_stale(&self) -> bool {
        let l = self.bucket_latency_any();
        !sleep_feasible(l, self.overshoot_ns) && sleep_feasible(l, self.best_overshoot_ns)
    }

    /// Takes one shortest sleep to measure the timer's overshoot (a few tens
    /// of µs of CPU on these VMs). Used by a policy that polls and so would
    /// never learn that the timer has become fast enough to sleep on.
    pub fn calibrate_overshoot(&mut self) {
        let wake = now_ns() + MIN_SLEEP_NS;
        sleep_until_ns(wake);
        self.learn_overshoot(now_ns().saturating_sub(wake));
    }

    /// When to ask the timer to wake for a command described by `expect`,
    /// or `None` if sleeping is not worth it (poll instead).
    pub fn sleep_until(&self, expect: Expect, now: u64) -> Option<u64> {
        let b = &self.buckets[bucket_index(expect.op, expect.bytes)];
        if b.latency_ns == 0.0 {
            return None;
        }
        let wake = expect.since_ns as f64 + b.target_ns - self.overshoot_ns;
        (wake > (now + MIN_SLEEP_NS) as f64).then_some(wake as u64)
    }
}

impl CompletionPolicy for Hybrid {
    fn name(&self) -> &'static str {
        "hybrid"
    }

    fn uses_expect(&self) -> bool {
        true
    }

    fn spins(&self) -> bool {
        true
    }

    fn wait(
        &mut self,
        queue: &mut dyn Queue,
        out: &mut Vec<Command>,
        stats: &mut WaitStats,
        limit_ns: u64,
        expect: Expect,
    ) -> Result<usize> {
        if expect.flushes {
            // A flush's time is not a read's to learn, and its completion (on
            // io_uring, the next step of its chain too) waits for this thread to
            // enter the kernel: sleep there, not on a timer.
            return super::interrupt::Interrupt.wait(queue, out, stats, limit_ns, expect);
        }
        let n = queue.reap(out)?;
        stats.polls += 1;
        if n > 0 || queue.in_flight() == 0 {
            return Ok(n);
        }
        let index = bucket_index(expect.op, expect.bytes);
        self.last_index = index;
        let now = now_ns();
        match self.sleep_until(expect, now) {
            Some(wake) if wake < limit_ns => {
                stats.sleeps += 1;
                sleep_until_ns(wake);
                self.learn_overshoot(now_ns().saturating_sub(wake));
                let n = queue.reap(out)?;
                stats.polls += 1;
                if n > 0 {
                    // Completed while we slept: the sample is only an upper bound.
                    stats.oversleeps += 1;
                    let floor = self.floor_ns();
                    self.buckets[index].feedback(true, floor);
                    self.learn_bound(expect, now_ns());
                    return Ok(n);
                }
                let (n, seen) = poll::spin(queue, out, stats, limit_ns, None)?;
                if n > 0 {
                    let floor = self.floor_ns();
                    self.buckets[index].feedback(false, floor);
                    self.buckets[index].learn_latency(seen.saturating_sub(expect.since_ns) as f64);
                }
                Ok(n)
            }
            _ => {
                // Sleeps refresh the overshoot estimate; without them a high one left
                // by a burst of contention would rule sleeping out for good.
                if self.overshoot_may_be_stale() {
                    self.polled_since_sleep += 1;
                    if self.polled_since_sleep >= RECALIBRATE_EVERY {
                        self.polled_since_sleep = 0;
                        stats.sleeps += 1;
                        self.calibrate_overshoot();
                    }
                }
                let (n, seen) = poll::spin(queue, out, stats, limit_ns, None)?;
                if n > 0 && expect.since_ns > 0 {
                    self.buckets[index].learn_latency(seen.saturating_sub(expect.since_ns) as f64);
                }
                Ok(n)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mean_learned_from_a_late_sighting_drops_to_the_first_upper_bound() {
        // The first wait among CPU hogs saw an 80 us device's command after 6.4 ms.
        let mut b = Bucket::default();
        b.learn_latency(6_400_000.0);
        // An interrupt's wake-up found the next one done after 95 us.
        b.learn_bound(95_000.0);
        assert_eq!(b.latency_ns, 95_000.0);
        assert!(b.target_ns <= 95_000.0, "{}", b.target_ns);
        // PAS's usual oversleeps (bounds near or under the mean) change nothing.
        let mut c = Bucket::default();
        c.learn_latency(80_000.0);
        let before = c;
        c.learn_bound(100_000.0);
        c.learn_bound(60_000.0);
        assert_eq!(c, before);
        // Nothing learned yet: a bound teaches nothing (hybrid keeps polling to learn).
        let mut d = Bucket::default();
        d.learn_bound(95_000.0);
        assert_eq!(d, Bucket::default());
    }

    #[test]
    fn pas_settles_near_the_latency_and_oversleeps_rarely() {
        // A synthetic device: every command takes exactly 80 us; a wake-up at `t`
        // oversleeps if t >= 80 us. Deterministic: no clock, no sleep.
        let mut b = Bucket::default();
        b.learn_latency(80_000.0);
        let mut overs = 0;
        let rounds = 5000;
        for i in 0..rounds {
            let over = b.target_ns >= 80_000.0;
            overs += (i >= 1000 && over) as u32;
            b.feedback(over, 100.0);
            if !over {
                b.learn_latency(80_000.0);
            }
        }
        let p_over = overs as f64 / (rounds - 1000) as f64;
        assert!(p_over < 0.25, "oversleeps {p_over}");
        assert!(b.target_ns > 60_000.0 && b.target_ns < 80_000.0 * 1.05, "{}", b.target_ns);
    }

    #[test]
    fn pas_follows_a_latency_step_without_shelving() {
        // 30 us -> 100 us -> 30 us, as in the DPAS emulator traces.
        let mut b = Bucket::default();
        let run = |b: &mut Bucket, latency: f64| {
            for _ in 0..3000 {
                let over = b.target_ns >= latency;
                b.feedback(over, 100.0);
                if !over {
                    b.learn_latency(latency);
                }
            }
        };
        b.learn_latency(30_000.0);
        run(&mut b, 30_000.0);
        assert!(b.target_ns < 31_500.0 && b.target_ns > 20_000.0, "{}", b.target_ns);
        run(&mut b, 100_000.0);
        assert!(b.target_ns > 75_000.0, "grows with the device: {}", b.target_ns);
        run(&mut b, 30_000.0);
        assert!(b.target_ns < 31_500.0, "shrinks back, no shelving: {}", b.target_ns);
    }

    #[test]
    fn late_sightings_do_not_teach_the_device_time() {
        // A 50 us device whose completions are sometimes seen seconds late (a
        // preempted poller, a completion the kernel posted late): with the old
        // rule (samples capped at 2x the mean) this pattern grew L without bound.
        let mut b = Bucket::default();
        b.learn_latency(50_000.0);
        for i in 0..10_000 {
            let late = i % 8 < LATE_RUN as usize - 1 && i % 3 == 0;
            b.learn_latency(if late { 2e9 } else { 50_000.0 });
            assert!(b.latency_ns < 60_000.0, "sample {i}: L = {}", b.latency_ns);
        }
        // Seven late ones in a row, then an honest one: still the device's time.
        for _ in 0..LATE_RUN - 1 {
            b.learn_latency(3e9);
        }
        b.learn_latency(50_000.0);
        assert!((b.latency_ns - 50_000.0).abs() < 1.0, "{}", b.latency_ns);
    }

    #[test]
    fn a_device_that_really_slows_down_is_learned_after_a_run_of_slow_samples() {
        let mut b = Bucket::default();
        b.learn_latency(50_000.0);
        for i in 0..LATE_RUN {
            b.learn_latency(2_000_000.0 + f64::from(i) * 1000.0);
        }
        assert_eq!(b.latency_ns, 2_000_000.0, "the fastest of the run");
        assert_eq!(b.target_ns, 1_000_000.0, "the wake target starts again from half of it");
        // Within LATE_FACTOR of the new mean, samples move it smoothly again.
        b.learn_latency(3_000_000.0);
        assert_eq!(b.latency_ns, 2_125_000.0);
    }

    #[test]
    fn an_overshoot_raised_by_contention_is_recognized_as_possibly_stale() {
        let mut h = Hybrid::new();
        h.learn(Expect::plain(Op::Read, 4096, 0), 80_000);
        h.learn_overshoot(15_000);
        assert!(!h.overshoot_may_be_stale(), "80 us device, 20 us overshoot: sleeping works");
        for _ in 0..200 {
            h.learn_overshoot(3_000_000); // preempted sleepers
        }
        assert!(!sleep_feasible(80_000.0, h.overshoot_ns()), "{}", h.overshoot_ns());
        assert!(h.overshoot_may_be_stale(), "the timer once did 15 us: worth measuring again");
        // A device the timer could never reach is not worth a calibration sleep.
        let mut h = Hybrid::new();
        h.learn(Expect::plain(Op::Read, 4096, 0), 7_000);
        h.learn_overshoot(15_000);
        assert!(!h.overshoot_may_be_stale());
    }

    #[test]
    fn a_flushing_command_sleeps_in_the_kernel_and_teaches_no_bucket() {
        use crate::buffer::IoBuf;
        use crate::device::{Command, DeviceSpec, Durability, QueueConfig};
        let dev = DeviceSpec::parse("emu:optane,size=1m", None).unwrap().open().unwrap();
        let mut q = dev.open_queue(&QueueConfig::depth(1)).unwrap();
        let mut h = Hybrid::new();
        let (mut out, mut stats) = (Vec::new(), WaitStats::default());
        let mut buf = IoBuf::new(4096);
        for i in 0..10u64 {
            let mut c = Command::with_capacity(1);
            c.reset(Op::Write, i);
            c.durability = if i % 2 == 0 { Durability::Fua } else { Durability::Ordered };
            c.push(i * 4096, buf.as_mut_ptr(), 4096);
            let expect = Expect::of(&c, now_ns());
            // SAFETY: the buffer outlives the write, which is waited for below.
            unsafe { q.submit(c) };
            q.commit().unwrap();
            while out.is_empty() {
                h.wait(q.as_mut(), &mut out, &mut stats, u64::MAX, expect).unwrap();
            }
            assert_eq!(out.pop().unwrap().segments[0].result, 4096);
        }
        assert_eq!(h.bucket(Op::Write, 4096).latency_ns, 0.0, "a flush's time learned as a write's");
        assert_eq!((stats.oversleeps, h.overshoot_ns()), (0, INITIAL_OVERSHOOT_NS), "a timed sleep was taken");
    }

    #[test]
    fn an_expectation_flushes_for_flushes_and_durable_writes_only() {
        use crate::device::{Command, Durability};
        let mut c = Command::with_capacity(1);
        for (op, durability, flushes) in [
            (Op::Read, Durability::Cached, false),
            (Op::Write, Durability::Cached, false),
            (Op::Write, Durability::Fua, true),
            (Op::Write, Durability::Ordered, true),
            (Op::Flush, Durability::Cached, true),
            (Op::Trim, Durability::Cached, false),
        ] {
            c.reset(op, 0);
            c.durability = durability;
            assert_eq!(Expect::of(&c, 0).flushes, flushes, "{op:?} {durability:?}");
        }
        assert!(Expect::plain(Op::Flush, 0, 0).flushes && !Expect::plain(Op::Write, 4096, 0).flushes);
    }

    #[test]
    fn no_sleep_when_the_device_is_faster_than_a_wake_up() {
        let mut h = Hybrid::new();
        let expect = Expect::plain(Op::Read, 4096, 1_000_000);
        assert_eq!(h.sleep_until(expect, 1_000_000), None, "nothing learned yet: poll");
        h.buckets[bucket_index(Op::Read, 4096)].learn_latency(7_000.0);
        assert_eq!(h.sleep_until(expect, 1_000_000), None, "7 us device, 20 us overshoot: poll");
        h.buckets[bucket_index(Op::Read, 4096)] = Bucket::default();
        h.buckets[bucket_index(Op::Read, 4096)].learn_latency(100_000.0);
        let wake = h.sleep_until(expect, 1_000_000).unwrap();
        assert_eq!(wake, 1_000_000 + 50_000 - 20_000, "half the latency, minus the timer's overshoot");
    }
}
