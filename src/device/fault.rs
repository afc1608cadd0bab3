//! `fault`: a wrapper around any backend that injects faults and audits who
//! owns a command's buffers.
//!
//! SPDK tests its upper layers on an "error bdev" stacked on a real one; this
//! is iopath's. Any device spec takes the fault options
//! (`uring:/tmp/x.img,commit_fail_rate=0.01`, `emu:dram-ssd,hang_nth=3`), and
//! the device is then wrapped:
//!
//! - **refused commands** (`fail_nth`): the Nth command is handed back failed
//!   as a whole without reaching the device;
//! - **segment errors** (`fail_range`, `fail_rate`): those segments are not
//!   sent and come back with `-errno`, the rest of their command succeeds;
//! - **failed commits** (`commit_fail_nth`, `commit_fail_rate`): `commit`
//!   returns an error and every command submitted since the last commit
//!   comes back failed (the queue contract: nothing the device did not take
//!   is lost);
//! - **failed waits** (`wait_fail_nth`, `wait_fail_rate`): `reap` or `wait`
//!   returns an error and hands nothing back; every command stays in flight;
//! - **hangs** (`hang_nth`): the Nth command never completes until it is
//!   cancelled ([`Queue::cancel`]), as a stuck device would;
//! - **latency spikes** (`spike_rate`, `spike`): a finished command is held
//!   back that much longer, and cannot be cancelled meanwhile (like block
//!   I/O under way): a spike longer than the path's timeout is a command
//!   that is cancelled, keeps its buffers and comes back late;
//! - **panics** (`panic_nth`): submitting the Nth command panics, standing
//!   in for a bug in a backend, to test that the path around it fails
//!   requests instead of hanging.
//!
//! The **ownership audit** is always on in the wrapper (`audit=1` turns the
//! wrapper on with no faults): the wrapped device works on bounce buffers
//! and the caller's buffers are touched the way DMA touches them, as late as
//! possible. A write's data is read at submission, and its buffer must not
//! change until the command is handed back; a read's buffer is filled with a
//! poison pattern at submission and the data is copied in only when the
//! command is handed back, after checking that the poison is intact. A path
//! that let a caller reuse or free a buffer while the device still owned it
//! shows up as an `ownership_violations` count (and, for reads, as the late
//! data landing in whatever the caller had put there).

use super::spec::Options;
use super::{Cancel, Capabilities, Command, Counters, Device, DeviceStats, Op, Queue, QueueConfig};
use crate::buffer::IoBuf;
use crate::clock::{now_ns, sleep_until_ns};
use crate::error::{Error, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// When a failure point fires: on its Nth use (1-based, counted over the
/// whole device) and/or at random with a probability per use.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Trigger {
    /// Fire on this use.
    pub nth: Option<u64>,
    /// Fire with this probability on every use.
    pub rate: f64,
}

impl Trigger {
    fn fires(&self, n: u64, rng: &mut fastrand::Rng) -> bool {
        self.nth == Some(n) || (self.rate > 0.0 && rng.f64() < self.rate)
    }
}

/// Faults to inject. All off by default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultConfig {
    /// The Nth command (1-based) is refused: handed back failed as a whole.
    pub fail_nth: Option<u64>,
    /// Segments that overlap `[start, end)` fail; the rest of their command
    /// succeeds. With `fail_rate`, only those segments may fail, with that probability.
    pub fail_range: Option<(u64, u64)>,
    /// Each segment fails with this probability (of `fail_range`'s, if given).
    pub fail_rate: f64,
    /// Only commands of this kind meet `fail_range` and `fail_rate` (SPDK's
    /// error bdev's per-I/O-type errors); `None`: every kind.
    pub fail_op: Option<Op>,
    /// When `commit` fails (the commands it would have sent come back failed).
    pub commit_fail: Trigger,
    /// When `reap` / `wait` fail (nothing is handed back; commands stay in flight).
    pub wait_fail: Trigger,
    /// The errno injected failures report (default EIO).
    pub errno: i32,
    /// Each command is held back `spike_ns` longer with this probability.
    pub spike_rate: f64,
    /// Extra latency of a spike.
    pub spike_ns: u64,
    /// The Nth command (1-based) never completes unless cancelled.
    pub hang_nth: Option<u64>,
    /// Submitting the Nth command (1-based) panics.
    pub panic_nth: Option<u64>,
    /// Seed of the fault dice.
    pub seed: u64,
}

