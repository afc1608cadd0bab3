//! `soak`: random paths, devices, threads, faults and flushes, every byte
//! checked, round after round, reproducible from a seed.
//!
//! Each round draws (from the seed and its own number, so any round can be
//! run again alone) a device (an emulated SSD, or a file through `psync`,
//! `uring` or `aio`), a path (any dispatch x completion, sometimes with knobs), a
//! thread count, a queue depth and faults for the [`fault`] wrapper to
//! inject; then [`exercise`] runs blocking and queued threads that write
//! self-describing blocks, read them back, flush now and then, and check
//! that every request completed or reported its error (none lost), that
//! every block holds a version it may hold, and that the wrapper's ownership
//! audit saw no buffer touched while the device owned it.
//!
//! [`fault`]: crate::device::fault

use crate::clock::now_ns;
use crate::device::Op;
use crate::engine::{Engine, Handle, HandleOptions};
use crate::error::{Error, Result};
use crate::path::{CombinePolling, CompletionKind, DispatchKind, PathConfig};
use std::path::PathBuf;
use std::time::Duration;

/// What [`exercise`] does on an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exercise {
    /// Threads; even ones use the blocking API, odd ones the queued API.
    pub threads: usize,
    /// Requests each thread issues.
    pub ops_per_thread: usize,
    /// Requests a queued thread keeps in flight.
    pub depth: usize,
    /// Blocks each thread owns.
    pub blocks_per_thread: u64,
    /// Bytes per block (a multiple of 512).
    pub block_size: usize,
    /// A blocking thread flushes once every this many requests (0: never).
    pub flush_every: usize,
    /// The errno injected failures report (besides ETIMEDOUT, the only error
    /// a request may end with).
    pub fault_errno: i32,
}

/// What an exercise saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Requests issued.
    pub issued: u64,
    /// Requests that succeeded.
    pub ok: u64,
    /// Requests that reported an error.
    pub failed: u64,
    /// Flushes issued (each also counted in `issued`).
    pub flushes: u64,
    /// Blocks read back and checked byte for byte.
    pub verified: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.issued += other.issued;
        self.ok += other.ok;
        self.failed += other.failed;
        self.flushes += other.flushes;
        self.verified += other.verified;
    }

    /// Requests neither completed nor failed: must be 0.
    pub fn lost(&self) -> u64 {
        self.issued - self.ok - self.failed
    }
}

/// The versions a block may hold: one after a successful write or read,
/// more after writes that failed (a failed write may or may not have reached
/// the device); `None` before anything is known (the block holds zeros or
/// any intact iopath sector pattern of its own offset).
#[derive(Debug, Clone)]
struct Versions(Option<Vec<u64>>);

impl Versions {
    fn allows(&self, v: u64) -> bool {
        self.0.as_ref().is_none_or(|vs| vs.contains(&v))
    }

    fn is(&mut self, v: u64) {
        self.0 = Some(vec![v]);
    }

    fn maybe(&mut self, v: u64) {
        if let Some(vs) = &mut self.0 {
            vs.push(v);
        }
    }
}

/// One thread's side of an exercise.
struct Worker<'a> {
    plan: &'a Exercise,
    thread: usize,
    versions: Vec<Versions>,
    next_version: u64,
    tally: Tally,
}

