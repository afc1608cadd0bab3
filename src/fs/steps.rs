//! Time spent in each step of the file layer's read and fsync paths (the
//! breakdown seed 002 draws), summed over all threads. Off unless asked for:
//! each step costs a clock read.

use crate::clock::now_ns;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// One step: total nanoseconds and how many times it ran.
#[derive(Debug, Default)]
pub struct Step {
    ns: AtomicU64,
    count: AtomicU64,
}

impl Step {
    fn add(&self, ns: u64) {
        self.ns.fetch_add(ns, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    /// (total ns, times).
    pub fn get(&self) -> (u64, u64) {
        (self.ns.load(Relaxed), self.count.load(Relaxed))
    }
}

/// The steps of a read miss and of an fsync.
#[derive(Debug, Default)]
pub struct Steps {
    enabled: bool,
    /// Looking the pages up in the cache index.
    pub lookup: Step,
    /// Getting page frames (allocation, or the preallocated pool).
    pub alloc: Step,
    /// Inserting pages into the index (and evicting to make room).
    pub insert: Step,
    /// Mapping file blocks to device blocks and queueing the commands.
    pub submit: Step,
    /// Waiting for the device.
    pub device: Step,
    /// Copying to the caller.
    pub copy: Step,
    /// fsync: writing the data (with the journal blocks, on the aios path).
    pub fsync_data: Step,
    /// fsync: writing the journal blocks (conventional path only).
    pub fsync_journal: Step,
    /// fsync: the flush that orders the commit block after everything else.
    pub fsync_flush: Step,
    /// fsync: writing the commit block and making it durable.
    pub fsync_commit: Step,
}

impl Steps {
    /// Counters that record only if `enabled`.
    pub fn new(enabled: bool) -> Steps {
        Steps { enabled, ..Steps::default() }
    }

    /// A start time, if recording.
    pub fn start(&self) -> Option<u64> {
        self.enabled.then(now_ns)
    }

    /// Adds the time since `t` to the step `pick` chooses; returns now (the next step's start).
    pub fn lap(&self, t: Option<u64>, pick: impl Fn(&Steps) -> &Step) -> Option<u64> {
        let t = t?;
        let now = now_ns();
        pick(self).add(now.saturating_sub(t));
        Some(now)
    }

    /// Whether steps are being recorded.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Every step as (name, total ns, times).
    pub fn all(&self) -> Vec<(&'static str, u64, u64)> {
        [
            ("lookup", &self.lookup),
            ("alloc", &self.alloc),
            ("insert", &self.insert),
            ("submit", &self.submit),
            ("device", &self.device),
            ("copy", &self.copy),
            ("fsync_data", &self.fsync_data),
            ("fsync_journal", &self.fsync_journal),
            ("fsync_flush", &self.fsync_flush),
            ("fsync_commit", &self.fsync_commit),
        ]
        .into_iter()
        .map(|(name, s)| {
            let (ns, n) = s.get();
            (name, ns, n)
        })
        .collect()
    }
}
