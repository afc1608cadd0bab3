//! The path layer: a dispatch strategy combined with a completion policy.
//!
//! [`dispatch`] decides who sends what to the device and when; [`completion`]
//! decides how a waiter learns that its request is done. A [`PathConfig`]
//! names one of each, plus the knobs they share. Named presets reproduce the
//! seeds' designs.

pub(crate) mod channel;
pub mod completion;
pub mod dispatch;
pub mod timing;
pub(crate) mod waiter;

#[cfg(test)]
mod sim_tests;

pub use channel::{Completed, PathStats, SEGMENT_BUCKETS, segment_bucket, segment_bucket_label};
pub use completion::{CompletionKind, CompletionPolicy, WaitStats};
pub use dispatch::DispatchKind;

use crate::error::{Error, Result};
use std::time::Duration;

/// A complete description of an I/O path.
#[derive(Debug, Clone, PartialEq)]
pub struct PathConfig {
    /// Who sends requests to the device.
    pub dispatch: DispatchKind,
    /// How waiters learn of completions.
    pub completion: CompletionKind,
    /// How long a device command may take before the path asks the device
    /// to cancel it ([`crate::device::Queue::cancel`]). The command is still
    /// waited for (the device owns its buffers until it hands it back); its
    /// requests then fail with [`Error::Timeout`] unless it completed after all.
    pub timeout: Duration,
    /// Queue strategies: dispatch when this many requests are queued
    /// (default 32 for `queue`/`twoq`/`hybrid`, 4 for `elevator`).
    pub unplug_thresh: Option<usize>,
    /// Queue strategies: dispatch when the oldest request has waited this long
    /// (default 20 µs for `queue`/`twoq`/`hybrid`, 3 ms for `elevator`).
    pub unplug: Option<Duration>,
    /// Most segments per merged command (default: the device's limit).
    pub max_segments: Option<usize>,
    /// How long a thread waiting for another thread's work spins before it
    /// sleeps (default: 1 ms with `poll`, 0 with `interrupt`).
    pub waiter_spin: Option<Duration>,
    /// `combine`: batches a winner may send after its own request is done
    /// before it hands the role on.
    pub combine_budget: u32,
    /// `combine`: who polls the device while a merged command is in service.
    pub combine_polling: CombinePolling,
    /// Merging strategies: commands kept in the device at once.
    pub pipeline: usize,
    /// `auto` dispatch: when threads blocked at once share one queue.
    pub crowd: CrowdRule,
}

/// When the `auto` dispatch sends blocking requests through the one queue
/// its threads share (see `path/dispatch/auto.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrowdRule {
    /// While more than two threads per CPU block at once and no CPU-bound
    /// thread wants the CPUs.
    Auto,
    /// While two or more threads block at once, whatever else runs.
    Always,
    /// Never: every request goes direct.
    Off,
}

impl CrowdRule {
    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            CrowdRule::Auto => "auto",
            CrowdRule::Always => "always",
            CrowdRule::Off => "off",
        }
    }

    /// Parses a command-line name.
    pub fn parse(text: &str) -> Result<CrowdRule> {
        [CrowdRule::Auto, CrowdRule::Always, CrowdRule::Off]
            .into_iter()
            .find(|r| r.name() == text)
            .ok_or_else(|| Error::spec("crowd rule", text, "expected auto, always or off"))
    }
}

/// Who polls the device for the combining strategy's merged commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CombinePolling {
    /// Every thread that spins waiting for its request takes a turn: whenever
    /// it finds the serving role free it takes one look at the device (and
    /// sends the next batch if due) and lets the role go again. Nobody spins
    /// on the device alone while the others wait for the CPU.
    Shared,
    /// Seed 000's STM: the thread that sent a batch spins until it completes.
    Winner,
}