impl Worker<'_> {
    fn offset(&self, block: u64) -> u64 {
        (self.thread as u64 * self.plan.blocks_per_thread + block) * self.plan.block_size as u64
    }

    fn version(&mut self) -> u64 {
        // Above 1, the version iopath lays new files out with.
        self.next_version += 1;
        self.next_version
    }

    /// An error a request may end with under injected faults; anything else is a bug.
    fn expected_error(&self, e: &Error) -> Result<()> {
        match e {
            Error::Device { errno, .. } if *errno == self.plan.fault_errno => Ok(()),
            Error::Timeout { .. } => Ok(()),
            other => Err(Error::Verify {
                offset: 0,
                detail: format!("thread {}: a request failed with an unexpected error: {other}", self.thread),
            }),
        }
    }

    fn wrote(&mut self, block: u64, version: u64, result: &Result<()>) -> Result<()> {
        self.tally.issued += 1;
        match result {
            Ok(()) => {
                self.tally.ok += 1;
                self.versions[block as usize].is(version);
            }
            Err(e) => {
                self.expected_error(e)?;
                self.tally.failed += 1;
                self.versions[block as usize].maybe(version);
            }
        }
        Ok(())
    }

    fn read(&mut self, block: u64, buf: &[u8], result: &Result<()>) -> Result<()> {
        self.tally.issued += 1;
        if let Err(e) = result {
            self.expected_error(e)?;
            self.tally.failed += 1;
            return Ok(());
        }
        self.tally.ok += 1;
        let offset = self.offset(block);
        let version = if buf.iter().all(|&b| b == 0) {
            0
        } else {
            crate::pattern::check_any(buf, offset).map_err(|detail| Error::Verify { offset, detail })?;
            u64::from_le_bytes(buf[16..24].try_into().expect("8 bytes"))
        };
        // Every sector of the block must be the same version (a torn write is not).
        if version > 0 {
            crate::pattern::check(buf, offset, version).map_err(|detail| Error::Verify { offset, detail })?;
        }
        if !self.versions[block as usize].allows(version) {
            return Err(Error::Verify {
                offset,
                detail: format!(
                    "thread {} block {block} holds version {version}, but only {:?} may be there (a lost or \
                     misdirected write)",
                    self.thread, self.versions[block as usize].0
                ),
            });
        }
        self.versions[block as usize].is(version);
        self.tally.verified += 1;
        Ok(())
    }

    fn blocking(&mut self, engine: &Engine, rng: &mut fastrand::Rng) -> Result<()> {
        let bs = self.plan.block_size;
        let mut h = engine.handle(HandleOptions { depth: 1, buffers: 1, buffer_size: bs })?;
        for op in 0..self.plan.ops_per_thread {
            if self.plan.flush_every > 0 && op % self.plan.flush_every == self.plan.flush_every - 1 {
                let result = h.flush();
                self.tally.flushes += 1;
                self.tally.issued += 1;
                match result {
                    Ok(()) => self.tally.ok += 1,
                    Err(e) => {
                        self.expected_error(&e)?;
                        self.tally.failed += 1;
                    }
                }
                continue;
            }
            let block = rng.u64(..self.plan.blocks_per_thread);
            let offset = self.offset(block);
            if rng.bool() {
                let version = self.version();
                crate::pattern::fill(h.buffer(0).expect("idle"), offset, version);
                let result = h.write_from(0, offset, bs).map(drop);
                self.wrote(block, version, &result)?;
            } else {
                h.buffer(0).expect("idle").fill(0xee);
                let result = h.read_into(0, offset, bs).map(drop);
                let buf = h.buffer(0).expect("idle").to_vec();
                self.read(block, &buf, &result)?;
            }
        }
        Ok(())
    }

    fn queued(&mut self, engine: &Engine, rng: &mut fastrand::Rng) -> Result<()> {
        let (bs, depth) = (self.plan.block_size, self.plan.depth.clamp(1, self.plan.blocks_per_thread as usize));
        let mut h: Handle = engine.handle(HandleOptions { depth: depth as u32, buffers: depth, buffer_size: bs })?;
        let mut done = Vec::new();
        let mut blocks: Vec<u64> = (0..self.plan.blocks_per_thread).collect();
        for _ in 0..self.plan.ops_per_thread.div_ceil(depth) {
            rng.shuffle(&mut blocks);
            let mut writes = vec![None; depth];
            for slot in 0..depth {
                let offset = self.offset(blocks[slot]);
                let op = if rng.bool() {
                    let version = self.version();
                    crate::pattern::fill(h.buffer(slot).expect("idle"), offset, version);
                    writes[slot] = Some(version);
                    Op::Write
                } else {
                    h.buffer(slot).expect("idle").fill(0xee);
                    Op::Read
                };
                h.submit(op, slot, offset, bs)?;
            }
            h.commit()?;
            while h.queued() > 0 {
                h.reap(1, &mut done)?;
            }
            for c in done.drain(..) {
                let slot = c.tag as usize;
                match writes[slot] {
                    Some(version) => self.wrote(blocks[slot], version, &c.result)?,
                    None => {
                        let buf = h.buffer(slot).expect("reaped").to_vec();
                        self.read(blocks[slot], &buf, &c.result)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Runs `plan` on `engine` and checks it (see the module comment). An error
/// is a finding: a request lost, a block holding what it may not, an
/// unexpected error, or a buffer the device touched after giving it back.
pub fn exercise(engine: &Engine, plan: &Exercise, seed: u64) -> Result<Tally> {
    let violations_before = engine.device().stats().ownership_violations;
    let results: Vec<Result<Tally>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..plan.threads)
            .map(|thread| {
                scope.spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(seed ^ (thread as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    let mut worker = Worker {
                        plan,
                        thread,
                        versions: vec![Versions(None); plan.blocks_per_thread as usize],
                        next_version: 1,
                        tally: Tally::default(),
                    };
                    if thread % 2 == 0 {
                        worker.blocking(engine, &mut rng)?;
                    } else {
                        worker.queued(engine, &mut rng)?;
                    }
                    Ok(worker.tally)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    let mut tally = Tally::default();
    for r in results {
        tally.add(&r?);
    }
    let violations = engine.device().stats().ownership_violations - violations_before;
    if violations > 0 {
        return Err(Error::Verify {
            offset: 0,
            detail: format!("{violations} buffer(s) changed while the device owned them (the ownership audit)"),
        });
    }
    if tally.lost() > 0 {
        return Err(Error::Verify { offset: 0, detail: format!("{} request(s) lost", tally.lost()) });
    }
    Ok(tally)
}

/// What `iopath soak` runs.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// The seed every round's choices derive from.
    pub seed: u64,
    /// Stop starting rounds after this long.
    pub duration: Duration,
    /// Or after this many rounds.
    pub rounds: Option<u64>,
    /// Run only this round (to reproduce one).
    pub only_round: Option<u64>,
    /// Where `psync`/`uring`/`aio` rounds put their files; `None`: emulated devices only.
    pub dir: Option<PathBuf>,
}

/// One round's choices.
#[derive(Debug, Clone)]
pub struct Round {
    /// Its number (from 1).
    pub number: u64,
    /// The device spec (with faults).
    pub device: String,
    /// The path.
    pub path: PathConfig,
    /// What the threads do.
    pub plan: Exercise,
}

impl Round {
    /// The round `number` of `seed`: a pure function of the two.
    pub fn draw(seed: u64, number: u64, dir: Option<&std::path::Path>) -> Round {
        let mut rng = fastrand::Rng::with_seed(seed ^ number.wrapping_mul(0xd6e8_feb8_6659_fd93));
        let threads = rng.usize(1..=12);
        let block_size = 512 << rng.usize(0..=4);
        let blocks_per_thread = rng.u64(4..=24);
        let size = (threads as u64 * blocks_per_thread * block_size as u64).max(1 << 20);
        let errno = [libc::EIO, libc::EIO, libc::ENOSPC][rng.usize(0..3)];
        let mut faults = vec![format!("errno={errno}"), format!("seed={}", rng.u64(..))];
        let fault_menu = [
            "fail_rate=0.02",
            "fail_nth=7",
            "commit_fail_rate=0.03",
            "wait_fail_rate=0.02",
            "hang_nth=13",
            "spike_rate=0.02,spike=300us",
            "spike_rate=0.01,spike=60ms",
            "fail_range=8k-16k",
        ];
        // At most one of each kind (a spec names each option once).
        let mut menu: Vec<&str> = fault_menu.to_vec();
        rng.shuffle(&mut menu);
        menu.dedup_by_key(|f| f.split('=').next().unwrap_or_default());
        let mut kinds = std::collections::HashSet::new();
        for f in
            menu.into_iter().filter(|f| kinds.insert(f.split('=').next().unwrap_or_default())).take(rng.usize(0..=2))
        {
            faults.push(f.to_string());
        }
        if faults.len() == 2 {
            faults.push("audit=1".into());
        }
        let files = dir.is_some() && rng.u8(..4) == 0;
        let device = if files {
            let dir = dir.expect("checked");
            let backend = ["uring", "psync", "aio"][rng.usize(..3)];
            format!("{backend}:{},size={size}", round_file(dir, seed, number).display())
        } else {
            let preset = ["dram-ssd", "optane", "zssd", "nand", "null"][rng.usize(..5)];
            format!("emu:{preset},size={size},populate=0")
        };
        let device = format!("{device},{}", faults.join(","));
        let dispatch = DispatchKind::ALL[rng.usize(..DispatchKind::ALL.len())];
        let completion = CompletionKind::ALL[rng.usize(..CompletionKind::ALL.len())];
        let mut path = PathConfig::new(dispatch, completion);
        path.timeout = Duration::from_millis(40);
        if rng.bool() {
            path.combine_polling = CombinePolling::Winner;
        }
        if rng.u8(..3) == 0 {
            path.pipeline = rng.usize(1..=4);
            path.max_segments = Some(rng.usize(1..=64));
            path.waiter_spin = Some(Duration::from_micros(rng.u64(0..=200)));
        }
        let plan = Exercise {
            threads,
            ops_per_thread: rng.usize(16..=96),
            depth: rng.usize(1..=8),
            blocks_per_thread,
            block_size,
            flush_every: if rng.bool() { rng.usize(4..=20) } else { 0 },
            fault_errno: errno,
        };
        Round { number, device, path, plan }
    }

    /// A one-line description, with what reproduces it.
    pub fn describe(&self, seed: u64) -> String {
        format!(
            "round {} (iopath soak --seed {seed} --round {}): {} via {}{}, {} thread(s), depth {}, {} B blocks{}",
            self.number,
            self.number,
            self.device,
            self.path.label(),
            self.knobs(),
            self.plan.threads,
            self.plan.depth,
            self.plan.block_size,
            if self.plan.flush_every > 0 {
                format!(", a flush every {}", self.plan.flush_every)
            } else {
                String::new()
            },
        )
    }

    /// The knobs that differ from the defaults, as a path name writes them.
    fn knobs(&self) -> String {
        let p = &self.path;
        let mut out = String::new();
        if p.combine_polling == CombinePolling::Winner {
            out.push_str("@combine-polling=winner");
        }
        if p.pipeline != crate::path::DEFAULT_PIPELINE {
            out.push_str(&format!("@pipeline={}", p.pipeline));
        }
        if let Some(m) = p.max_segments {
            out.push_str(&format!("@max-segments={m}"));
        }
        if let Some(w) = p.waiter_spin {
            out.push_str(&format!("@waiter-spin={}us", w.as_micros()));
        }
        out
    }

    /// Runs the round.
    pub fn run(&self, seed: u64) -> Result<RoundReport> {
        let device = crate::device::DeviceSpec::parse(&self.device, None)?.open()?;
        let engine = Engine::with_device(device, self.path.clone())?;
        let tally = exercise(&engine, &self.plan, seed ^ self.number)?;
        let stats = engine.device().stats();
        Ok(RoundReport { tally, faults_injected: stats.faults_injected })
    }
}

/// The file a round on `psync`/`uring`/`aio` uses (created by the round, removed after it).
fn round_file(dir: &std::path::Path, seed: u64, number: u64) -> PathBuf {
    dir.join(format!("iopath-soak-{}-{seed}-{number}.img", std::process::id()))
}

/// What one round saw.
#[derive(Debug, Clone, Copy, Default)]
pub struct RoundReport {
    /// Requests.
    pub tally: Tally,
    /// Faults the wrapper injected.
    pub faults_injected: u64,
}

/// What a soak saw.
#[derive(Debug, Clone, Default)]
pub struct SoakReport {
    /// Rounds run.
    pub rounds: u64,
    /// All requests.
    pub tally: Tally,
    /// Faults injected over all rounds.
    pub faults_injected: u64,
    /// Resident memory after the first round and at the end, and the most seen (KiB).
    pub rss_kib: (u64, u64, u64),
    /// Wall time.
    pub elapsed: Duration,
}

/// Resident memory of this process (KiB), from /proc/self/status.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Runs rounds until the duration (or round count) is reached, Ctrl-C, or a
/// finding (returned as the error, with the round that reproduces it).
pub fn soak(
    config: &SoakConfig,
    mut on_start: impl FnMut(&Round),
    mut on_round: impl FnMut(&Round, &RoundReport),
) -> Result<SoakReport> {
    let start = now_ns();
    let mut report = SoakReport::default();
    let numbers: Box<dyn Iterator<Item = u64>> = match config.only_round {
        Some(n) => Box::new(std::iter::once(n)),
        None => Box::new(1..),
    };
    for number in numbers {
        let elapsed = Duration::from_nanos(now_ns() - start);
        let enough = config.rounds.map_or(elapsed >= config.duration, |r| number > r);
        if (config.only_round.is_none() && enough) || crate::signal::interrupted() {
            break;
        }
        let round = Round::draw(config.seed, number, config.dir.as_deref());
        on_start(&round);
        let result = round
            .run(config.seed)
            .map_err(|e| Error::Verify { offset: 0, detail: format!("{} failed: {e}", round.describe(config.seed)) });
        if let Some(dir) = &config.dir {
            let _ = std::fs::remove_file(round_file(dir, config.seed, number));
        }
        let r = result?;
        report.rounds += 1;
        report.tally.add(&r.tally);
        report.faults_injected += r.faults_injected;
        let rss = rss_kib();
        if report.rounds == 1 {
            report.rss_kib = (rss, rss, rss);
        }
        report.rss_kib.1 = rss;
        report.rss_kib.2 = report.rss_kib.2.max(rss);
        on_round(&round, &r);
    }
    report.elapsed = Duration::from_nanos(now_ns() - start);
    Ok(report)
}
