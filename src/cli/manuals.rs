//! `iopath completions SHELL` and `iopath man --out DIR`: shell completions
//! and man pages, generated from the same command definitions as `--help`.

use clap::{Args, CommandFactory};
use clap_complete::Shell;
use iopath::{Error, Result};
use std::path::PathBuf;

const COMPLETIONS_HELP: &str = "\
Prints a completion script for SHELL on stdout: subcommands, flags and their values.

INSTALLING:
  bash:  iopath completions bash > ~/.local/share/bash-completion/completions/iopath
  zsh:   iopath completions zsh > \"${fpath[1]}/_iopath\"   (or any directory in $fpath)
  fish:  iopath completions fish > ~/.config/fish/completions/iopath.fish
";

const MAN_HELP: &str = "\
Writes one man page per command into DIR: iopath.1, iopath-bench.1, iopath-run.1, ...

INSTALLING:
  sudo iopath man --out /usr/local/share/man/man1 && man iopath-bench
  iopath man --out ~/.local/share/man/man1          (read by man when ~/.local/bin is on PATH)
";

/// Arguments of `iopath completions`.
#[derive(Args, Debug)]
#[command(after_long_help = COMPLETIONS_HELP)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    shell: Shell,
}

/// Arguments of `iopath man`.
#[derive(Args, Debug)]
#[command(after_long_help = MAN_HELP)]
pub struct ManArgs {
    /// Directory for the pages (made if it does not exist).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// Prints the completion script.
pub fn run_completions(args: CompletionsArgs) -> Result<()> {
    let mut command = super::Cli::command();
    clap_complete::generate(args.shell, &mut command, "iopath", &mut std::io::stdout());
    Ok(())
}

/// Writes the man pages.
pub fn run_man(args: ManArgs) -> Result<()> {
    let failed = |source| Error::Os { context: format!("cannot write man pages into {}", args.out.display()), source };
    std::fs::create_dir_all(&args.out).map_err(failed)?;
    // Not built first: generate_to leaves out clap's `help` subcommand only if it builds the tree itself.
    clap_mangen::generate_to(super::Cli::command(), &args.out).map_err(failed)?;
    let pages = std::fs::read_dir(&args.out).map_err(failed)?.count();
    eprintln!("iopath: wrote the man pages into {} ({pages} files there); try: man iopath-bench", args.out.display());
    Ok(())
}