/// The option names the wrapper takes from any device spec.
pub const KNOWN: &[&str] = &[
    "audit",
    "fail_nth",
    "fail_range",
    "fail_rate",
    "fail_op",
    "commit_fail_nth",
    "commit_fail_rate",
    "wait_fail_nth",
    "wait_fail_rate",
    "errno",
    "spike_rate",
    "spike",
    "hang_nth",
    "panic_nth",
    "seed",
];

impl FaultConfig {
    /// Takes the fault options out of a device spec's options; `None` when
    /// none was given (the device is then not wrapped).
    pub fn take(opts: &mut Options) -> Result<Option<FaultConfig>> {
        let audit = opts.take_bool("audit")?.unwrap_or(false);
        let mut f = FaultConfig { errno: libc::EIO, spike_ns: 100_000, seed: 0x10_9a7, ..FaultConfig::default() };
        let mut any = audit;
        let mut num = |opts: &mut Options, key: &str| -> Result<Option<u64>> {
            let v = opts.take_num::<u64>(key)?;
            if v == Some(0) {
                return Err(opts.error(format!("{key}=0: counts start at 1 (the first command is 1)")));
            }
            any |= v.is_some();
            Ok(v)
        };
        f.fail_nth = num(opts, "fail_nth")?;
        f.hang_nth = num(opts, "hang_nth")?;
        f.panic_nth = num(opts, "panic_nth")?;
        f.commit_fail.nth = num(opts, "commit_fail_nth")?;
        f.wait_fail.nth = num(opts, "wait_fail_nth")?;
        if let Some(range) = opts.take("fail_range") {
            let (a, b) = range
                .split_once('-')
                .ok_or_else(|| opts.error("fail_range must be START-END, e.g. fail_range=4k-8k"))?;
            let (a, b) = (crate::units::parse_size(a)?, crate::units::parse_size(b)?);
            if a >= b {
                return Err(opts.error("fail_range START must be below END"));
            }
            f.fail_range = Some((a, b));
            any = true;
        }
        let mut rate = |opts: &mut Options, key: &str| -> Result<f64> {
            let v: Option<f64> = opts.take_num(key)?;
            match v {
                Some(p) if !(0.0..=1.0).contains(&p) => {
                    Err(opts.error(format!("{key}={p}: a probability between 0 and 1 (0.01 = one in a hundred)")))
                }
                Some(p) => {
                    any |= p > 0.0;
                    Ok(p)
                }
                None => Ok(0.0),
            }
        };
        f.fail_rate = rate(opts, "fail_rate")?;
        f.fail_op = match opts.take("fail_op").as_deref() {
            None | Some("any") => None,
            Some("read") => Some(Op::Read),
            Some("write") => Some(Op::Write),
            Some(other) => {
                return Err(opts.error(format!(
                    "fail_op={other}: read, write or any (which commands fail_range and fail_rate fail)"
                )));
            }
        };
        f.spike_rate = rate(opts, "spike_rate")?;
        f.commit_fail.rate = rate(opts, "commit_fail_rate")?;
        f.wait_fail.rate = rate(opts, "wait_fail_rate")?;
        if let Some(d) = opts.take_micros("spike")? {
            f.spike_ns = d.as_nanos() as u64;
        }
        if let Some(errno) = opts.take_num::<i32>("errno")? {
            if !(1..4096).contains(&errno) {
                return Err(opts.error(format!("errno={errno}: an error number from 1 to 4095, e.g. 5 (EIO)")));
            }
            f.errno = errno;
        }
        if let Some(seed) = opts.take_num("seed")? {
            f.seed = seed;
        }
        Ok(any.then_some(f))
    }

