//! `iopath soak`: random paths, devices and faults round after round, every
//! byte checked, reproducible from a seed.

use super::path_args::duration_arg;
use clap::Args;
use iopath::bench::report::format_count;
use iopath::bench::soak::{SoakConfig, soak};
use std::path::PathBuf;
use std::time::Duration;

const SOAK_HELP: &str = "\
Each round draws, from the seed and its own number, a device (an emulated SSD, or with --dir a file
through psync or uring), a path (any dispatch x completion, sometimes with knobs), 1-12 threads
(half blocking, half queued at depth 1-8), a block size, flushes, and faults for the fault wrapper
to inject (failed segments, refused commands, failed commits and waits, a hung command, latency
spikes shorter and longer than the 40 ms timeout). Every request must complete or report its error,
every block must hold a version it may hold, and no buffer may change while the device owns it.
A finding ends the run with the command that repeats that round alone.

EXAMPLES:
  iopath soak --duration 10s
  iopath soak --seed 42 --duration 10m --dir /tmp     # also files through psync and uring
  iopath soak --seed 42 --round 17                    # repeat one round
";

#[derive(Args, Debug)]
#[command(after_long_help = SOAK_HELP)]
pub struct SoakArgs {
    /// Seed of every round's choices (default: from the clock; printed, so the run can be repeated).
    #[arg(long)]
    seed: Option<u64>,
    /// Start rounds for this long.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    duration: Duration,
    /// Stop after this many rounds instead.
    #[arg(long)]
    rounds: Option<u64>,
    /// Run only this round of the seed (to repeat a finding).
    #[arg(long)]
    round: Option<u64>,
    /// Also run rounds on files (psync, uring) in this directory; they are removed after each round.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print only the summary.
    #[arg(long)]
    quiet: bool,
}

/// Runs `iopath soak`.
pub fn run(args: SoakArgs) -> iopath::Result<()> {
    let seed = args.seed.unwrap_or_else(|| iopath::clock::now_ns() ^ std::process::id() as u64);
    if let Some(dir) = &args.dir
        && !dir.is_dir()
    {
        return Err(iopath::Error::spec("--dir", dir.display().to_string(), "not a directory; give one that exists"));
    }
    eprintln!("iopath soak: seed {seed} (repeat with --seed {seed})");
    let config =
        SoakConfig { seed, duration: args.duration, rounds: args.rounds, only_round: args.round, dir: args.dir };
    let quiet = args.quiet;
    let report = soak(
        &config,
        |round| {
            if !quiet {
                use std::io::Write;
                print!("{}: ", round.describe(seed));
                let _ = std::io::stdout().flush();
            }
        },
        |_, r| {
            if !quiet {
                println!(
                    "{} requests, {} failed as injected, {} flushes, {} faults, 0 lost, 0 ownership violations",
                    r.tally.issued, r.tally.failed, r.tally.flushes, r.faults_injected
                );
            }
        },
    )?;
    let (rss_first, rss_last, rss_max) = report.rss_kib;
    println!(
        "soak: {} rounds in {:.1} s, seed {seed}: {} requests ({} failed as injected, {} flushes), {} blocks \
         verified, {} faults injected, lost 0, ownership violations 0; resident memory {} MiB after the first \
         round, {} MiB at the end, {} MiB at most",
        report.rounds,
        report.elapsed.as_secs_f64(),
        format_count(report.tally.issued as f64),
        report.tally.failed,
        report.tally.flushes,
        format_count(report.tally.verified as f64),
        report.faults_injected,
        rss_first / 1024,
        rss_last / 1024,
        rss_max / 1024,
    );
    Ok(())
}
