//! Dispatch strategies: who sends requests to the device, and when.
//!
//! One file per strategy (crate-internal: [`DispatchKind`] names them):
//! `direct` (the caller sends its own request, no hand-off),
//! `combine` (STM: one winner merges everyone's pending requests),
//! `queue` (ATM / 2Q / the disk-era elevator: a plugged queue and a dispatcher thread),
//! `hybrid` (HTM: blocking requests combine, queued ones go to the queue),
//! `auto` (the default: direct, or, for a crowd of blocked threads on a
//! kernel device, `gather`: one AIO context they all send and reap through).
//! `serve` is the merging core they share.

pub(crate) mod auto;
pub(crate) mod combine;
pub(crate) mod direct;
pub(crate) mod gather;
pub(crate) mod hybrid;
pub(crate) mod queue;
pub(crate) mod serve;

use super::PathConfig;
use super::channel::{Channel, Completed};
use super::completion::CompletionKind;
use crate::clock::ThreadUsage;
use crate::device::{Device, Op};
use crate::error::{Error, Result};
use crate::path::PathStats;
use std::sync::Arc;

/// One request as the engine hands it to a dispatch strategy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    /// Direction.
    pub op: Op,
    /// Device offset in bytes.
    pub offset: u64,
    /// Host buffer.
    pub buf: *mut u8,
    /// Length in bytes.
    pub len: u32,
    /// Caller's tag (queued API) or [`BLOCKING_TAG`].
    pub tag: u64,
    /// When a write is durable ([`crate::device::Durability`]); one that is not
    /// `Cached` is never merged with others.
    pub durability: crate::device::Durability,
}

/// ATM's unplug threshold (seed 000 §4.5: raised from Linux's 4 to 32).
pub const ATM_THRESH: usize = 32;
/// ATM's unplug timer. The seed used 1 ms, its kernel's smallest timer, and
/// asked for a finer one; user space can wait microseconds.
pub const ATM_UNPLUG_NS: u64 = 20_000;
/// Linux 2.6.32's unplug threshold (seed 000 Table 2).
pub const ELEVATOR_THRESH: usize = 4;
/// Linux 2.6.32's unplug timer, 3 ms (seed 000 Table 2).
pub const ELEVATOR_UNPLUG_NS: u64 = 3_000_000;

/// Tag of the one blocking request a channel can have outstanding.
pub(crate) const BLOCKING_TAG: u64 = u64::MAX;

/// Who sends requests to the device and when.
pub(crate) trait Dispatch: Send + Sync {
    /// Carries out one blocking request and returns when it is complete; the
    /// result's `device_ns` is the device time the request saw.
    ///
    /// # Safety
    ///
    /// `request.buf` must be valid for `request.len` bytes (writable for reads)
    /// until this returns.
    unsafe fn blocking(&self, channel: &mut Channel, request: Request) -> Result<Completed>;

    /// Queues a request for the asynchronous API.
    ///
    /// # Safety
    ///
    /// `request.buf` must stay valid and untouched until the request is reaped.
    unsafe fn submit(&self, channel: &mut Channel, request: Request) -> Result<()>;

    /// Sends queued requests to the device.
    fn commit(&self, channel: &mut Channel) -> Result<()>;

    /// Waits until at least `min` queued requests have completed, moving them to `out`.
    fn reap(&self, channel: &mut Channel, min: usize, out: &mut Vec<Completed>) -> Result<usize>;

    /// Counters of the strategy's own threads (a dispatcher), if any.
    fn background_stats(&self) -> PathStats {
        PathStats::default()
    }

    /// CPU time and context switches of the strategy's own threads, if any.
    fn background_usage(&self) -> ThreadUsage {
        ThreadUsage::default()
    }
}

