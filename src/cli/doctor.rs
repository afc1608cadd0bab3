//! `iopath doctor`: what this machine and a device support, and which path to use.

use super::bench::OutputFormat;
use super::path_args::{IdleArgs, duration_arg};
use clap::Args;
use iopath::doctor::{DoctorConfig, examine};
use std::time::Duration;

const DOCTOR_HELP: &str = "\
Reports the kernel, whether io_uring is usable (the io_uring_disabled sysctl, seccomp) and which setup
flags it accepts, the memlock limit for registered buffers, the CPUs and how contended they are
(PSI), and measures what waiting costs here: a system call, a wake-up of a sleeping thread on another
CPU, a timer sleep's overshoot, an io_uring no-op; how idle CPUs wait (cpuidle driver and states, a
VM's halt polling, the PM QoS CPU latency limit) and what a wake-up costs while they poll instead
(--idle-poll runs the trials that way too). Given a device (a spec, or a bare path taken as
uring:PATH) it also reads its queue from sysfs (logical block size and O_DIRECT alignment, poll queues
and why kernel polling is or is not available, scheduler, nomerges, queue depth) and runs short
read-only trials of the paths that can win at 1 and 16 threads, then recommends one and says why
(where idle CPUs halt and polling would make wake-ups much cheaper, each pick is tried once more
while they poll, to show what --idle-poll would give).
It never writes to the device.

EXAMPLES:
  iopath doctor
  iopath doctor /dev/nvme0n1
  iopath doctor uring:/dev/loop0 --threads 1,4,16,32
  iopath doctor emu:nand --output-format json
";

#[derive(Args, Debug)]
#[command(after_long_help = DOCTOR_HELP)]
pub struct DoctorArgs {
    /// A device spec or a path (uring:/dev/nvme0n1, /dev/loop0, emu:nand); omit for the machine only.
    device: Option<String>,
    /// Blocking thread counts to try and recommend for.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    threads: Vec<usize>,
    /// How long each trial runs.
    #[arg(long, default_value = "1s", value_parser = duration_arg)]
    trial_time: Duration,
    /// Do not run trials (facts and machine costs only).
    #[arg(long)]
    no_trials: bool,
    #[command(flatten)]
    idle: IdleArgs,
    /// table or json.
    #[arg(long, value_enum, default_value = "table")]
    output_format: OutputFormat,
}

/// Runs `iopath doctor`.
pub fn run(args: DoctorArgs) -> iopath::Result<()> {
    if args.threads.contains(&0) {
        return Err(iopath::Error::spec("--threads", "0", "thread counts start at 1"));
    }
    let config = DoctorConfig {
        device: args.device,
        measure: !args.no_trials,
        trial_time: args.trial_time,
        threads: args.threads,
        idle_poll: args.idle.idle_poll,
    };
    let table = matches!(args.output_format, OutputFormat::Table);
    let report = examine(&config, |t| {
        if table {
            eprintln!("  trial: {} thread(s), {}: {:.0} IOPS", t.threads, t.path, t.iops);
        }
    })?;
    match args.output_format {
        OutputFormat::Table => print!("{}", report.to_text()),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report.to_json()).expect("JSON")),
    }
    Ok(())
}
