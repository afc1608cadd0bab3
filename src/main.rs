//! The `iopath` command-line tool.

mod cli;

fn main() {
    // Before any thread starts (the signal thread is the first).
    iopath::sys::grow_descriptor_table();
    if let Err(e) = iopath::signal::install() {
        eprintln!("iopath: warning: cannot catch Ctrl-C ({e}); an interrupted run will print nothing");
    }
    let outcome = cli::main();
    // An interrupted run printed what it measured (marked partial); it still ends as an
    // interrupted program does, so scripts see that it did not finish.
    let signal = iopath::signal::signal();
    if let Err(e) = outcome {
        eprintln!("iopath: error: {e}");
        std::process::exit(if signal > 0 { 128 + signal } else { 1 });
    }
    if signal > 0 {
        std::process::exit(128 + signal);
    }
}
