//! The judge: whether `auto`'s waits follow each waiter's own choice or all
//! sleep, decided for the whole process from the progress it makes.
//!
//! Each waiter's controller ([`adaptive`](super::adaptive)) prices its own
//! latency and CPU time; what it cannot see is what its waiting costs the
//! rest of the program. Yielding and polling are cheap for a waiter and
//! costly for a program whose other threads need the CPUs (and whose waiting
//! threads hold locks those need). The judge measures the program instead:
//! completions per second with each way, in short alternating trials.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

/// How the waits of a self-choosing policy (`auto`) wait, process-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Each waiter waits in its own controller's mode (polling, yielding,
    /// hybrid or sleeping, from what it measures), and a crowd (more waiters
    /// than CPUs) yields between looks: the waiters hand each other and the
    /// device's worker the CPUs without a wake-up each.
    PerWaiter,
    /// Every wait sleeps until woken, as the kernel's blocking calls do: each
    /// pays a wake-up, but no CPU goes to waiting, the program's own work gets
    /// it all, and a completion wakes its waiter at once.
    Sleep,
}

impl Way {
    /// Name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Way::PerWaiter => "per-waiter modes",
            Way::Sleep => "sleeping",
        }
    }

    /// The other way.
    pub fn other(self) -> Way {
        match self {
            Way::PerWaiter => Way::Sleep,
            Way::Sleep => Way::PerWaiter,
        }
    }
}

/// Who contested the CPUs in a window of the [`Judge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contest {
    /// Nobody: the waiters had CPUs to themselves (or beside a hog or two,
    /// which each waiter's own controller handles).
    Free,
    /// The process's own waiters, more of them than CPUs at once (a crowd)
    /// or in turn ([`note_waiter`]), with few other threads runnable:
    /// blocking threads on a fast device (fio's jobs, `iopath bench`).
    Waiters,
    /// The waiters, and threads that are not waiting for the device wanted
    /// the CPUs too ([`cpus_wanted`](super::crowd::cpus_wanted) in at least
    /// a quarter of the waiters' looks): a program whose own threads compute
    /// (MariaDB's under sysbench).
    Others,
}

impl Contest {
    /// Whether anyone contested the CPUs.
    pub fn contested(self) -> bool {
        self != Contest::Free
    }
}

/// Length of one measuring window of the [`Judge`].
pub const WINDOW_NS: u64 = 100_000_000;
/// Windows the way in use is kept before it is tried against the other
/// (the first time, and after each switch); x2 each time a trial keeps it
/// (x4 after a clear loss of the other way), up to [`MAX_STAY_WINDOWS`].
pub const FIRST_STAY_WINDOWS: u32 = 2;
/// Windows the judge watches before it may open in sleeping: the first holds
/// the start of the program's threads (all runnable, few waiting yet), which
/// looks like threads that are not waiting wanting the CPUs, whoever they are.
pub const OPENING_WINDOWS: u32 = 2;
/// Longest stay between two trials (4 s).
pub const MAX_STAY_WINDOWS: u32 = 40;
/// A trial whose first pair of windows the way in use wins by this much
/// (twice the 10-20% a program's progress moves by on its own over 100 ms)
/// ends there, a clear loss of the way tried: its second window would cost
/// the program another 100 ms of the worse way to say the same.
pub const EARLY_LOSS: f64 = 1.3;
/// The other way replaces the one in use when its windows made this much
/// more progress (completions per second) in two trials in a row.
pub const JUDGE_MARGIN: f64 = 1.03;
/// ... or this much more in one: a program's progress over 100 ms moves by
/// 10-20% on its own (MariaDB under sysbench), and one narrow trial flipped
/// the way back and forth.
pub const CLEAR_WIN: f64 = 1.15;