    /// A short description for reports, e.g. `fail_rate=0.01, commit_fail_nth=3`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        let mut opt = |name: &str, v: Option<u64>| {
            if let Some(v) = v {
                parts.push(format!("{name}={v}"));
            }
        };
        opt("fail_nth", self.fail_nth);
        opt("hang_nth", self.hang_nth);
        opt("panic_nth", self.panic_nth);
        opt("commit_fail_nth", self.commit_fail.nth);
        opt("wait_fail_nth", self.wait_fail.nth);
        if let Some((a, b)) = self.fail_range {
            parts.push(format!("fail_range={a}-{b}"));
        }
        if let Some(op) = self.fail_op {
            parts.push(format!("fail_op={}", op.name()));
        }
        for (name, v) in [
            ("fail_rate", self.fail_rate),
            ("spike_rate", self.spike_rate),
            ("commit_fail_rate", self.commit_fail.rate),
            ("wait_fail_rate", self.wait_fail.rate),
        ] {
            if v > 0.0 {
                parts.push(format!("{name}={v}"));
            }
        }
        if parts.is_empty() { "no faults, ownership audit only".into() } else { parts.join(", ") }
    }
}

struct Shared {
    config: FaultConfig,
    /// Commands submitted so far, over all queues (`fail_nth`, `hang_nth`, `panic_nth`).
    commands: AtomicU64,
    commits: AtomicU64,
    waits: AtomicU64,
    injected: AtomicU64,
    violations: AtomicU64,
    queues: AtomicU64,
    /// What the wrapper was given (the wrapped device sees less when segments fail).
    counters: Counters,
}

impl Shared {
    fn inject(&self) {
        self.injected.fetch_add(1, Ordering::Relaxed);
    }
}

/// Any device, with injected faults and the ownership audit.
pub struct FaultDevice {
    inner: Arc<dyn Device>,
    shared: Arc<Shared>,
}

impl FaultDevice {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Device>, config: FaultConfig) -> FaultDevice {
        FaultDevice {
            inner,
            shared: Arc::new(Shared {
                config,
                commands: AtomicU64::new(0),
                commits: AtomicU64::new(0),
                waits: AtomicU64::new(0),
                injected: AtomicU64::new(0),
                violations: AtomicU64::new(0),
                queues: AtomicU64::new(0),
                counters: Counters::default(),
            }),
        }
    }
}

impl Device for FaultDevice {
    fn describe(&self) -> String {
        format!("{} + fault injection ({})", self.inner.describe(), self.shared.config.describe())
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn completion_source(&self, polled: bool) -> String {
        self.inner.completion_source(polled)
    }

    fn open_queue(&self, config: &QueueConfig) -> Result<Box<dyn Queue>> {
        // The wrapped queue sees bounce buffers only: nothing of the caller's is registered.
        let inner = self.inner.open_queue(&QueueConfig { registered: None, ..*config })?;
        let id = self.shared.queues.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(FaultQueue {
            inner,
            shared: Arc::clone(&self.shared),
            rng: fastrand::Rng::with_seed(self.shared.config.seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            staged: Vec::new(),
            flights: Vec::new(),
            hung: Vec::new(),
            delayed: Vec::new(),
            ready: Vec::new(),
            abandoned: Vec::new(),
            next_inner_tag: 1,
            spare: Vec::new(),
        }))
    }

    fn stats(&self) -> DeviceStats {
        DeviceStats {
            busy_ns: self.inner.stats().busy_ns,
            faults_injected: self.shared.injected.load(Ordering::Relaxed),
            ownership_violations: self.shared.violations.load(Ordering::Relaxed),
            ..self.shared.counters.snapshot()
        }
    }

    fn peak_bandwidth(&self, read_fraction: f64) -> Option<f64> {
        self.inner.peak_bandwidth(read_fraction)
    }
}

/// A command the wrapper owns: the caller's original and what was sent for it.
struct Flight {
    original: Command,
    /// The command sent to the wrapped device (bounce buffers); `None` when
    /// nothing of it is sent (every segment failed by injection).
    inner: Option<Command>,
    inner_tag: u64,
    /// Per original segment: the bounce buffer it travels in, or `None` when
    /// injection failed it.
    bounce: Vec<Option<IoBuf>>,
    /// Per original segment: a hash of the caller's buffer at submission
    /// (after the poison was written, for reads); it must not change.
    seal: Vec<u64>,
    /// Extra time to hold the command back once the device is done.
    spike_ns: u64,
}

struct FaultQueue {
    /// First, so it is dropped (and waits out its commands) before the bounce buffers.
    inner: Box<dyn Queue>,
    shared: Arc<Shared>,
    rng: fastrand::Rng,
    /// Submitted, not yet committed.
    staged: Vec<Flight>,
    /// Sent to the wrapped device.
    flights: Vec<Flight>,
    /// Never sent, never coming back unless cancelled.
    hung: Vec<Command>,
    /// Done by the wrapped device, held back until a time (a spike): the
    /// caller's buffers are audited and read data is moved in only then.
    delayed: Vec<(u64, Flight, Command)>,
    /// Ready to be handed back.
    ready: Vec<Command>,
    /// Sent to the wrapped device and given up on ([`Queue::abandon`]): the
    /// caller has its command back, failed; the bounce buffers stay here
    /// until the wrapped device hands the inner command back.
    abandoned: Vec<Flight>,
    next_inner_tag: u64,
    spare: Vec<Command>,
}

/// A fast hash of a buffer (not cryptographic: it catches changes, not attacks).
fn seal_of(ptr: *const u8, len: usize) -> u64 {
    if ptr.is_null() {
        return 0; // a trim's segments have no buffer
    }
    // SAFETY: the caller of `submit` guarantees the buffer is valid for `len` bytes
    // while the command is in flight, and it is in flight whenever this is called.
    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ len as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        h = (h ^ u64::from_le_bytes(c.try_into().expect("8 bytes"))).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 29;
    }
    for &b in chunks.remainder() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Fills a read buffer with a pattern unique to this command and segment.
fn poison(ptr: *mut u8, len: usize, stamp: u64) {
    // SAFETY: as in `seal_of`; reads' buffers are writable.
    let bytes = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
    let word = (stamp.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1).to_le_bytes();
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = word[i % 8];
    }
}

