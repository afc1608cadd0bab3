//! iopath: a user-space block I/O subsystem for ultra-low-latency storage.
//!
//! Layers, top to bottom (see ARCHITECTURE.md):
//!
//! - [`bench`](mod@bench): workloads, statistics and reports behind the `iopath` tool;
//! - [`engine`]: the public API, an [`Engine`] shared by threads and a
//!   per-thread [`Handle`];
//! - [`path`]: a dispatch strategy combined with a completion policy;
//! - [`device`]: the emulated SSD, `null`, `psync` and `uring` backends.
//!
//! ```no_run
//! use iopath::{Engine, PathConfig};
//! let engine = Engine::open("emu:dram-ssd,size=64m", PathConfig::preset("sync-path")?)?;
//! engine.write_at(&[7u8; 4096], 8192)?;
//! let mut buf = vec![0u8; 4096];
//! engine.read_at(&mut buf, 8192)?;
//! assert_eq!(buf, vec![7u8; 4096]);
//! # Ok::<(), iopath::Error>(())
//! ```

pub mod bench;
pub mod buffer;
pub mod capi;
pub mod clock;
pub mod device;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod fs;
mod hash;
pub mod idle;
pub mod path;
pub mod pattern;
pub mod reproduce;
pub mod signal;
mod sync;
pub mod sys;
pub mod units;

pub use buffer::IoBuf;
pub use engine::{Engine, Handle, HandleOptions};
pub use error::{Error, Result};
pub use path::PathConfig;