/// Chooses the process's [`Way`] from what each way achieves: the process's
/// completions per second. Which way wins depends on the program, not on what
/// one waiter sees: fio's blocking jobs on a loop device make 1.4-1.7x the
/// kernel's IOPS with per-waiter modes (polling, yielding in a crowd: no
/// wake-ups), while MariaDB's read-write mix, whose waiting threads hold locks
/// its other threads need and whose CPUs are busy with its own work, lost a
/// third of its transactions to them (crowded waits of 201 us on average where
/// a sleeping wait took 75 us: 0.65-0.68x the kernel at 4 threads, where
/// sleeping gave 0.99x). Each waiter's controller prices its own latency and
/// CPU; none sees the program's progress, and no model of the run queue tells
/// the two programs apart ahead of time. A trial does.
///
/// A trial is four windows of [`WINDOW_NS`] in the order other way, way in
/// use, way in use, other way (ABBA: a steady drift of the program's own
/// progress, a cache warming up, falls on both ways alike; in the order
/// ABAB it favoured the way in use by a window's drift: db_bench readrandom
/// starting cold, its rate rising every window, kept sleeping through three
/// trials of a 5 s run that per-waiter modes won by 4-6%), and the
/// sums of their completion rates decide (after two windows where the way
/// in use is [`EARLY_LOSS`] ahead): the other way replaces the one in
/// use if it made [`CLEAR_WIN`] more progress, or [`JUDGE_MARGIN`] more in
/// two trials in a row. Between trials the way in use stays for
/// [`FIRST_STAY_WINDOWS`], longer while trials keep confirming it, so a
/// settled program pays a losing trial's 200 ms at most every few seconds.
/// A window much longer than planned (no wait came to end it: the program
/// paused) measured something else and is not counted. A pure function of
/// its inputs, tested with synthetic programs.
#[derive(Debug, Clone)]
pub struct Judge {
    way: Way,
    /// Windows left before the next trial (in steady state).
    stay_left: u32,
    stay: u32,
    /// In a trial: the window it is in (0..4) and the rates so far (the other
    /// way's, the way in use's).
    trial: Option<(u32, f64, f64)>,
    /// Windows left until the opening ends ([`OPENING_WINDOWS`]).
    opening: u32,
    /// The trial under way repeats one the other way won narrowly.
    confirming: bool,
    /// The CPUs were contested since the last trial (see [`Judge::on_window`]).
    contested: bool,
    /// Trials run, and those that switched the way.
    pub trials: u64,
    /// See [`Judge::trials`].
    pub switches: u64,
}

impl Default for Judge {
    fn default() -> Self {
        Judge::new()
    }
}

/// What the judge decided at the end of a trial.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrialResult {
    /// The way tried against the one in use.
    pub tried: Way,
    /// The way kept or chosen.
    pub way: Way,
    /// Whether it changed.
    pub switched: bool,
    /// The way tried won narrowly: a second trial follows at once to confirm.
    pub confirming: bool,
    /// Mean completions per second of the way tried and of the way that was in use.
    pub rates: (f64, f64),
    /// Windows until the next trial.
    pub stay: u32,
}

/// How the judge's opening ended ([`OPENING_WINDOWS`]): the way it chose,
/// and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opening {
    /// The way in use from here on (sleeping: per-waiter modes tried at once).
    pub way: Way,
    /// Who contested the CPUs in the window that decided.
    pub contest: Contest,
    /// The waiters' looks at the run queue in that window, and how many found
    /// the CPUs wanted by threads that are not waiting.
    pub looks: (u64, u64),
}

/// A decision of the judge worth saying (`IOPATH_LOG=1`, `--explain`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decision {
    /// The opening ended.
    Opening(Opening),
    /// A trial ended.
    Trial(TrialResult),
}

impl Judge {
    /// Starts with per-waiter modes; if threads that are not waiting wanted
    /// the CPUs in the last window of the opening ([`Contest::Others`]),
    /// sleeping, with per-waiter modes tried against it at once.
    pub fn new() -> Judge {
        Judge {
            opening: OPENING_WINDOWS,
            way: Way::PerWaiter,
            stay_left: FIRST_STAY_WINDOWS,
            stay: FIRST_STAY_WINDOWS,
            trial: None,
            confirming: false,
            contested: false,
            trials: 0,
            switches: 0,
        }
    }

    /// The way waits take in the current window.
    pub fn way(&self) -> Way {
        match self.trial {
            Some((i, _, _)) if tries_other(i) => self.way.other(),
            _ => self.way,
        }
    }

    /// Whether a trial is under way.
    pub fn in_trial(&self) -> bool {
        self.trial.is_some()
    }

    /// The way in use (the one a trial, if any, tries the other way against).
    pub fn way_in_use(&self) -> Way {
        self.way
    }

