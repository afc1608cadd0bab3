//! iopath: a user-space block I/O subsystem for ultra-low-latency storage.
//!
//! iopath puts the I/O paths of the fast-storage research side by side: an
//! I/O path is a **dispatch strategy** (who sends requests to the device,
//! and when: the caller at once, a merging leader, a queue and its thread)
//! combined with a **completion policy** (how a waiter learns its request is
//! done: spin, yield between looks, sleep, sleep then spin, or `auto`, which
//! measures and keeps choosing). Any path runs on any device: an emulated
//! ultra-low-latency SSD, `null`, or a real file or block device through
//! io_uring or pread. The `iopath` tool and the C interface are built on
//! this library; docs/ in the repository has the measured figures.
//!
//! # The engine: blocking calls from any thread
//!
//! [`Engine::open`] takes a device spec (the same strings as the tool's
//! `--device`: `emu:PRESET[,k=v]`, `null`, `uring:PATH`, `psync:PATH`, or
//! the path of an existing file or block device) and a [`PathConfig`]
//! (`PathConfig::preset("auto")`, `"sync-path"`, `"stm"`, ...). It is shared
//! by threads; `read_at` and `write_at` block until the device has answered.
//!
//! ```
//! use iopath::{Engine, PathConfig};
//! let engine = Engine::open("emu:dram-ssd,size=16m,populate=0", PathConfig::preset("sync-path")?)?;
//! engine.write_at(&[7u8; 4096], 8192)?;
//! let mut buf = vec![0u8; 4096];
//! engine.read_at(&mut buf, 8192)?;
//! assert_eq!(buf, vec![7u8; 4096]);
//! # Ok::<(), iopath::Error>(())
//! ```
//!
//! # Queued I/O: many requests in flight from one thread
//!
//! A per-thread [`Handle`] owns registered buffers and a queue: submit many
//! requests, send them in one batch, reap completions (io_uring's and
//! SPDK's shape).
//!
//! ```
//! use iopath::{Engine, HandleOptions, PathConfig, device::Op};
//! let engine = Engine::open("emu:optane,size=16m,populate=0", PathConfig::preset("sync-path")?)?;
//! let mut handle = engine.handle(HandleOptions { depth: 8, buffers: 8, buffer_size: 4096 })?;
//! for i in 0..8 {
//!     handle.submit(Op::Read, i, i as u64 * 4096, 4096)?; // buffer i, offset, length
//! }
//! handle.commit()?; // one batch
//! let mut done = Vec::new();
//! while done.len() < 8 {
//!     handle.reap(1, &mut done)?;
//! }
//! assert!(done.iter().all(|c| c.result.is_ok()));
//! # Ok::<(), iopath::Error>(())
//! ```
//!
//! # Files: iopath's file system
//!
//! [`fs::FileSystem`] puts files, directories, a page cache and a journal
//! on any engine (`iopath mkfs` does the same from the shell; programs reach
//! it unmodified through `iopath run --mount`).
//!
//! ```
//! use iopath::fs::{FileSystem, FormatOptions};
//! use iopath::{Engine, PathConfig};
//! use std::sync::Arc;
//! let engine = Arc::new(Engine::open("emu:optane,size=64m,populate=0", PathConfig::preset("auto")?)?);
//! FileSystem::format(engine.clone(), FormatOptions::default())?;
//! let (fs, _) = FileSystem::mount(engine)?;
//! fs.mkdir("logs", 0o755)?;
//! let f = fs.create("logs/today")?;
//! f.append(b"one record")?;
//! f.fsync()?; // durable from here on
//! let mut back = [0u8; 10];
//! fs.open("logs/today")?.read_at(&mut back, 0)?;
//! assert_eq!(&back, b"one record");
//! # Ok::<(), iopath::Error>(())
//! ```
//!
//! # From C and from unmodified programs
//!
//! `cargo build --release` also makes `libiopath.so`, whose interface is
//! `include/iopath.h` ([`capi`] implements it), and
//! `libiopath_preload.so`, which `iopath run` loads into programs to route
//! their direct I/O or serve their files from an iopath mount.
//!
//! # Layers
//!
//! Top to bottom (ARCHITECTURE.md has the map of the code):
//!
//! - [`bench`](mod@bench): workloads, statistics and reports behind the `iopath` tool;
//! - [`fs`]: files on any engine: format, journal, page cache, read and fsync paths;
//! - [`engine`]: the public API, an [`Engine`] shared by threads and a
//!   per-thread [`Handle`];
//! - [`path`]: a dispatch strategy combined with a completion policy;
//! - [`device`]: the emulated SSD, `null`, `psync` and `uring` backends.

pub mod bench;
pub mod buffer;
pub mod capi;
pub mod clock;
pub mod device;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod frames;
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
