//! Command-line parsing and the subcommands.

mod bench;
mod compare;
mod doctor;
mod files;
mod fsbench;
mod manuals;
mod mkfs;
mod path_args;
mod reproduce;
mod run;
mod soak;

use clap::{Parser, Subcommand};

/// iopath: user-space I/O paths for ultra-low-latency storage, measured side by side.
///
/// iopath runs the I/O-path designs from the fast-storage research (polling
/// versus interrupts, a fully synchronous path, temporal merging) on an
/// emulated ultra-low-latency SSD or on real files and block devices, and
/// reports what each costs. Its file layer (`iopath mkfs`, `iopath fsbench`)
/// puts files with a page cache and a journal on any of those devices.
///
/// Start with:  iopath reproduce --quick  (every seed's experiment: the papers' figures beside iopath's)
///              iopath compare            (seed 000's designs side by side on the emulated DRAM-SSD)
///              iopath bench --device emu:dram-ssd --path sync-path --rw randread --runtime 2s
#[derive(Parser)]
#[command(name = "iopath", version, about, long_about, propagate_version = true, verbatim_doc_comment)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one fio-like workload on one device through one I/O path.
    Bench(Box<bench::BenchArgs>),
    /// Run a matrix of paths x workloads side by side and compare them.
    Compare(Box<compare::CompareArgs>),
    /// Hammer random paths, devices and faults, checking every byte (reproducible from a seed).
    Soak(soak::SoakArgs),
    /// What this machine and a device support, what waiting costs here, and which path to use.
    Doctor(doctor::DoctorArgs),
    /// The file layer's workloads with its read and fsync paths side by side.
    Fsbench(fsbench::FsBenchArgs),
    /// Make an iopath file system on a device (erases it).
    Mkfs(mkfs::MkfsArgs),
    /// List directories of an iopath file system (-l long, -R recursive).
    Ls(files::LsArgs),
    /// Copy files in and out of an iopath file system ('::PATH' is inside it).
    Cp(files::CpArgs),
    /// Write files of an iopath file system to stdout.
    Cat(files::CatArgs),
    /// Remove files (and with -r, directories) of an iopath file system.
    Rm(files::RmArgs),
    /// Make directories in an iopath file system.
    Mkdir(files::MkdirArgs),
    /// Space and inodes used and free in an iopath file system.
    Df(files::DfArgs),
    /// Check every structure of an iopath file system and report what is wrong.
    Fsck(files::FsckArgs),
    /// Run a program with its files on iopath (--mount DIR=DEVICE) or its direct I/O routed (--files).
    Run(run::RunArgs),
    /// Run the seeds' experiments: the papers' figures beside iopath's, verdicts, charts, a report.
    Reproduce(reproduce::ReproduceArgs),
    /// Redraw a reproduce report (REPORT.md, report.html) from its results.json.
    Report(reproduce::ReportArgs),
    /// Print a shell completion script (bash, zsh, fish, ...).
    Completions(manuals::CompletionsArgs),
    /// Write man pages, one per command (iopath.1, iopath-bench.1, ...).
    Man(manuals::ManArgs),
}

/// Parses the command line and runs the chosen subcommand.
pub fn main() -> iopath::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench(args) => bench::run(*args),
        Command::Compare(args) => compare::run(*args),
        Command::Soak(args) => soak::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Fsbench(args) => fsbench::run(args),
        Command::Mkfs(args) => mkfs::run_mkfs(args),
        Command::Ls(args) => files::run_ls(args),
        Command::Cp(args) => files::run_cp(args),
        Command::Cat(args) => files::run_cat(args),
        Command::Rm(args) => files::run_rm(args),
        Command::Mkdir(args) => files::run_mkdir(args),
        Command::Df(args) => files::run_df(args),
        Command::Fsck(args) => files::run_fsck(args),
        Command::Run(args) => run::run(args),
        Command::Reproduce(args) => reproduce::run(args),
        Command::Report(args) => reproduce::run_report(args),
        Command::Completions(args) => manuals::run_completions(args),
        Command::Man(args) => manuals::run_man(args),
    }
}

/// Says on stderr which other processes are using the CPUs (sampled for
/// 100 ms), before a benchmark whose figures they would change.
fn warn_if_busy() {
    use iopath::bench::busy;
    if let Some(text) = busy::warning(&busy::others_busy(std::time::Duration::from_millis(100), 0.2)) {
        eprintln!("{text}");
    }
}