impl CombinePolling {
    /// Command-line name.
    pub fn name(self) -> &'static str {
        match self {
            CombinePolling::Shared => "shared",
            CombinePolling::Winner => "winner",
        }
    }

    /// Parses a command-line name.
    pub fn parse(text: &str) -> Result<CombinePolling> {
        match text {
            "shared" => Ok(CombinePolling::Shared),
            "winner" => Ok(CombinePolling::Winner),
            _ => Err(Error::spec("combine polling", text, "expected shared or winner")),
        }
    }
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
        name: "scsi-intr",
        dispatch: DispatchKind::Elevator,
        completion: CompletionKind::Interrupt,
        about: "seed 000 baseline (Linux 2.6.32): plugged request queue, spatial merge only, dispatcher thread, \
                interrupt completion",
    },
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
    PathPreset {
        name: "sync-yield",
        dispatch: DispatchKind::Direct,
        completion: CompletionKind::Yield,
        about: "the caller submits and polls for its own completion, yielding the CPU between looks: no wake-up, \
                and a device worker or other threads that share the CPU still run",
    },
    PathPreset {
        name: "auto",
        dispatch: DispatchKind::Auto,
        completion: CompletionKind::Auto,
        about: "the default: the caller submits and waits in whichever way is cheapest now (yield, poll, hybrid or \
                interrupt), measured per thread while the program runs; yields while waiters outnumber the CPUs \
                and sleeps when a CPU-bound thread would keep the CPU; threads blocked at once on a kernel device \
                share one AIO queue and send each other's requests in batches (IOPATH_LOG=1 says why)",
    },
    PathPreset {
        name: "stm",
        dispatch: DispatchKind::Combine,
        completion: CompletionKind::Poll,
        about: "seed 000 STM: a winner merges everyone's pending requests into one command and polls",
    },
    PathPreset {
        name: "atm",
        dispatch: DispatchKind::Queue,
        completion: CompletionKind::Poll,
        about: "seed 000 ATM: plugged queue (unplug at 32 requests or 20 us), dispatcher merges and polls",
    },
    PathPreset {
        name: "htm",
        dispatch: DispatchKind::Hybrid,
        completion: CompletionKind::Poll,
        about: "seed 000 HTM: blocking requests take STM, queued ones take ATM",
    },
    PathPreset {
        name: "2q",
        dispatch: DispatchKind::TwoQ,
        completion: CompletionKind::Poll,
        about: "seed 000 2Q: ATM with a swapped (shadow) queue and immediate dispatch when the device is idle",
    },
];

/// Default request timeout on timed devices.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default batches a combining winner may send after its own request is done.
pub const DEFAULT_COMBINE_BUDGET: u32 = 64;
/// Default commands a merging strategy keeps in the device.
pub const DEFAULT_PIPELINE: usize = 2;
/// Default waiter spin with `poll` completion.
pub const DEFAULT_POLL_WAITER_SPIN: Duration = Duration::from_millis(1);

impl PathConfig {
    /// The configuration of a preset.
    pub fn preset(name: &str) -> Result<PathConfig> {
        let p = PRESETS.iter().find(|p| p.name == name).ok_or_else(|| {
            let names: Vec<_> = PRESETS.iter().map(|p| p.name).collect();
            Error::spec("path preset", name, format!("known presets: {}", names.join(", ")))
        })?;
        Ok(PathConfig::new(p.dispatch, p.completion))
    }

    /// A path with default knobs.
    pub fn new(dispatch: DispatchKind, completion: CompletionKind) -> PathConfig {
        PathConfig {
            dispatch,
            completion,
            timeout: DEFAULT_TIMEOUT,
            unplug_thresh: None,
            unplug: None,
            max_segments: None,
            waiter_spin: None,
            combine_budget: DEFAULT_COMBINE_BUDGET,
            combine_polling: CombinePolling::Shared,
            pipeline: DEFAULT_PIPELINE,
            crowd: CrowdRule::Auto,
        }
    }

    /// `dispatch+completion`, e.g. `direct+poll`.
    pub fn label(&self) -> String {
        format!("{}+{}", self.dispatch.name(), self.completion.name())
    }

    /// The waiter spin in effect.
    pub fn waiter_spin_ns(&self) -> u64 {
        let default = match self.completion {
            CompletionKind::Poll
            | CompletionKind::Yield
            | CompletionKind::Hybrid
            | CompletionKind::Adaptive
            | CompletionKind::Auto => DEFAULT_POLL_WAITER_SPIN,
            CompletionKind::Interrupt => Duration::ZERO,
        };
        self.waiter_spin.unwrap_or(default).as_nanos() as u64
    }

    /// The name of the preset this configuration matches exactly, if any.
    pub fn preset_name(&self) -> Option<&'static str> {
        PRESETS.iter().find(|p| p.dispatch == self.dispatch && p.completion == self.completion).map(|p| p.name)
    }
}

/// Knobs a path name may set after `@`, as `--help` names them.
pub const PATH_KNOBS: &str =
    "combine-polling, combine-budget, pipeline, waiter-spin, unplug-thresh, unplug-us, max-segments, crowd";