    /// Whether the opening is over.
    pub fn opened(&self) -> bool {
        self.opening == 0
    }

    /// Ends a window of `wall_ns` in which the process completed
    /// `completions`, with the CPUs contested as `contest` says (a crowd, or
    /// many taking turns: [`note_contested`]; others wanting them too:
    /// [`note_waiter`]); returns the trial's result when one ended.
    ///
    /// Per-waiter modes are tried against sleeping only if the CPUs were
    /// contested since the last trial: a waiter alone with free CPUs (or
    /// beside a hog or two, which its own controller handles) has nothing to
    /// gain from sleeping, and a trial would cost it 200 ms of wake-ups
    /// (seed 001's matrix, 1 s runs: auto 0.94x poll with trials, 0.98x
    /// without). Sleeping is always tried against per-waiter modes.
    pub fn on_window(&mut self, completions: u64, wall_ns: u64, contest: Contest) -> Option<TrialResult> {
        if wall_ns == 0 || wall_ns > 2 * WINDOW_NS {
            return None; // not a window's measurement: the same window again
        }
        let opening_ends = self.opening == 1;
        self.opening = self.opening.saturating_sub(1);
        if opening_ends && contest == Contest::Others {
            // A program whose own threads want the CPUs once it is running (the first
            // window holds the start of its threads, all runnable and few waiting yet,
            // whoever they are): sleep, as the kernel's calls do, and try per-waiter
            // modes against it at once; a tie (a program still starting) keeps
            // sleeping. Starting with per-waiter modes and a stay cost MariaDB's
            // read-write mix at 16 threads 1-1.8 s of a 5 s run (0.86x the kernel
            // where sleeping throughout made 0.97x), and a trial at once from them fell
            // on its start-up, tied, and kept them (0.90-0.92x at 4 and 16 threads). A
            // crowd of the process's own waiters alone (blocking threads on a fast
            // device) keeps per-waiter modes and tries sleeping after the stay: opening
            // in sleeping cost 32 such threads on a loop device 6 of a 3 s run's 30
            // windows asleep, each 8-20% slower.
            self.way = Way::Sleep;
            self.trial = Some((0, 0.0, 0.0));
            return None;
        }
        self.contested |= contest.contested();
        let rate = completions as f64 * 1e9 / wall_ns as f64;
        match self.trial {
            None => {
                self.stay_left = self.stay_left.saturating_sub(1);
                if self.stay_left == 0 {
                    if self.way == Way::Sleep || std::mem::take(&mut self.contested) {
                        self.trial = Some((0, 0.0, 0.0));
                    } else {
                        self.stay_left = self.stay;
                    }
                }
                None
            }
            Some((i, tried, kept)) => {
                let (tried, kept) = if tries_other(i) { (tried + rate, kept) } else { (tried, kept + rate) };
                let early = i == 1 && kept > EARLY_LOSS * tried;
                if i < 3 && !early {
                    self.trial = Some((i + 1, tried, kept));
                    return None;
                }
                self.trial = None;
                self.trials += 1;
                // Windows of each way the sums cover.
                let windows = if early { 1.0 } else { 2.0 };
                let tried_way = self.way.other();
                let wins = tried > JUDGE_MARGIN * kept;
                let switched = wins && (self.confirming || tried > CLEAR_WIN * kept);
                self.confirming = wins && !switched;
                if switched {
                    self.way = tried_way;
                    self.switches += 1;
                    self.stay = FIRST_STAY_WINDOWS;
                } else if !wins {
                    // A clear loss (the way in use 15% ahead) waits four times as long
                    // for the next trial: MariaDB's read-write mix lost every trial of
                    // per-waiter modes by 15-30%, and each cost it a few percent of a run.
                    let factor = if kept > CLEAR_WIN * tried { 4 } else { 2 };
                    self.stay = (self.stay * factor).min(MAX_STAY_WINDOWS);
                }
                if self.confirming {
                    self.trial = Some((0, 0.0, 0.0));
                }
                self.stay_left = self.stay;
                Some(TrialResult {
                    tried: tried_way,
                    way: self.way,
                    switched,
                    confirming: self.confirming,
                    rates: (tried / windows, kept / windows),
                    stay: self.stay,
                })
            }
        }
    }
}

