//! Flags that choose and tune an I/O path, shared by `bench` and `compare`.

use clap::Args;
use iopath::path::{CombinePolling, CompletionKind, DispatchKind, PathConfig, PathSpec};
use iopath::units::{parse_duration, parse_duration_default_unit};
use std::time::Duration;

pub fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).map_err(|e| e.to_string())
}

fn combine_polling_arg(s: &str) -> Result<CombinePolling, String> {
    CombinePolling::parse(s).map_err(|e| e.to_string())
}

fn micros_arg(s: &str) -> Result<Duration, String> {
    parse_duration_default_unit(s, 1e3).map_err(|e| e.to_string())
}

/// Knobs of the merging paths.
#[derive(Args, Debug, Clone)]
pub struct PathKnobs {
    /// queue/twoq/hybrid/elevator: dispatch when this many requests are queued
    /// [default: 32 (seed 000's ATM); 4 for elevator (Linux 2.6.32)].
    #[arg(long, help_heading = "Path knobs")]
    pub unplug_thresh: Option<usize>,
    /// queue/twoq/hybrid/elevator: dispatch when the oldest request has waited this long;
    /// a bare number is microseconds [default: 20us; 3ms for elevator].
    #[arg(long, value_parser = micros_arg, help_heading = "Path knobs")]
    pub unplug_us: Option<Duration>,
    /// Most requests merged into one device command [default: the device's limit, 1024 on emu].
    #[arg(long, help_heading = "Path knobs")]
    pub max_segments: Option<usize>,
    /// How long a thread waiting for another thread's work spins before sleeping;
    /// a bare number is microseconds [default: 1ms with poll, 0 with interrupt].
    #[arg(long, value_parser = micros_arg, help_heading = "Path knobs")]
    pub waiter_spin: Option<Duration>,
    /// combine/hybrid: batches a winner may still send after its own request is
    /// done before it hands the role to a waiting thread.
    #[arg(long, default_value_t = iopath::path::DEFAULT_COMBINE_BUDGET, help_heading = "Path knobs")]
    pub combine_budget: u32,
    /// combine/hybrid: who polls the device while a merged command is in service:
    /// `shared` (every spinning waiter takes one look whenever it gets the CPU, so
    /// nobody spins alone while the others wait for a CPU) or `winner` (seed 000's STM:
    /// the thread that sent the batch spins until it completes).
    #[arg(long, default_value = "shared", value_parser = combine_polling_arg, help_heading = "Path knobs")]
    pub combine_polling: CombinePolling,
    /// Merging paths: merged commands kept in the device at once (2 = the next
    /// batch is sent while the current one is in service).
    #[arg(long, default_value_t = iopath::path::DEFAULT_PIPELINE, help_heading = "Path knobs")]
    pub pipeline: usize,
    /// How long a device command may take before the device is asked to cancel it
    /// (io_uring: IORING_OP_ASYNC_CANCEL); it is still waited for, and its requests
    /// then fail with a timeout error unless it completed after all.
    #[arg(long, default_value = "30s", value_parser = duration_arg, help_heading = "Path knobs")]
    pub timeout: Duration,
}

impl PathKnobs {
    /// Applies the knobs to a path.
    pub fn apply(&self, path: &mut PathConfig) {
        path.unplug_thresh = self.unplug_thresh;
        path.unplug = self.unplug_us;
        path.max_segments = self.max_segments;
        path.waiter_spin = self.waiter_spin;
        path.combine_budget = self.combine_budget;
        path.combine_polling = self.combine_polling;
        path.pipeline = self.pipeline;
        path.timeout = self.timeout;
    }
}

/// Resolves a path from a preset name (or `dispatch+completion`), each
/// optionally followed by `@knob=value` settings (`stm@combine-polling=winner`,
/// so `compare` can put two settings of one design side by side), and
/// optional overrides; returns it with the name to show. The knobs of the
/// name win over the flags.
pub fn resolve_path(
    name: &str,
    dispatch: Option<&str>,
    completion: Option<&str>,
    knobs: &PathKnobs,
) -> iopath::Result<(PathConfig, String)> {
    let spec = PathSpec::parse(name)?;
    let mut path = spec.base.clone();
    if let Some(d) = dispatch {
        path.dispatch = DispatchKind::parse(d)?;
    }
    if let Some(c) = completion {
        path.completion = CompletionKind::parse(c)?;
    }
    knobs.apply(&mut path);
    spec.apply_knobs(&mut path)?;
    let shown = spec.shown_name(&path);
    Ok((path, shown))
}

/// The presets section of `--help`.
pub fn presets_help() -> String {
    let mut text = String::from("PATHS (--path PRESET, DISPATCH+COMPLETION or PRESET+COMPLETION):\n");
    for p in iopath::path::PRESETS {
        text.push_str(&format!("  {:<10} {}+{}: {}\n", p.name, p.dispatch.name(), p.completion.name(), p.about));
    }
    text.push_str(
        "  dispatch: auto, direct, combine, queue, hybrid, twoq, elevator; completion: poll, interrupt,\n  \
         yield (spin, handing the CPU to any runnable thread between looks), hybrid (sleep a learned\n  \
         share, then spin), adaptive (switch among poll, hybrid and interrupt from measured costs and\n  \
         CPU contention, and yield while more threads wait than there are CPUs;\n  \
         IOPATH_TRACE_ADAPTIVE=1 prints each decision to stderr).\n  \
         --dispatch and --completion override either half of a preset.\n  \
         PATH@knob=value[@knob=value] sets knobs for that path alone, so compare can run two settings\n  \
         side by side: --paths stm,stm@combine-polling=winner. Knobs: combine-polling, combine-budget,\n  \
         pipeline, waiter-spin, unplug-thresh, unplug-us, max-segments (as the flags below), and\n  \
         crowd=auto|always|off: when the auto dispatch lets threads blocked at once share one AIO queue\n  \
         on a kernel device (auto: unless CPU-bound threads want the CPUs; off: never, every request\n  \
         goes direct): --paths auto,auto@crowd=off.\n",
    );
    text
}

/// How idle CPUs wait during a run (shared by `bench`, `compare`, `fsbench`, `doctor` and `reproduce`).
#[derive(Args, Debug, Clone)]
pub struct IdleArgs {
    /// While the run lasts, ask that idle CPUs poll instead of halting (a PM QoS CPU
    /// latency limit of 0 us through /dev/cpu_dma_latency, as cyclictest does; root only).
    /// A wake-up of a thread on an idle CPU then costs ~2 us instead of what leaving a
    /// deep idle state costs (10-40 us in these VMs: `iopath doctor` measures both), for
    /// every request that sleeps or needs a kernel worker; the price is idle CPUs
    /// spinning (power; host CPU time in a VM). The request ends with the run.
    #[arg(long, help_heading = "CPU")]
    pub idle_poll: bool,
}

impl IdleArgs {
    /// Holds the request if asked, for as long as the returned value lives.
    pub fn hold(&self) -> iopath::Result<Option<iopath::idle::IdlePolling>> {
        self.idle_poll.then(iopath::idle::IdlePolling::request).transpose()
    }
}