impl FaultQueue {
    fn segment_fails(&mut self, op: Op, offset: u64, len: u32) -> bool {
        let f = &self.shared.config;
        if f.fail_op.is_some_and(|o| o != op) {
            return false;
        }
        // A range alone fails all of it; a rate alone any segment; both: the range's
        // segments with that probability.
        let in_range = f.fail_range.is_none_or(|(a, b)| offset < b && offset + len as u64 > a);
        let dice = if f.fail_rate > 0.0 { self.rng.f64() < f.fail_rate } else { f.fail_range.is_some() };
        in_range && dice
    }

    /// Builds the flight of a command: seals the caller's buffers, prepares
    /// the bounce buffers and the command for the wrapped device.
    fn prepare(&mut self, mut original: Command) -> Flight {
        let errno = self.shared.config.errno;
        let inner_tag = self.next_inner_tag;
        self.next_inner_tag += 1;
        let mut inner = self.spare.pop().unwrap_or_else(|| Command::with_capacity(original.segments.len()));
        inner.reset(original.op, inner_tag);
        inner.durability = original.durability;
        let mut bounce = Vec::with_capacity(original.segments.len());
        let mut seal = Vec::with_capacity(original.segments.len());
        for i in 0..original.segments.len() {
            let seg = original.segments[i];
            if original.op == Op::Read {
                poison(seg.buf, seg.len as usize, inner_tag ^ ((i as u64) << 48));
            }
            seal.push(seal_of(seg.buf, seg.len as usize));
            if self.segment_fails(original.op, seg.offset, seg.len) {
                self.shared.inject();
                original.segments[i].result = -errno;
                bounce.push(None);
                continue;
            }
            if original.op == Op::Trim {
                // No buffer to bounce: the wrapped device gets the range alone.
                inner.push(seg.offset, std::ptr::null_mut(), seg.len);
                bounce.push(Some(IoBuf::new(0)));
                continue;
            }
            let mut b = IoBuf::new(seg.len as usize);
            if original.op == Op::Write {
                // SAFETY: the caller's buffer is valid for `len` bytes (submit's contract).
                b.copy_from_slice(unsafe { std::slice::from_raw_parts(seg.buf, seg.len as usize) });
            }
            inner.push(seg.offset, b.as_ptr().cast_mut(), seg.len);
            bounce.push(Some(b));
        }
        let sends = original.op == Op::Flush || !inner.segments.is_empty();
        let spike_ns = {
            let f = &self.shared.config;
            if f.spike_rate > 0.0 && self.rng.f64() < f.spike_rate {
                self.shared.inject();
                f.spike_ns
            } else {
                0
            }
        };
        let inner = if sends {
            Some(inner)
        } else {
            self.spare.push(inner);
            None
        };
        Flight { original, inner, inner_tag, bounce, seal, spike_ns }
    }

