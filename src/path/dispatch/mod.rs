//! Dispatch strategies: who sends requests to the device, and when.
//!
//! One file per strategy. [`direct`]: the caller sends its own request and
//! waits for it through the completion policy; nothing is handed to another
//! thread.

pub mod direct;

use super::channel::{Channel, Completed};
use crate::device::Op;
use crate::error::{Error, Result};

/// One request as the engine hands it to a dispatch strategy.
#[derive(Debug, Clone, Copy)]
pub struct Request {
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
}

/// Tag of the one blocking request a channel can have outstanding.
pub const BLOCKING_TAG: u64 = u64::MAX;

/// Who sends requests to the device and when.
pub trait Dispatch: Send + Sync {
    /// Name used on the command line and in reports.
    fn name(&self) -> &'static str;

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
}

/// The dispatch strategies iopath knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DispatchKind {
    /// The caller sends its own request (no hand-off).
    Direct,
}

impl DispatchKind {
    /// All kinds.
    pub const ALL: [DispatchKind; 1] = [DispatchKind::Direct];

    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            DispatchKind::Direct => "direct",
        }
    }

    /// Parses a command-line name.
    pub fn parse(text: &str) -> Result<DispatchKind> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == text)
            .ok_or_else(|| Error::spec("dispatch strategy", text, "expected one of: direct"))
    }

    /// Builds the strategy.
    pub fn build(self) -> Box<dyn Dispatch> {
        match self {
            DispatchKind::Direct => Box::new(direct::Direct),
        }
    }
}
