//! `iopath reproduce` (run the seeds' experiments, write the report) and
//! `iopath report` (redraw a report from its saved results).

use clap::Args;
use iopath::reproduce::{EXPERIMENTS, Report, ReproduceConfig, reproduce};
use std::io::IsTerminal;
use std::path::PathBuf;

const REPRODUCE_HELP: &str = "\
Runs the experiments of the research iopath implements on the emulated devices, puts each paper's
figures beside iopath's, decides by a stated rule whether each finding holds on this machine, and
writes DIR/REPORT.md, DIR/report.html (self-contained, charts inline), one SVG chart per experiment
and DIR/results.json (what `iopath report DIR` redraws from).

EXPERIMENTS (all by default, in this order):
  latency      software latency of one 4 KiB read per design (seed 000, Table 6)
  peak         share of the device's peak per design and pattern at 32 threads (seed 003), and
               throughput against the baseline at 1 and 32 threads (seed 000, Table 7)
  threads      throughput and CPU per I/O from 1 to 64 threads (seed 000, Table 7; seed 001)
  sensitivity  STM against SyncPath as the device slows; the break-even point (seed 000, 6.6)
  cpu          user, system and idle CPU per design at 32 threads (seed 000, 6.7)
  contention   poll, yield, interrupt, hybrid, adaptive under 0-2 CPU hogs (seed 001)
  merge        requests per merged command by design and threads (seed 000, 6.8)
  aios         the file layer's read miss and append+fsync, conventional against AIOS (seed 002)
  real         the designs and the kernel's pread on a loop device (root; skipped otherwise)
  apps         RocksDB, varmail-like, OLTP insert on iopath's file system against ext4 (seed 002;
               root, mkfs.ext4; each program skipped where missing: db_bench, python3)

EXAMPLES:
  iopath reproduce --quick                 # everything, short runs (under a minute on 2 vCPUs)
  sudo iopath reproduce real               # the designs on a loop device (needs root)
  sudo iopath reproduce apps               # programs on iopath files against ext4 (needs root)
  iopath reproduce latency peak --out r    # two experiments, 1 s runs
  sudo iopath reproduce --quick --idle-poll  # with idle CPUs polling (cheap wake-ups)
  iopath report r                          # redraw r/REPORT.md and r/report.html from r/results.json
";

/// Arguments of `iopath reproduce`.
#[derive(Args, Debug)]
#[command(after_long_help = REPRODUCE_HELP)]
pub struct ReproduceArgs {
    /// Experiments to run (latency, peak, threads, sensitivity, cpu, contention, merge, aios, real, apps); all if none.
    experiments: Vec<String>,
    /// Short runs (200 ms each, fewer points; 1 s on a real device): the whole set in under a minute.
    #[arg(long)]
    quick: bool,
    /// Directory for REPORT.md, report.html, the charts and results.json.
    #[arg(long, default_value = "iopath-report")]
    out: PathBuf,
    /// No progress bars.
    #[arg(long)]
    no_progress: bool,
    #[command(flatten)]
    idle: super::path_args::IdleArgs,
}

/// Arguments of `iopath report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A directory written by `iopath reproduce --out DIR`.
    dir: PathBuf,
}

/// Runs `iopath reproduce`.
pub fn run(args: ReproduceArgs) -> iopath::Result<()> {
    for e in &args.experiments {
        if !EXPERIMENTS.contains(&e.as_str()) {
            return Err(iopath::Error::spec(
                "experiment",
                e.clone(),
                format!("known experiments: {} (see iopath reproduce --help)", EXPERIMENTS.join(", ")),
            ));
        }
    }
    // Checked before any run: a report that cannot be written is found out now.
    std::fs::create_dir_all(&args.out).map_err(|source| iopath::Error::Target {
        action: "create the report directory",
        path: args.out.clone(),
        source,
    })?;
    let show = !args.no_progress && std::io::stderr().is_terminal();
    let config = ReproduceConfig { experiments: args.experiments, quick: args.quick };
    // Held until the report is made: its machine line says whether idle CPUs polled.
    let idle_request = args.idle.hold()?;
    let bar = std::cell::RefCell::new(None::<indicatif::ProgressBar>);
    let style = indicatif::ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} runs, {eta} left")
        .expect("a valid template")
        .progress_chars("=> ");
    let report = reproduce(
        &config,
        |key| {
            if show {
                let b = indicatif::ProgressBar::new(1).with_style(style.clone()).with_prefix(key.to_string());
                *bar.borrow_mut() = Some(b);
            } else {
                eprintln!("iopath reproduce: {key} ...");
            }
        },
        &mut |done, planned| {
            if let Some(b) = bar.borrow().as_ref() {
                b.set_length(planned);
                b.set_position(done);
            }
        },
        |section| {
            if let Some(b) = bar.borrow_mut().take() {
                b.finish_and_clear();
            }
            let held = section.findings.iter().filter(|f| f.holds).count();
            eprintln!("{:>12}: {held} of {} findings hold", section.key, section.findings.len());
        },
    )?;
    drop(idle_request);
    report.save(&args.out)?;
    let (held, total) =
        report.sections.iter().flat_map(|s| &s.findings).fold((0, 0), |(h, t), f| (h + usize::from(f.holds), t + 1));
    println!(
        "{held} of {total} findings hold. Report: {} and {} (charts: {}/*.svg; data: {})",
        args.out.join("REPORT.md").display(),
        args.out.join("report.html").display(),
        args.out.display(),
        args.out.join("results.json").display()
    );
    let failed = iopath::reproduce::render::failed(&report);
    if !failed.is_empty() {
        println!("Did not hold here ({}):", failed.len());
        for (section, f) in failed {
            println!("  {}: {}", section.key, f.claim);
            println!("    paper {}; iopath {} (rule: {})", f.paper, f.iopath, f.rule);
            println!("    most likely: {}", iopath::reproduce::render::likely_reason(&report.machine, section, f));
        }
    }
    if iopath::signal::interrupted() {
        eprintln!("interrupted: the report holds the experiments that finished");
    }
    Ok(())
}

/// Runs `iopath report`.
pub fn run_report(args: ReportArgs) -> iopath::Result<()> {
    let report = Report::load(&args.dir)?;
    iopath::reproduce::render::write_all(&report, &args.dir)?;
    println!(
        "redrew {} and {} from {}",
        args.dir.join("REPORT.md").display(),
        args.dir.join("report.html").display(),
        args.dir.join("results.json").display()
    );
    Ok(())
}
