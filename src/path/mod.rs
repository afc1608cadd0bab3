//! The path layer: a dispatch strategy combined with a completion policy.
//!
//! [`dispatch`] decides who sends what to the device and when; [`completion`]
//! decides how a waiter learns that its request is done. A [`PathConfig`]
//! names one of each, plus the knobs they share. Named presets reproduce the
//! seeds' designs.

pub mod channel;
pub mod completion;
pub mod dispatch;

pub use channel::{Channel, PathStats};
pub use completion::{CompletionKind, CompletionPolicy, WaitStats};
pub use dispatch::{Dispatch, DispatchKind};

use crate::error::{Error, Result};
use std::time::Duration;

/// A complete description of an I/O path.
#[derive(Debug, Clone, PartialEq)]
pub struct PathConfig {
    /// Who sends requests to the device.
    pub dispatch: DispatchKind,
    /// How waiters learn of completions.
    pub completion: CompletionKind,
    /// How long a request on a timed (emulated) device may take before it is
    /// reported as timed out. Real devices are waited for without limit: the
    /// kernel owns the buffer until it answers.
    pub timeout: Duration,
}

/// A named path preset.
#[derive(Debug, Clone, Copy)]
pub struct PathPreset {
    /// Name used with `--path`.
    pub name: &'static str,
    /// Dispatch strategy.
    pub dispatch: DispatchKind,
    /// Completion policy.
    pub completion: CompletionKind,
    /// What it reproduces.
    pub about: &'static str,
}

/// The presets iopath knows.
pub const PRESETS: &[PathPreset] = &[
    PathPreset {
        name: "sync-path",
        dispatch: DispatchKind::Direct,
        completion: CompletionKind::Poll,
        about: "seed 000 SyncPath: the caller submits and spins for its own completion; zero context switches",
    },
    PathPreset {
        name: "sync-intr",
        dispatch: DispatchKind::Direct,
        completion: CompletionKind::Interrupt,
        about: "the caller submits and sleeps until the completion wakes it (one wake-up per I/O)",
    },
];

/// Default request timeout on timed devices.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

impl PathConfig {
    /// The configuration of a preset.
    pub fn preset(name: &str) -> Result<PathConfig> {
        let p = PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
            let names: Vec<_> = PRESETS.iter().map(|p| p.name).collect();
            Error::spec("path preset", name, format!("known presets: {}", names.join(", ")))
        })?;
        Ok(PathConfig { dispatch: p.dispatch, completion: p.completion, timeout: DEFAULT_TIMEOUT })
    }

    /// `dispatch+completion`, e.g. `direct+poll`.
    pub fn label(&self) -> String {
        format!("{}+{}", self.dispatch.name(), self.completion.name())
    }
}

impl Default for PathConfig {
    fn default() -> Self {
        PathConfig::preset("sync-path").expect("sync-path preset exists")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_resolve_and_unknown_ones_are_listed() {
        let p = PathConfig::preset("sync-path").unwrap();
        assert_eq!(p.label(), "direct+poll");
        let e = PathConfig::preset("warp-drive").unwrap_err().to_string();
        assert!(e.contains("sync-path"), "{e}");
    }
}