    /// The wrapped device handed `done` back: hold it if a spike was drawn,
    /// else hand it back now.
    fn arrived(&mut self, mut done: Command) {
        if let Some(pos) = self.abandoned.iter().position(|f| f.inner_tag == done.tag) {
            // Its caller was answered when it was given up on: only the bounce buffers go.
            self.abandoned.swap_remove(pos);
            done.segments.clear();
            self.spare.push(done);
            return;
        }
        let Some(pos) = self.flights.iter().position(|f| f.inner_tag == done.tag) else {
            debug_assert!(false, "the wrapped device handed back a command it was never given");
            return;
        };
        let flight = self.flights.swap_remove(pos);
        if flight.spike_ns > 0 {
            self.delayed.push((now_ns() + flight.spike_ns, flight, done));
        } else {
            self.settle(flight, done);
        }
    }

    /// Hands a command back: audits the caller's buffers, moves read data in
    /// (the late DMA) and queues the original for `reap`.
    fn settle(&mut self, mut flight: Flight, mut done: Command) {
        self.audit(&flight.original, &flight.seal);
        let mut sent = done.segments.iter();
        for (i, bounce) in flight.bounce.iter().enumerate() {
            let seg = &mut flight.original.segments[i];
            let Some(bounce) = bounce else { continue };
            let result = sent.next().map_or(-libc::EIO, |s| s.result);
            if flight.original.op == Op::Read && result > 0 {
                let n = (result as usize).min(seg.len as usize);
                // SAFETY: the caller's buffer is valid and writable for `len` bytes until
                // this command is handed back, which happens after this copy.
                unsafe { std::ptr::copy_nonoverlapping(bounce.as_ptr(), seg.buf, n) };
            }
            seg.result = result;
        }
        if flight.original.op == Op::Flush || flight.original.durability == super::Durability::Ordered {
            flight.original.result = done.result;
        }
        flight.original.device_ns = done.device_ns;
        done.segments.clear();
        self.spare.push(done);
        self.ready.push(flight.original);
    }