/// A path as written on the command line: a preset (`stm`), a
/// `DISPATCH+COMPLETION` pair (`combine+hybrid`) or `PRESET+COMPLETION`
/// (`stm+interrupt`), each optionally followed by `@knob=value` settings
/// (`stm@combine-polling=winner@pipeline=1`).
#[derive(Debug, Clone, PartialEq)]
pub struct PathSpec {
    /// The path the name gives, with default knobs.
    pub base: PathConfig,
    /// The text after the first `@`, if any (`combine-polling=winner@pipeline=1`).
    pub settings: Option<String>,
}

impl PathSpec {
    /// Parses a path name; the `@` settings are checked here, applied by
    /// [`PathSpec::apply_knobs`].
    pub fn parse(text: &str) -> Result<PathSpec> {
        let (name, settings) = match text.split_once('@') {
            Some((base, settings)) => (base, Some(settings.to_string())),
            None => (text, None),
        };
        let base = match name.split_once('+') {
            // DISPATCH+COMPLETION, or PRESET+COMPLETION (a preset's dispatch with another completion).
            Some((d, c)) => {
                let dispatch = match PathConfig::preset(d) {
                    Ok(preset) => preset.dispatch,
                    Err(_) => DispatchKind::parse(d)?,
                };
                PathConfig::new(dispatch, CompletionKind::parse(c)?)
            }
            None => PathConfig::preset(name)?,
        };
        let spec = PathSpec { base, settings };
        spec.apply_knobs(&mut spec.base.clone())?;
        Ok(spec)
    }

    /// The path this spec names: its base with its `@` settings applied.
    pub fn config(&self) -> Result<PathConfig> {
        let mut path = self.base.clone();
        self.apply_knobs(&mut path)?;
        Ok(path)
    }

    /// Applies the `@knob=value` settings to `path`.
    pub fn apply_knobs(&self, path: &mut PathConfig) -> Result<()> {
        for setting in self.settings.iter().flat_map(|s| s.split('@')) {
            apply_knob(path, setting)?;
        }
        Ok(())
    }

    /// The name to show for `path` (this spec with whatever overrides were
    /// applied): the preset it matches, or `dispatch+completion`, followed
    /// by the `@` settings.
    pub fn shown_name(&self, path: &PathConfig) -> String {
        let base = match path.preset_name() {
            Some(preset) => preset.to_string(),
            None => path.label(),
        };
        match &self.settings {
            Some(settings) => format!("{base}@{settings}"),
            None => base,
        }
    }
}

/// Applies one `knob=value` from a path name (`stm@combine-polling=winner`).
fn apply_knob(path: &mut PathConfig, setting: &str) -> Result<()> {
    let Some((knob, value)) = setting.split_once('=') else {
        return Err(Error::spec("path knob", setting, format!("expected knob=value; knobs: {PATH_KNOBS}")));
    };
    let number = |what: &str| {
        value.parse::<usize>().map_err(|_| Error::spec("path knob value", setting, format!("expected {what}")))
    };
    match knob {
        "combine-polling" => path.combine_polling = CombinePolling::parse(value)?,
        "combine-budget" => {
            path.combine_budget = value.parse().map_err(|_| {
                Error::spec("path knob value", setting, "expected a number of batches (at most 4294967295)")
            })?
        }
        "pipeline" => path.pipeline = number("a number of commands")?,
        "unplug-thresh" => path.unplug_thresh = Some(number("a number of requests")?),
        "max-segments" => path.max_segments = Some(number("a number of segments")?),
        "waiter-spin" => path.waiter_spin = Some(crate::units::parse_duration_default_unit(value, 1e3)?),
        "unplug-us" => path.unplug = Some(crate::units::parse_duration_default_unit(value, 1e3)?),
        "crowd" => path.crowd = CrowdRule::parse(value)?,
        _ => return Err(Error::spec("path knob", knob, format!("knobs a path name can set: {PATH_KNOBS}"))),
    }
    Ok(())
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
        assert_eq!(PathConfig::preset("stm").unwrap().label(), "combine+poll");
        assert_eq!(PathConfig::preset("scsi-intr").unwrap().label(), "elevator+interrupt");
        let e = PathConfig::preset("warp-drive").unwrap_err().to_string();
        assert!(e.contains("sync-path") && e.contains("2q"), "{e}");
    }

    #[test]
    fn every_preset_has_a_unique_name_and_label() {
        for (i, a) in PRESETS.iter().enumerate() {
            for b in &PRESETS[i + 1..] {
                assert_ne!(a.name, b.name);
                assert!(a.dispatch != b.dispatch || a.completion != b.completion, "{} = {}", a.name, b.name);
            }
        }
    }
}
