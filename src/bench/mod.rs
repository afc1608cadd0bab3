//! Benchmarks: workloads, measurements, verification and reports.
//!
//! [`run`](fn@run) carries out one fio-like job ([`BenchConfig`]) and returns a
//! [`BenchResult`]; [`report`] renders results as a table or as fio-compatible
//! JSON.

pub mod busy;
pub mod compare;
pub mod distribution;
pub mod fsbench;
pub mod hogs;
pub mod jobfile;
pub mod logs;
pub mod report;
pub mod run;
pub mod soak;
pub mod stats;
pub mod svg;
pub mod workload;

pub use run::{BenchConfig, BenchResult, run};
pub use workload::Rw;