/// The dispatch strategies iopath knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DispatchKind {
    /// The caller sends its own request (no hand-off).
    Direct,
    /// Synchronous temporal merge (STM).
    Combine,
    /// Asynchronous temporal merge (ATM): plugged queue + dispatcher.
    Queue,
    /// Hybrid temporal merge (HTM): blocking -> combine, queued -> queue.
    Hybrid,
    /// Double buffering (2Q): queue swapped in one exchange, dispatch at once when idle.
    TwoQ,
    /// The disk-era request queue: plugging, spatial merge only, reads unplug at once.
    Elevator,
    /// The default: direct, or, while several threads block at once on a
    /// kernel device, one AIO context they all share (see `auto.rs`).
    Auto,
}

impl DispatchKind {
    /// All kinds.
    pub const ALL: [DispatchKind; 7] = [
        DispatchKind::Auto,
        DispatchKind::Direct,
        DispatchKind::Combine,
        DispatchKind::Queue,
        DispatchKind::Hybrid,
        DispatchKind::TwoQ,
        DispatchKind::Elevator,
    ];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            DispatchKind::Direct => "direct",
            DispatchKind::Combine => "combine",
            DispatchKind::Queue => "queue",
            DispatchKind::Hybrid => "hybrid",
            DispatchKind::TwoQ => "twoq",
            DispatchKind::Elevator => "elevator",
            DispatchKind::Auto => "auto",
        }
    }

    /// Parses a command-line name.
    pub fn parse(text: &str) -> Result<DispatchKind> {
        Self::ALL.into_iter().find(|k| k.name() == text).ok_or_else(|| {
            Error::spec(
                "dispatch strategy",
                text,
                "expected one of: auto, direct, combine, queue, hybrid, twoq, elevator",
            )
        })
    }

    /// Builds the strategy for `device`; strategies with a dispatcher start it here.
    pub(crate) fn build(
        self,
        device: &Arc<dyn Device>,
        completion: CompletionKind,
        path: &PathConfig,
        timeout_ns: u64,
    ) -> Result<Box<dyn Dispatch>> {
        let max_segments = path.max_segments.unwrap_or(usize::MAX).min(device.capabilities().max_segments).max(1);
        let combine = || {
            combine::Combine::new(
                combine::CombineConfig {
                    budget: path.combine_budget,
                    pipeline: path.pipeline,
                    max_segments,
                    rove: path.combine_polling == super::CombinePolling::Shared,
                },
                device,
                completion,
                timeout_ns,
            )
        };
        let queue = |name, idle_dispatch, urgent_unplug, merge, default_thresh: usize, default_unplug_ns: u64| {
            let thresh = path.unplug_thresh.unwrap_or(default_thresh);
            let unplug_ns = path.unplug.map_or(default_unplug_ns, |d| d.as_nanos() as u64);
            queue::QueueDispatch::start(
                name,
                Arc::clone(device),
                completion,
                queue::QueueConfig {
                    unplug_thresh: thresh.max(1),
                    unplug_ns,
                    idle_dispatch,
                    urgent_unplug,
                    merge,
                    pipeline: path.pipeline,
                    max_segments,
                },
                timeout_ns,
            )
        };
        use serve::MergeMode::{Spatial, Temporal};
        Ok(match self {
            DispatchKind::Direct => Box::new(direct::Direct),
            DispatchKind::Auto => Box::new(auto::Auto::new(device, path.crowd)),
            DispatchKind::Combine => Box::new(combine()?),
            DispatchKind::Queue => Box::new(queue("queue", false, false, Temporal, ATM_THRESH, ATM_UNPLUG_NS)?),
            DispatchKind::TwoQ => Box::new(queue("twoq", true, false, Temporal, ATM_THRESH, ATM_UNPLUG_NS)?),
            DispatchKind::Hybrid => Box::new(hybrid::Hybrid::new(
                combine()?,
                queue("queue", false, false, Temporal, ATM_THRESH, ATM_UNPLUG_NS)?,
            )),
            DispatchKind::Elevator => {
                Box::new(queue("elevator", false, true, Spatial, ELEVATOR_THRESH, ELEVATOR_UNPLUG_NS)?)
            }
        })
    }
}