/// Whether window `i` (0..4) of a trial tries the other way: the first and
/// the last (see [`Judge`]).
fn tries_other(i: u32) -> bool {
    i == 0 || i == 3
}

/// The process's judge, and when its current window began (ns, with the
/// completion count then).
static JUDGE: Mutex<(Option<Judge>, u64, u64)> = Mutex::new((None, 0, 0));
/// The way waits take now (0 = per waiter, 1 = sleep): read without the lock.
static WAY: AtomicU8 = AtomicU8::new(0);
/// When the current window ends (0 = no window yet).
static WINDOW_END_NS: AtomicU64 = AtomicU64::new(0);
/// Completions of every wait of the judged policies.
static PROGRESS: AtomicU64 = AtomicU64::new(0);
/// The CPUs were contested in the current window (see [`Judge::on_window`]).
static CONTESTED: AtomicBool = AtomicBool::new(false);
/// Looks at the run queue in the current window ([`note_waiter`]): how many
/// (the high 32 bits), and how many found the CPUs wanted by threads that
/// are not waiting (the low 32).
static LOOKS: AtomicU64 = AtomicU64::new(0);

/// Forgets what the judge learned: the next wait starts a new judge (a
/// benchmark's next run, which is another program as far as waiting goes).
pub fn reset() {
    let mut guard = JUDGE.lock().unwrap_or_else(|e| e.into_inner());
    *guard = (None, 0, 0);
    WAY.store(0, Ordering::Relaxed);
    WINDOW_END_NS.store(0, Ordering::Relaxed);
    CONTESTED.store(false, Ordering::Relaxed);
    WAITERS.store(0, Ordering::Relaxed);
    LOOKS.store(0, Ordering::Relaxed);
}

/// Makes waits take `way` until the current window ends (tests that change
/// the way between any two waits).
#[cfg(test)]
pub(crate) fn force_way(way: Way) {
    WAY.store(u8::from(way == Way::Sleep), Ordering::Relaxed);
}

/// Notes that a waiter found the CPUs contested: more waiters than CPUs, at
/// once (a crowd) or in turn within a window ([`note_waiter`]).
///
/// Only the process's own waiters count. The run queue's "others want the CPUs"
/// ([`cpus_wanted`](super::crowd::cpus_wanted)) fires for a single-threaded
/// program beside a loop device's worker threads (569 of SQLite's 3000
/// transactions' waits), and made the judge start SQLite sleeping and run
/// trials it could only lose.
pub fn note_contested() {
    if !CONTESTED.load(Ordering::Relaxed) {
        CONTESTED.store(true, Ordering::Relaxed);
    }
}

/// Distinct waiters seen in the current window: the window's key (its end,
/// in ms) in the high bits, the count in the low 16.
static WAITERS: AtomicU64 = AtomicU64::new(0);

/// Distinct waiters per CPU in one window above which the CPUs count as
/// contested, though the waiters came one at a time: a program whose
/// threads take turns at the device (db_bench fillsync at 16 threads: 16-18
/// of them in every window). At one per CPU, RocksDB's own writer and its
/// background threads (flush, compaction) counted, and db_bench `overwrite
/// --sync=1` lost 6% to trials it could only lose (16.2-19.4K writes/s
/// against 14.4-17.2K, 4 alternated runs); at two, they still reached 5 in
/// a window now and then.
pub const TAKING_TURNS_PER_CPU: u64 = 4;

/// Notes that the thread whose last noted window is `*last_window` waits in
/// the current one; the CPUs count as contested ([`note_contested`]) once
/// more than [`TAKING_TURNS_PER_CPU`] distinct threads per CPU waited in one
/// window, even one at a time.
///
/// A program whose threads take turns at the device (RocksDB's group commit:
/// one leader waits for each sync while the others queue behind it, a new
/// leader each time) never forms a crowd, yet its waiters' yields hand the
/// CPU to the program's other runnable threads and come back late: db_bench
/// fillsync at 16 threads on a mount made 31.7-35.7K writes/s with
/// per-waiter modes (yielding waits of 69 us on average, for a device time
/// of 25 us) where sleeping made 36.0-38.4K. A single-threaded program
/// (SQLite) never counts, beside any number of device workers.
pub fn note_waiter(last_window: &mut u64) {
    let key = WINDOW_END_NS.load(Ordering::Relaxed) / 1_000_000;
    if *last_window == key {
        return;
    }
    *last_window = key;
    let wanted = super::crowd::cpus_wanted();
    LOOKS.fetch_add(1 << 32 | u64::from(wanted), Ordering::Relaxed);
    let mut seen = 0;
    let _ = WAITERS.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
        let next = one_more_waiter(v, key);
        seen = next & 0xffff;
        Some(next)
    });
    if taking_turns(seen, super::crowd::cpus()) {
        note_contested();
    }
}

