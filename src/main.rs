//! The `iopath` command-line tool.

mod cli;

fn main() {
    if let Err(e) = cli::main() {
        eprintln!("iopath: error: {e}");
        std::process::exit(1);
    }
}