    /// Counts a violation for each of the caller's buffers that changed
    /// since `seal` was taken (the caller touched what the device owned).
    fn audit(&self, original: &Command, seal: &[u64]) {
        for (seg, &sealed) in original.segments.iter().zip(seal) {
            if seal_of(seg.buf, seg.len as usize) != sealed {
                self.shared.violations.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Audits and hands back a flight that never reached the wrapped device.
    fn settle_unsent(&mut self, flight: Flight) {
        self.audit(&flight.original, &flight.seal);
        if let Some(mut inner) = flight.inner {
            inner.segments.clear();
            self.spare.push(inner);
        }
        self.ready.push(flight.original);
    }

    fn release_due(&mut self) {
        let now = now_ns();
        let mut i = 0;
        while i < self.delayed.len() {
            if self.delayed[i].0 <= now {
                let (_, flight, done) = self.delayed.swap_remove(i);
                self.settle(flight, done);
            } else {
                i += 1;
            }
        }
    }

    fn injected_wait_failure(&mut self) -> Result<()> {
        let n = self.shared.waits.fetch_add(1, Ordering::Relaxed) + 1;
        if self.shared.config.wait_fail.fires(n, &mut self.rng) {
            self.shared.inject();
            return Err(Error::Os {
                context: "injected failure of a wait for completions (wait_fail_nth/wait_fail_rate)".into(),
                source: std::io::Error::from_raw_os_error(self.shared.config.errno),
            });
        }
        Ok(())
    }

    /// Picks up what the wrapped device finished, without the injected failure.
    fn collect(&mut self, out: &mut Vec<Command>) -> Result<usize> {
        if !self.flights.is_empty() || !self.abandoned.is_empty() {
            let mut done = Vec::new();
            self.inner.reap(&mut done)?;
            for command in done {
                self.arrived(command);
            }
        }
        self.release_due();
        let n = self.ready.len();
        out.append(&mut self.ready);
        Ok(n)
    }

    fn next_release_ns(&self) -> Option<u64> {
        self.delayed.iter().map(|(t, _, _)| *t).min()
    }
}

impl Queue for FaultQueue {
    unsafe fn submit(&mut self, mut command: Command) {
        let n = self.shared.commands.fetch_add(1, Ordering::Relaxed) + 1;
        self.shared.counters.record(&command);
        let f = &self.shared.config;
        assert!(f.panic_nth != Some(n), "panic_nth={n}: injected panic in the device");
        if f.hang_nth == Some(n) {
            self.shared.inject();
            // Never sent and never touched, until cancelled.
            self.hung.push(command);
            return;
        }
        if f.fail_nth == Some(n) {
            self.shared.inject();
            command.fail_all(f.errno);
            self.ready.push(command);
            return;
        }
        let flight = self.prepare(command);
        self.staged.push(flight);
    }

    fn commit(&mut self) -> Result<()> {
        let n = self.shared.commits.fetch_add(1, Ordering::Relaxed) + 1;
        if !self.staged.is_empty() && self.shared.config.commit_fail.fires(n, &mut self.rng) {
            self.shared.inject();
            let errno = self.shared.config.errno;
            for mut flight in std::mem::take(&mut self.staged) {
                flight.original.fail_all(errno);
                self.settle_unsent(flight);
            }
            return Err(Error::Os {
                context:
                    "injected failure of a commit (commit_fail_nth/commit_fail_rate); its commands come back failed"
                        .into(),
                source: std::io::Error::from_raw_os_error(errno),
            });
        }
        for mut flight in std::mem::take(&mut self.staged) {
            match flight.inner.take() {
                Some(inner) => {
                    // SAFETY: the bounce buffers live in the flight, which is kept until the
                    // wrapped device hands this command back (and the wrapped queue is
                    // dropped, waiting for its commands, before the flights are).
                    unsafe { self.inner.submit(inner) };
                    self.flights.push(flight);
                }
                None => self.settle_unsent(flight),
            }
        }
        self.inner.commit()
    }

    fn reap(&mut self, out: &mut Vec<Command>) -> Result<usize> {
        self.injected_wait_failure()?;
        self.collect(out)
    }

    fn wait(&mut self, out: &mut Vec<Command>, timeout_ns: u64) -> Result<usize> {
        self.injected_wait_failure()?;
        let n = self.collect(out)?;
        if n > 0 || self.in_flight() == 0 {
            return Ok(n);
        }
        let now = now_ns();
        let limit = now.saturating_add(timeout_ns).min(self.next_release_ns().unwrap_or(u64::MAX));
        if !self.flights.is_empty() {
            let mut done = Vec::new();
            self.inner.wait(&mut done, limit.saturating_sub(now))?;
            for command in done {
                self.arrived(command);
            }
        } else if limit > now {
            // Only delayed or hung commands: nothing can arrive before `limit`.
            sleep_until_ns(limit);
        }
        self.collect(out)
    }

    fn in_flight(&self) -> usize {
        self.staged.len() + self.flights.len() + self.hung.len() + self.delayed.len() + self.ready.len()
    }

    fn next_deadline_ns(&self) -> Option<u64> {
        match (self.inner.next_deadline_ns(), self.next_release_ns()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn cancel(&mut self, which: Cancel) -> Result<()> {
        // A hung command gives up at once. A delayed one cannot be stopped, like block
        // I/O under way: it comes back when its time comes, with its real results.
        for mut command in self.hung.extract_if(.., |c| which.covers(c.tag)).collect::<Vec<_>>() {
            command.fail_all(libc::ECANCELED);
            self.ready.push(command);
        }
        for mut flight in self.staged.extract_if(.., |f| which.covers(f.original.tag)).collect::<Vec<_>>() {
            flight.original.fail_all(libc::ECANCELED);
            self.settle_unsent(flight);
        }
        let inner_tags: Vec<u64> =
            self.flights.iter().filter(|f| which.covers(f.original.tag)).map(|f| f.inner_tag).collect();
        for tag in inner_tags {
            self.inner.cancel(Cancel::Tag(tag))?;
        }
        Ok(())
    }

    /// Every command can be given up on: the wrapped device works only on
    /// bounce buffers, and the caller's are touched only when a command is
    /// settled, which an abandoned one never is.
    fn abandon(&mut self, which: Cancel, out: &mut Vec<Command>) -> usize {
        // What is already settled goes back as it is; the rest fails, unsettled.
        self.cancel(which).ok();
        for mut flight in self.flights.extract_if(.., |f| which.covers(f.original.tag)).collect::<Vec<_>>() {
            let mut original = std::mem::replace(&mut flight.original, Command::with_capacity(0));
            self.audit(&original, &flight.seal);
            original.fail_all(libc::ECANCELED);
            self.ready.push(original);
            self.abandoned.push(flight);
        }
        for (_, mut flight, mut done) in
            self.delayed.extract_if(.., |d| which.covers(d.1.original.tag)).collect::<Vec<_>>()
        {
            self.audit(&flight.original, &flight.seal);
            flight.original.fail_all(libc::ECANCELED);
            self.ready.push(flight.original);
            done.segments.clear();
            self.spare.push(done);
        }
        let before = out.len();
        out.extend(self.ready.extract_if(.., |c| which.covers(c.tag)));
        out.len() - before
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceSpec;

    fn open(spec: &str) -> Arc<dyn Device> {
        DeviceSpec::parse(spec, None).unwrap().open().unwrap()
    }

    fn command(op: Op, tag: u64, segments: &[(u64, &mut IoBuf)]) -> Command {
        let mut c = Command::with_capacity(segments.len());
        c.reset(op, tag);
        for (offset, buf) in segments {
            c.push(*offset, buf.as_ptr().cast_mut(), buf.len() as u32);
        }
        c
    }

    fn wait_one(q: &mut dyn Queue) -> Command {
        let mut out = Vec::new();
        let give_up = now_ns() + 5_000_000_000;
        while out.is_empty() && now_ns() < give_up {
            let _ = q.wait(&mut out, 10_000_000);
        }
        out.pop().expect("a command came back")
    }

    #[test]
    fn reads_land_only_when_handed_back_and_data_round_trips() {
        let dev = open("emu:null,size=1m,audit=1");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let mut w = IoBuf::from_slice(&[0x5a; 4096]);
        // SAFETY: the buffers outlive the waits below.
        unsafe { q.submit(command(Op::Write, 1, &[(8192, &mut w)])) };
        q.commit().unwrap();
        assert_eq!(wait_one(q.as_mut()).segments[0].result, 4096);
        let mut r = IoBuf::new(4096);
        // SAFETY: as above.
        unsafe { q.submit(command(Op::Read, 2, &[(8192, &mut r)])) };
        assert!(r.iter().all(|&b| b != 0x5a) || r[..8] != [0x5a; 8], "poisoned at submission");
        q.commit().unwrap();
        let done = wait_one(q.as_mut());
        assert_eq!(done.segments[0].result, 4096);
        assert!(r.iter().all(|&b| b == 0x5a));
        assert_eq!(dev.stats().ownership_violations, 0);
    }

    #[test]
    fn a_buffer_changed_while_the_device_owns_it_is_counted() {
        let dev = open("emu:dram-ssd,size=1m,audit=1");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let mut w = IoBuf::from_slice(&[1; 4096]);
        // SAFETY: the buffer outlives the wait; the write below is the bug being detected.
        unsafe { q.submit(command(Op::Write, 1, &[(0, &mut w)])) };
        q.commit().unwrap();
        w[100] = 2;
        wait_one(q.as_mut());
        assert_eq!(dev.stats().ownership_violations, 1);
    }

    #[test]
    fn a_failed_commit_hands_back_what_it_did_not_send() {
        let dev = open("emu:null,size=1m,commit_fail_nth=1");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let mut a = IoBuf::new(512);
        let mut b = IoBuf::new(512);
        // SAFETY: the buffers outlive the waits below.
        unsafe {
            q.submit(command(Op::Read, 1, &[(0, &mut a)]));
            q.submit(command(Op::Read, 2, &[(512, &mut b)]));
        }
        assert!(q.commit().is_err());
        let mut out = Vec::new();
        q.reap(&mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert!(out.iter().all(|c| c.segments[0].result == -libc::EIO));
        assert_eq!(q.in_flight(), 0);
        assert_eq!(dev.stats().faults_injected, 1);
    }

    #[test]
    fn a_failed_wait_keeps_the_command_in_flight() {
        let dev = open("emu:null,size=1m,wait_fail_nth=1");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let mut a = IoBuf::new(512);
        // SAFETY: the buffer outlives the waits below.
        unsafe { q.submit(command(Op::Read, 1, &[(0, &mut a)])) };
        q.commit().unwrap();
        let mut out = Vec::new();
        assert!(q.reap(&mut out).is_err());
        assert_eq!(q.in_flight(), 1);
        assert_eq!(wait_one(q.as_mut()).segments[0].result, 512);
    }

    #[test]
    fn a_hung_command_comes_back_only_when_cancelled() {
        let dev = open("emu:null,size=1m,hang_nth=1");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let mut a = IoBuf::new(512);
        // SAFETY: the buffer outlives the waits below.
        unsafe { q.submit(command(Op::Read, 7, &[(0, &mut a)])) };
        q.commit().unwrap();
        let mut out = Vec::new();
        assert_eq!(q.wait(&mut out, 2_000_000).unwrap(), 0);
        assert_eq!(q.in_flight(), 1);
        q.cancel(Cancel::Tag(7)).unwrap();
        let done = wait_one(q.as_mut());
        assert_eq!(done.segments[0].result, -libc::ECANCELED);
    }

    #[test]
    fn segment_faults_fail_only_their_segments() {
        let dev = open("emu:null,size=1m,fail_range=8k-12k");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let mut bufs: Vec<IoBuf> = (0..4).map(|_| IoBuf::new(4096)).collect();
        let mut segs: Vec<(u64, &mut IoBuf)> = bufs.iter_mut().enumerate().map(|(i, b)| (i as u64 * 4096, b)).collect();
        let c = command(Op::Read, 1, &segs[..]);
        segs.clear();
        // SAFETY: the buffers outlive the wait below.
        unsafe { q.submit(c) };
        q.commit().unwrap();
        let done = wait_one(q.as_mut());
        let results: Vec<i32> = done.segments.iter().map(|s| s.result).collect();
        assert_eq!(results, vec![4096, 4096, -libc::EIO, 4096]);
    }

    #[test]
    fn segment_faults_can_be_kept_to_one_kind_of_command() {
        let dev = open("emu:null,size=1m,fail_range=0-1m,fail_op=write");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let mut buf = IoBuf::new(4096);
        for (op, tag, expect) in [(Op::Read, 1, 4096), (Op::Write, 2, -libc::EIO)] {
            let c = command(op, tag, &[(0, &mut buf)]);
            // SAFETY: the buffer outlives the wait below.
            unsafe { q.submit(c) };
            q.commit().unwrap();
            assert_eq!(wait_one(q.as_mut()).segments[0].result, expect, "{op:?}");
        }
    }

    #[test]
    fn bad_fault_options_are_explained() {
        for (spec, needle) in [
            ("emu:dram-ssd,fail_rate=2", "probability"),
            ("emu:dram-ssd,fail_nth=0", "start at 1"),
            ("emu:dram-ssd,fail_range=8k-4k", "below END"),
            ("emu:dram-ssd,errno=0", "error number"),
            ("emu:dram-ssd,fail_op=trim", "read, write or any"),
            ("null,commit_fail_nth=x", "not a valid number"),
        ] {
            let e = DeviceSpec::parse(spec, None).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.contains(needle), "{spec}: {e}");
        }
    }
}