/// The window's [`Contest`] from whether the CPUs were `contested` and the
/// packed [`LOOKS`]: others wanted them in at least a quarter of the looks.
fn contest_of(contested: bool, looks: u64) -> Contest {
    let (all, wanted) = unpack_looks(looks);
    match contested {
        false => Contest::Free,
        true if wanted > 0 && 4 * wanted >= all => Contest::Others,
        true => Contest::Waiters,
    }
}

/// The packed [`LOOKS`] as (looks, looks that found the CPUs wanted).
fn unpack_looks(looks: u64) -> (u64, u64) {
    (looks >> 32, looks & 0xffff_ffff)
}

/// [`WAITERS`] after one more distinct waiter noted itself in window `key`.
fn one_more_waiter(packed: u64, key: u64) -> u64 {
    let seen = if packed >> 16 == key { (packed & 0xffff) + 1 } else { 1 };
    key << 16 | seen.min(0xffff)
}

/// Whether `seen` distinct waiters in one window on `cpus` CPUs contest them.
fn taking_turns(seen: u64, cpus: usize) -> bool {
    seen > TAKING_TURNS_PER_CPU * cpus as u64
}

/// Counts `n` completions of a wait of a judged policy (any way, any mode):
/// the progress the [`Judge`] compares.
pub fn note_progress(n: usize) {
    if n > 0 {
        PROGRESS.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// The way waits take now, as the last window set it (one atomic load; a
/// wait's own [`way_now`] may end the window and change it).
pub fn way() -> Way {
    if WAY.load(Ordering::Relaxed) == 1 { Way::Sleep } else { Way::PerWaiter }
}

/// The way a wait starting at `now_ns` takes; the first wait past the end of
/// a window ends it (one thread, under a lock no one waits for) and returns
/// what the judge decided, if anything. Two atomic loads otherwise.
pub fn way_now(now_ns: u64) -> (Way, Option<Decision>) {
    let mut result = None;
    if now_ns >= WINDOW_END_NS.load(Ordering::Relaxed)
        && let Ok(mut guard) = JUDGE.try_lock()
        && now_ns >= WINDOW_END_NS.load(Ordering::Relaxed)
    {
        let (judge, began_ns, began_count) = &mut *guard;
        let progress = PROGRESS.load(Ordering::Relaxed);
        let judge = judge.get_or_insert_with(Judge::new);
        if *began_ns != 0 {
            let looks = LOOKS.swap(0, Ordering::Relaxed);
            let contest = contest_of(CONTESTED.swap(false, Ordering::Relaxed), looks);
            let opening = !judge.opened();
            result = judge.on_window(progress - *began_count, now_ns - *began_ns, contest).map(Decision::Trial);
            if opening && judge.opened() {
                let looks = unpack_looks(looks);
                result = Some(Decision::Opening(Opening { way: judge.way_in_use(), contest, looks }));
            }
        }
        (*began_ns, *began_count) = (now_ns, progress);
        WAY.store(u8::from(judge.way() == Way::Sleep), Ordering::Relaxed);
        WINDOW_END_NS.store(now_ns + WINDOW_NS, Ordering::Relaxed);
    }
    (way(), result)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `judge` for `windows` windows of a program that completes
    /// `rate(way)` I/Os per second and whose own computing threads want the
    /// CPUs; returns the ways of the windows.
    fn run(judge: &mut Judge, windows: usize, rate: impl Fn(Way) -> f64) -> Vec<Way> {
        run_contested(judge, windows, Contest::Others, rate)
    }

    /// A judge past its opening windows, each contested as `contest` says.
    fn opened(contest: Contest) -> Judge {
        let mut judge = Judge::new();
        for _ in 0..OPENING_WINDOWS {
            judge.on_window(1000, WINDOW_NS, contest);
        }
        judge
    }

    /// [`run`] of a program whose windows are all contested as `contest` says.
    fn run_contested(judge: &mut Judge, windows: usize, contest: Contest, rate: impl Fn(Way) -> f64) -> Vec<Way> {
        (0..windows)
            .map(|_| {
                let way = judge.way();
                judge.on_window((rate(way) * WINDOW_NS as f64 / 1e9) as u64, WINDOW_NS, contest);
                way
            })
            .collect()
    }

    #[test]
    fn the_judge_keeps_per_waiter_modes_where_they_make_more_progress_and_tries_less_often() {
        // Blocking threads on a loop device: per-waiter modes (a yielding crowd) 400K/s,
        // sleeping 160K/s; nothing but the crowd wants the CPUs.
        let mut judge = Judge::new();
        let rate = |w| if w == Way::PerWaiter { 400e3 } else { 160e3 };
        let ways = run_contested(&mut judge, 600, Contest::Waiters, rate);
        assert_eq!(judge.way(), Way::PerWaiter);
        // Per-waiter modes from the start; sleeping tried after the first stay, a
        // clear loss after one window of each.
        assert_eq!(ways[..5], [Way::PerWaiter, Way::PerWaiter, Way::Sleep, Way::PerWaiter, Way::PerWaiter]);
        assert!(!ways[3..3 + 4 * FIRST_STAY_WINDOWS as usize].contains(&Way::Sleep), "{ways:?}");
        assert_eq!(judge.switches, 0);
        // Where threads that are not waiting want the CPUs at the start: sleeping,
        // with a trial at once that per-waiter modes win (tried first and last).
        let mut judge = Judge::new();
        let ways = run(&mut judge, 600, rate);
        assert_eq!(ways[..OPENING_WINDOWS as usize], [Way::PerWaiter; OPENING_WINDOWS as usize]);
        assert_eq!(ways[2..6], [Way::PerWaiter, Way::Sleep, Way::Sleep, Way::PerWaiter]);
        assert_eq!(ways[6], Way::PerWaiter);
        assert_eq!(judge.switches, 1);
        // Trials back off to one every 4 s: a losing trial's 2 windows in 40.
        let slept = ways[300..].iter().filter(|&&w| w == Way::Sleep).count();
        assert!(slept <= 2 * 300 / MAX_STAY_WINDOWS as usize + 2, "{slept}");
        assert!(judge.trials >= 10, "{}", judge.trials);
    }

    #[test]
    fn the_judge_goes_to_sleeping_where_waiting_costs_the_program_progress() {
        // MariaDB read-write: per-waiter modes 10K/s, sleeping 14K/s.
        let mut judge = Judge::new();
        let ways = run(&mut judge, 200, |w| if w == Way::PerWaiter { 10e3 } else { 14e3 });
        assert_eq!(judge.way(), Way::Sleep);
        assert_eq!(judge.switches, 0, "sleeping from the first window on, and trials keep it");
        // A tie (a program still starting up): contested from the start, it keeps sleeping.
        let mut judge = Judge::new();
        run(&mut judge, 100, |_| 12e3);
        assert_eq!((judge.way, judge.switches), (Way::Sleep, 0));
        // After the first window and the first trial it sleeps but for trials.
        let yielded = ways[5..].iter().filter(|&&w| w == Way::PerWaiter).count();
        assert!(yielded <= 2 * 195 / 10, "{yielded}");
    }

    #[test]
    fn others_contest_the_cpus_when_a_quarter_of_the_looks_found_them_wanted() {
        let looks = |all: u64, wanted: u64| all << 32 | wanted;
        assert_eq!(contest_of(false, looks(40, 40)), Contest::Free, "not contested: nobody");
        assert_eq!(contest_of(true, 0), Contest::Waiters, "no look: the waiters");
        assert_eq!(contest_of(true, looks(32, 0)), Contest::Waiters);
        assert_eq!(contest_of(true, looks(32, 7)), Contest::Waiters);
        assert_eq!(contest_of(true, looks(32, 8)), Contest::Others);
        assert_eq!(contest_of(true, looks(9, 9)), Contest::Others);
        // The opening's second window decides; the first (threads starting) does not.
        let mut judge = Judge::new();
        judge.on_window(1000, WINDOW_NS, Contest::Others);
        assert!(!judge.opened() && judge.way_in_use() == Way::PerWaiter);
        judge.on_window(1000, WINDOW_NS, Contest::Others);
        assert!(judge.opened() && judge.way_in_use() == Way::Sleep && judge.in_trial());
        let mut judge = Judge::new();
        judge.on_window(1000, WINDOW_NS, Contest::Others);
        judge.on_window(1000, WINDOW_NS, Contest::Waiters);
        // Per-waiter modes kept; the stay (the opening's windows) over, sleeping is tried.
        assert!(judge.opened() && judge.way_in_use() == Way::PerWaiter && judge.way() == Way::Sleep);
    }

    #[test]
    fn waiters_are_counted_per_window_and_contest_the_cpus_only_when_many_take_turns() {
        // Nine threads in one window, each counted once (a thread notes a window once).
        let mut packed = 0;
        for _ in 0..9 {
            packed = one_more_waiter(packed, 42);
        }
        assert_eq!(packed, 42 << 16 | 9);
        // A new window starts the count afresh.
        assert_eq!(one_more_waiter(packed, 43), 43 << 16 | 1);
        // The count saturates instead of spilling into the key.
        assert_eq!(one_more_waiter(7 << 16 | 0xffff, 7), 7 << 16 | 0xffff);
        // RocksDB's writer and background threads (up to 5 here) do not contest
        // two CPUs; sixteen group-commit leaders do.
        assert!(!taking_turns(5, 2));
        assert!(!taking_turns(8, 2));
        assert!(taking_turns(9, 2));
        assert!(taking_turns(16, 2));
        assert!(!taking_turns(16, 4));
    }

    #[test]
    fn the_judge_follows_a_program_that_changes_and_ignores_small_differences() {
        let mut judge = Judge::new();
        run(&mut judge, 100, |w| if w == Way::PerWaiter { 100e3 } else { 50e3 });
        assert_eq!(judge.way(), Way::PerWaiter);
        // The program turns CPU-bound: within the longest stay and one trial it follows.
        run(&mut judge, (MAX_STAY_WINDOWS + 4) as usize, |w| if w == Way::PerWaiter { 30e3 } else { 60e3 });
        assert_eq!(judge.way(), Way::Sleep);
        // Within the margin: it stays where it is.
        let switches = judge.switches;
        run(&mut judge, 300, |w| if w == Way::PerWaiter { 60.6e3 } else { 60e3 });
        assert_eq!((judge.way(), judge.switches), (Way::Sleep, switches));
    }

    #[test]
    fn a_narrow_win_switches_only_when_a_second_trial_confirms_it() {
        // 8% ahead every time: the first trial asks for a second, which switches.
        // (An uncontested first window: the judge starts with per-waiter modes.)
        let mut judge = opened(Contest::Free);
        let mut results = Vec::new();
        for _ in 0..12 {
            let way = judge.way();
            let rate = if way == Way::Sleep { 10.8e3 } else { 10e3 };
            results.extend(judge.on_window((rate * WINDOW_NS as f64 / 1e9) as u64, WINDOW_NS, Contest::Others));
        }
        assert!(results[0].confirming && !results[0].switched, "{results:?}");
        assert!(results[1].switched && !results[1].confirming, "{results:?}");
        assert_eq!(results[1].way, Way::Sleep);

        // 8% ahead in one trial and behind in the next (noise): no switch.
        let mut judge = opened(Contest::Free);
        let mut trial = 0;
        for _ in 0..200 {
            let way = judge.way();
            let ahead = if trial % 2 == 0 { 10.8e3 } else { 9.2e3 };
            let rate = if way == Way::Sleep { ahead } else { 10e3 };
            if let Some(t) = judge.on_window((rate * WINDOW_NS as f64 / 1e9) as u64, WINDOW_NS, Contest::Others) {
                trial += 1;
                assert!(!t.switched, "{t:?}");
            }
        }
        assert_eq!((judge.way(), judge.switches), (Way::PerWaiter, 0));
    }

    #[test]
    fn a_program_whose_progress_rises_every_window_does_not_favour_the_way_in_use() {
        // Sleeping in use (contested from the start); per-waiter modes 5% ahead
        // while the program's own rate rises 5% a window (a cache warming). In the
        // order ABAB the way in use got the later windows of each pair and the
        // trials read a tie; ABBA gives both ways the same share of the rise.
        let mut judge = opened(Contest::Others);
        assert!(judge.in_trial());
        let mut window = 0u32;
        let mut results = Vec::new();
        while results.len() < 2 {
            let base = 10e3 * (1.0 + 0.05 * window as f64);
            let rate = if judge.way() == Way::PerWaiter { 1.05 * base } else { base };
            results.extend(judge.on_window((rate * WINDOW_NS as f64 / 1e9) as u64, WINDOW_NS, Contest::Others));
            window += 1;
        }
        assert!(results[0].confirming, "{results:?}");
        assert!(results[1].switched, "{results:?}");
        assert_eq!(judge.way(), Way::PerWaiter);
    }

    #[test]
    fn a_trial_the_way_tried_clearly_loses_ends_after_one_window_of_each() {
        // Per-waiter modes in use (an uncontested first window), then a trial of sleeping.
        let start = || {
            let mut judge = opened(Contest::Free);
            while !judge.in_trial() {
                judge.on_window(10_000, WINDOW_NS, Contest::Others);
            }
            assert_eq!(judge.way(), Way::Sleep);
            judge
        };
        let window = |rate: f64| (rate * WINDOW_NS as f64 / 1e9) as u64;
        // Sleeping 35% behind in its first window: the trial ends after the next one.
        let mut judge = start();
        assert_eq!(judge.on_window(window(100e3), WINDOW_NS, Contest::Others), None);
        let t = judge.on_window(window(135e3), WINDOW_NS, Contest::Others).expect("the trial ended");
        assert!(!t.switched && !t.confirming && t.way == Way::PerWaiter, "{t:?}");
        assert_eq!(t.rates, (100e3, 135e3));
        assert!(!judge.in_trial());
        assert_eq!(t.stay, 4 * FIRST_STAY_WINDOWS, "a clear loss: four times the stay");
        // 20% behind (within what a program's progress moves by): all four windows.
        let mut judge = start();
        assert_eq!(judge.on_window(window(100e3), WINDOW_NS, Contest::Others), None);
        assert_eq!(judge.on_window(window(120e3), WINDOW_NS, Contest::Others), None);
        assert!(judge.in_trial());
        assert_eq!(judge.on_window(window(100e3), WINDOW_NS, Contest::Others), None);
        assert!(judge.on_window(window(120e3), WINDOW_NS, Contest::Others).is_some());
        // A way tried that is far ahead in its first window is not cut short: it
        // must win the whole trial to switch.
        let mut judge = start();
        assert_eq!(judge.on_window(window(200e3), WINDOW_NS, Contest::Others), None);
        assert_eq!(judge.on_window(window(100e3), WINDOW_NS, Contest::Others), None);
        assert!(judge.in_trial());
    }

    #[test]
    fn a_waiter_with_uncontested_cpus_is_never_made_to_try_sleeping() {
        let mut judge = Judge::new();
        for _ in 0..100 {
            assert_eq!(judge.way(), Way::PerWaiter);
            assert_eq!(judge.on_window(5000, WINDOW_NS, Contest::Free), None);
        }
        assert_eq!(judge.trials, 0);
        // Contested once: the next trial comes when the stay ends.
        judge.on_window(5000, WINDOW_NS, Contest::Others);
        let ways = run(&mut judge, 4 * FIRST_STAY_WINDOWS as usize, |_| 5e4);
        assert!(ways.contains(&Way::Sleep), "{ways:?}");
    }

    #[test]
    fn a_window_much_longer_than_planned_is_measured_again() {
        let mut judge = opened(Contest::Free);
        for _ in 0..FIRST_STAY_WINDOWS {
            judge.on_window(1000, WINDOW_NS, Contest::Others);
        }
        assert!(judge.in_trial());
        let way = judge.way();
        // The crowd dispersed for a second: that window says nothing.
        assert_eq!(judge.on_window(10, 10 * WINDOW_NS, Contest::Others), None);
        assert_eq!(judge.way(), way, "the same trial window again");
        assert_eq!(judge.on_window(0, 0, Contest::Others), None);
        assert_eq!(judge.way(), way);
    }
}
