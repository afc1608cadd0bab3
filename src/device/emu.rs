//! `emu`: the emulated ultra-low-latency SSD.
//!
//! There is no device thread. When a command is submitted, the [`Model`]
//! gives it a completion deadline and its data is moved at once between the
//! caller's buffers and the [`Store`] (standing in for the device's DMA, which
//! overlaps the device time). A poll sees the command complete once the clock
//! passes the deadline; a wait is a real timer sleep until the deadline, so an
//! emulated interrupt costs what a wake-up costs on this machine.
//!
//! Faults are injected by the [`fault`](super::fault) wrapper, which works on
//! every backend (`emu:dram-ssd,fail_rate=0.01` wraps this device). A
//! volatile write cache and power cuts (`wcache=1`, `cut_after=N`) are in
//! [`volatile`](super::volatile).

use super::model::{Model, ModelParams, Preset, preset, presets};
use super::spec::Options;
use super::store::Store;
use super::volatile::{CutMode, CutPlan, VolatileCache};
use super::{Cancel, Capabilities, Command, Device, DeviceStats, Durability, Op, Queue, QueueConfig};
use crate::clock::{now_ns, sleep_until_ns};
use crate::error::Result;
use crate::units::format_size;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Segments one emulated command may carry (the seed's Block Control Table).
pub const MAX_SEGMENTS: usize = 1024;
/// Largest segment the emulated device takes.
pub const MAX_SEGMENT_BYTES: u32 = 1 << 20;
const DEFAULT_SIZE: u64 = 1 << 30;

/// Everything needed to open an emulated device.
#[derive(Debug, Clone)]
pub struct EmuConfig {
    /// Preset the parameters started from.
    pub preset: String,
    /// Timing parameters after overrides.
    pub params: ModelParams,
    /// Size in bytes.
    pub size: u64,
    /// Back the data with this file instead of memory.
    pub file: Option<PathBuf>,
    /// Allocate the memory store up front so no request pays a page fault (default on).
    pub populate: bool,
    /// With `file`: map it copy-on-write, so nothing written reaches the file.
    pub read_only: bool,
    /// With `file`: what may be written to an existing file iopath did not create.
    pub guard: super::target::Guard,
    /// A volatile write cache (writes durable only after a flush) and when power is cut.
    pub write_cache: Option<CutPlan>,
}

const KNOWN: &[&str] = &[
    "size",
    "file",
    "slots",
    "channels",
    "cmd",
    "xfer",
    "rcmd",
    "rxfer",
    "wcmd",
    "wxfer",
    "flush",
    "populate",
    "wcache",
    "cut_after",
    "cut_random",
    "cut",
    "cut_seed",
];

impl EmuConfig {
    /// Parses `PRESET` and the options of an `emu:` spec.
    pub fn parse(preset_name: &str, mut opts: Options, default_size: Option<u64>) -> Result<EmuConfig> {
        let name = if preset_name.is_empty() { "dram-ssd" } else { preset_name };
        let base: Preset = match name {
            "custom" => preset("dram-ssd").expect("dram-ssd preset exists"),
            _ => preset(name).ok_or_else(|| {
                let names: Vec<_> = presets().iter().map(|p| p.name).collect();
                opts.error(format!("unknown preset '{name}'; presets: {}, custom", names.join(", ")))
            })?,
        };
        let mut params = base.params;
        let ns = |d: std::time::Duration| d.as_nanos() as f64;
        if let Some(v) = opts.take_num::<u32>("slots")? {
            params.slots = v;
        }
        if let Some(v) = opts.take_num::<u32>("channels")? {
            params.channels = v;
        }
        if let Some(d) = opts.take_micros("cmd")? {
            params.read.cmd_ns = ns(d);
            params.write.cmd_ns = ns(d);
        }
        if let Some(d) = opts.take_micros("xfer")? {
            params.read.xfer_ns = ns(d);
            params.write.xfer_ns = ns(d);
        }
        if let Some(d) = opts.take_micros("rcmd")? {
            params.read.cmd_ns = ns(d);
        }
        if let Some(d) = opts.take_micros("rxfer")? {
            params.read.xfer_ns = ns(d);
        }
        if let Some(d) = opts.take_micros("wcmd")? {
            params.write.cmd_ns = ns(d);
        }
        if let Some(d) = opts.take_micros("wxfer")? {
            params.write.xfer_ns = ns(d);
        }
        if let Some(d) = opts.take_micros("flush")? {
            params.flush_ns = ns(d);
        }
        if params.slots == 0 || params.channels == 0 {
            return Err(opts.error("slots and channels must be at least 1"));
        }
        let size = opts.take_size("size")?.or(default_size).unwrap_or(DEFAULT_SIZE);
        if size == 0 {
            return Err(opts.error("size must be larger than 0"));
        }
        let file = opts.take("file").map(PathBuf::from);
        // Off by default: allocating 1 GiB up front takes ~3 s of system time on these VMs,
        // and reads of never-written pages come from the kernel's shared zero page anyway.
        // On by default: a device has no page faults, and a first write into fresh
        // memory costs ~1-20 µs here, paid by whichever thread copies the data (the
        // merging paths' serving thread), which cost STM ~3% of peak on writes.
        let populate = opts.take_bool("populate")?.unwrap_or(true);
        let read_only = opts.take_bool("readonly")?.unwrap_or(false);
        let write_cache = parse_cut_plan(&mut opts)?;
        opts.finish(KNOWN)?;
        Ok(EmuConfig {
            preset: name.to_string(),
            params,
            size,
            file,
            populate,
            read_only,
            guard: super::target::Guard::Off,
            write_cache,
        })
    }
}

/// `wcache=1`, `cut_after=N`, `cut_random=N`, `cut=tear|drop`, `cut_seed=S`.
fn parse_cut_plan(opts: &mut Options) -> Result<Option<CutPlan>> {
    let enabled = opts.take_bool("wcache")?;
    let after = opts.take_num::<u64>("cut_after")?;
    let random = opts.take_num::<u64>("cut_random")?;
    let mode = match opts.take("cut").as_deref() {
        None | Some("tear") => CutMode::Tear,
        Some("drop") => CutMode::Drop,
        Some(other) => return Err(opts.error(format!("cut={other}: a power cut either 'tear's or 'drop's"))),
    };
    let seed = opts.take_num::<u64>("cut_seed")?.unwrap_or(1);
    let cutting = after.is_some() || random.is_some();
    match enabled {
        Some(false) if cutting => {
            return Err(opts.error("a power cut needs the volatile write cache; drop wcache=0"));
        }
        Some(false) | None if !cutting => return Ok(None),
        _ => {}
    }
    if after.is_some() && random.is_some() {
        return Err(opts.error("give either cut_after=N or cut_random=N, not both"));
    }
    if random == Some(0) {
        return Err(opts.error("cut_random=N picks a point in the first N commands; N must be at least 1"));
    }
    let after = after.or_else(|| random.map(|n| fastrand::Rng::with_seed(seed).u64(1..=n)));
    Ok(Some(CutPlan { after, mode, seed }))
}

struct Counters {
    model: Model,
    stats: DeviceStats,
}

struct Shared {
    config: EmuConfig,
    counters: Mutex<Counters>,
    store: Store,
    cache: Option<Mutex<VolatileCache>>,
}

/// The emulated SSD.
pub struct EmuDevice {
    shared: Arc<Shared>,
}

impl EmuDevice {
    /// Opens an emulated device.
    pub fn open(config: &EmuConfig) -> Result<EmuDevice> {
        let store = match &config.file {
            Some(path) => Store::file(path, config.size, config.read_only, config.guard)?,
            None => Store::memory(config.size, config.populate)?,
        };
        let counters = Counters { model: Model::new(config.params.clone()), stats: DeviceStats::default() };
        let cache = config.write_cache.map(|plan| Mutex::new(VolatileCache::new(plan)));
        Ok(EmuDevice {
            shared: Arc::new(Shared { config: config.clone(), counters: Mutex::new(counters), store, cache }),
        })
    }

    fn cache(&self) -> Option<std::sync::MutexGuard<'_, VolatileCache>> {
        self.shared.cache.as_ref().map(|c| c.lock().expect("emu write cache poisoned"))
    }

    /// Cuts the power now (needs `wcache=1`): what was written since the last
    /// flush survives or not as the `cut` option says, and every command fails
    /// with `EIO` until [`EmuDevice::power_on`]. Returns false without a write cache.
    pub fn power_cut(&self) -> bool {
        self.cache().map(|mut c| c.cut(&self.shared.store)).is_some()
    }

    /// Plans a power cut just before the command after `commands` more commands.
    pub fn cut_after(&self, commands: u64) -> bool {
        self.cache().map(|mut c| c.cut_after(commands)).is_some()
    }

    /// Powers the device back on after a cut, with an empty write cache.
    pub fn power_on(&self) {
        if let Some(mut c) = self.cache() {
            c.power_on();
        }
    }

    /// Whether the power is on (always, without a write cache).
    pub fn powered(&self) -> bool {
        self.cache().is_none_or(|c| c.powered())
    }

    /// Commands the device accepted since it was (last) powered on; 0 without a write cache.
    pub fn commands_since_power_on(&self) -> u64 {
        self.cache().map_or(0, |c| c.commands())
    }

    /// Sectors written since the last flush (what a cut now could lose).
    pub fn unflushed_sectors(&self) -> usize {
        self.cache().map_or(0, |c| c.dirty_sectors())
    }
}

impl Device for EmuDevice {
    fn describe(&self) -> String {
        let c = &self.shared.config;
        let p = &c.params;
        let us = |ns: f64| ns / 1000.0;
        format!(
            "emu:{} ({} slot(s), {} channel(s), read {:.2}+{:.2} us/4KiB, write {:.2}+{:.2} us/4KiB, {} in {}{})",
            c.preset,
            p.slots,
            p.channels,
            us(p.read.cmd_ns),
            us(p.read.xfer_ns),
            us(p.write.cmd_ns),
            us(p.write.xfer_ns),
            format_size(c.size),
            c.file.as_ref().map_or("memory".to_string(), |f| f.display().to_string()),
            if c.write_cache.is_some() { ", volatile write cache" } else { "" },
        )
    }

    fn size(&self) -> u64 {
        self.shared.config.size
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_segments: MAX_SEGMENTS,
            max_segment_bytes: MAX_SEGMENT_BYTES,
            alignment: 1,
            queue_depth: 4096,
            kernel_poll: false,
            timed: true,
            stores_data: true,
            submits_at_commit: true,
        }
    }

    fn completion_source(&self, polled: bool) -> String {
        if polled {
            "the emulated completion deadline, spun on in user space (a sleeping wait uses a timer)".into()
        } else {
            "a timer set to the emulated completion deadline (the emulated interrupt)".into()
        }
    }

    fn open_queue(&self, config: &QueueConfig) -> Result<Box<dyn Queue>> {
        Ok(Box::new(EmuQueue {
            shared: Arc::clone(&self.shared),
            in_flight: Vec::with_capacity(config.depth as usize),
        }))
    }

    fn stats(&self) -> DeviceStats {
        let c = self.shared.counters.lock().expect("emu counters poisoned");
        DeviceStats { busy_ns: c.model.busy_ns(), ..c.stats }
    }

    fn peak_bandwidth(&self, read_fraction: f64) -> Option<f64> {
        self.shared.counters.lock().expect("emu counters poisoned").model.peak_bandwidth(read_fraction)
    }
}

struct EmuQueue {
    shared: Arc<Shared>,
    /// (deadline, command), unordered: queues are shallow, a scan is cheapest.
    in_flight: Vec<(u64, Command)>,
}

impl EmuQueue {
    /// Schedules the command on the shared model; returns (deadline, command number).
    fn schedule(&self, now: u64, command: &Command) -> u64 {
        let mut c = self.shared.counters.lock().expect("emu counters poisoned");
        let ranges = command.segments.iter().map(|s| (s.offset, s.len as u64));
        let schedule = if command.durability != Durability::Cached && command.op == Op::Write {
            c.model.schedule_write(now, command.durability, ranges)
        } else {
            c.model.schedule(now, command.op, ranges)
        };
        c.stats.commands += 1;
        c.stats.segments += command.segments.len() as u64;
        c.stats.bytes += command.bytes();
        schedule.deadline_ns
    }

    /// Moves the data of every segment that is in range.
    fn transfer(&mut self, command: &mut Command) {
        let store = &self.shared.store;
        for seg in &mut command.segments {
            let end = seg.offset.checked_add(seg.len as u64);
            if seg.len == 0 || end.is_none_or(|e| e > store.len()) {
                seg.result = -libc::EINVAL;
                continue;
            }
            // SAFETY: the range was checked against the store; the submitter guarantees the
            // buffer is valid for `len` bytes while the command is in flight.
            unsafe {
                match command.op {
                    Op::Read => store.read(seg.offset, seg.buf, seg.len as usize),
                    Op::Write => store.write(seg.offset, seg.buf, seg.len as usize),
                    Op::Trim => store.zero(seg.offset, seg.len as usize),
                    Op::Flush => {}
                }
            }
            seg.result = seg.len as i32;
        }
    }
}

impl Queue for EmuQueue {
    unsafe fn submit(&mut self, mut command: Command) {
        let now = now_ns();
        let shared = Arc::clone(&self.shared);
        let mut cache = shared.cache.as_ref().map(|c| c.lock().expect("emu write cache poisoned"));
        if let Some(cache) = cache.as_mut()
            && !cache.admit(&shared.store)
        {
            // No power: the command fails at once, as on a device that dropped off the bus.
            command.fail_all(libc::EIO);
            self.in_flight.push((now, command));
            return;
        }
        let deadline = self.schedule(now, &command);
        if command.op == Op::Flush {
            command.result = match self.shared.store.flush() {
                Ok(()) => 0,
                Err(_) => -libc::EIO,
            };
            if command.result == 0
                && let Some(cache) = cache.as_mut()
            {
                cache.flushed();
            }
        } else {
            let durability = if command.op == Op::Write { command.durability } else { Durability::Cached };
            if durability == Durability::Ordered {
                // Its flush: everything accepted before it reaches the media first.
                if self.shared.store.flush().is_err() {
                    command.fail_all(libc::EIO);
                    drop(cache);
                    command.device_ns = deadline - now;
                    self.in_flight.push((deadline, command));
                    return;
                }
                if let Some(cache) = cache.as_mut() {
                    cache.flushed();
                }
            }
            let mark = cache.as_ref().map_or(0, |c| c.writes_since_flush());
            if matches!(command.op, Op::Write | Op::Trim)
                && let Some(cache) = cache.as_mut()
            {
                for seg in &command.segments {
                    if seg.len > 0
                        && seg.offset.checked_add(seg.len as u64).is_some_and(|end| end <= shared.store.len())
                    {
                        // A trim is, to the cache, a write of zeros.
                        let zeros;
                        let data = if command.op == Op::Trim {
                            zeros = vec![0u8; seg.len as usize];
                            &zeros[..]
                        } else {
                            // SAFETY: the submitter guarantees the buffer holds `len` bytes while
                            // the command is in flight (see `Queue::submit`).
                            unsafe { std::slice::from_raw_parts(seg.buf, seg.len as usize) }
                        };
                        cache.before_write(&shared.store, seg.offset, data);
                    }
                }
            }
            // Under the cache's lock, so a cut sees each write whole or not at all.
            self.transfer(&mut command);
            // Its forced unit access: durable before it completes (and, as it is
            // applied at once here, before any later command can be cut short).
            if durability != Durability::Cached && command.segments.iter().all(|s| s.result >= 0) {
                if self.shared.store.flush().is_err() {
                    command.fail_all(libc::EIO);
                } else if let Some(cache) = cache.as_mut() {
                    if durability == Durability::Ordered {
                        // Its flush left nothing else in the cache (all under the lock).
                        cache.flushed();
                    } else {
                        cache.forced_since(mark);
                    }
                }
            }
        }
        drop(cache);
        command.device_ns = deadline - now;
        self.in_flight.push((deadline, command));
    }

    fn commit(&mut self) -> Result<()> {
        Ok(())
    }

    fn reap(&mut self, out: &mut Vec<Command>) -> Result<usize> {
        if self.in_flight.is_empty() {
            return Ok(0);
        }
        let now = now_ns();
        let mut reaped = 0;
        let mut i = 0;
        while i < self.in_flight.len() {
            if self.in_flight[i].0 <= now {
                out.push(self.in_flight.swap_remove(i).1);
                reaped += 1;
            } else {
                i += 1;
            }
        }
        Ok(reaped)
    }

    fn wait(&mut self, out: &mut Vec<Command>, timeout_ns: u64) -> Result<usize> {
        let limit = now_ns().saturating_add(timeout_ns);
        loop {
            let n = self.reap(out)?;
            if n > 0 || self.in_flight.is_empty() {
                return Ok(n);
            }
            let now = now_ns();
            if now >= limit {
                return Ok(0);
            }
            let next = self.next_deadline_ns().unwrap_or(u64::MAX);
            sleep_until_ns(next.min(limit));
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn next_deadline_ns(&self) -> Option<u64> {
        self.in_flight.iter().map(|(d, _)| *d).min()
    }

    fn cancel(&mut self, which: Cancel) -> Result<()> {
        // The data moved at submission; a cancelled command comes back at once, failed.
        let now = now_ns();
        for (deadline, command) in &mut self.in_flight {
            if which.covers(command.tag) && *deadline > now {
                *deadline = now;
                command.fail_all(libc::ECANCELED);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl EmuDevice {
        fn write_cache_absent(&self) -> bool {
            !self.power_cut() && self.powered()
        }
    }

    fn open(spec: &str) -> EmuDevice {
        let super::super::spec::Backend::Emu(c) = super::super::DeviceSpec::parse(spec, None).unwrap().backend else {
            panic!()
        };
        EmuDevice::open(&c).unwrap()
    }

    fn run(q: &mut dyn Queue, command: Command) -> Command {
        // SAFETY: the test's buffers outlive the wait below.
        unsafe { q.submit(command) };
        let mut out = Vec::new();
        while out.is_empty() {
            q.wait(&mut out, 1_000_000_000).unwrap();
        }
        out.pop().unwrap()
    }

    #[test]
    fn data_round_trips_and_device_time_is_the_model() {
        let dev = open("emu:dram-ssd,size=1m");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let mut wbuf = vec![0xabu8; 4096];
        let mut cmd = Command::with_capacity(1);
        cmd.reset(Op::Write, 7);
        cmd.push(8192, wbuf.as_mut_ptr(), 4096);
        let done = run(q.as_mut(), cmd);
        assert_eq!(done.tag, 7);
        assert_eq!(done.segments[0].result, 4096);
        assert!(done.device_ns >= 7000, "{}", done.device_ns);
        let mut rbuf = vec![0u8; 4096];
        let mut cmd = Command::with_capacity(1);
        cmd.reset(Op::Read, 8);
        cmd.push(8192, rbuf.as_mut_ptr(), 4096);
        run(q.as_mut(), cmd);
        assert_eq!(rbuf, wbuf);
        let stats = dev.stats();
        assert_eq!(stats.commands, 2);
        assert!(stats.busy_ns >= 14_000);
    }

    #[test]
    fn a_cancelled_command_comes_back_at_once_failed() {
        let dev = open("emu:custom,size=1m,cmd=1s");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        let mut buf = vec![0u8; 4096];
        let mut cmd = Command::with_capacity(1);
        cmd.reset(Op::Read, 5);
        cmd.push(0, buf.as_mut_ptr(), 4096);
        // SAFETY: the buffer outlives the wait below.
        unsafe { q.submit(cmd) };
        q.cancel(Cancel::Tag(5)).unwrap();
        let mut out = Vec::new();
        assert_eq!(q.reap(&mut out).unwrap(), 1);
        assert_eq!(out[0].segments[0].result, -libc::ECANCELED);
    }

    #[test]
    fn file_backed_store_is_durable_after_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("emu.img");
        let spec = format!("emu:null,size=64k,file={}", path.display());
        let dev = open(&spec);
        let mut q = dev.open_queue(&QueueConfig::depth(2)).unwrap();
        let mut buf = vec![0x5au8; 4096];
        let mut cmd = Command::with_capacity(1);
        cmd.reset(Op::Write, 1);
        cmd.push(4096, buf.as_mut_ptr(), 4096);
        run(q.as_mut(), cmd);
        let mut flush = Command::with_capacity(0);
        flush.reset(Op::Flush, 2);
        assert_eq!(run(q.as_mut(), flush).result, 0);
        let on_disk = std::fs::read(&path).unwrap();
        assert_eq!(on_disk.len(), 65536);
        assert!(on_disk[4096..8192].iter().all(|&b| b == 0x5a));
    }

    fn write(q: &mut dyn Queue, offset: u64, byte: u8, len: usize) -> i32 {
        let mut buf = vec![byte; len];
        let mut cmd = Command::with_capacity(1);
        cmd.reset(Op::Write, 1);
        cmd.push(offset, buf.as_mut_ptr(), len as u32);
        run(q, cmd).segments[0].result
    }

    fn flush(q: &mut dyn Queue) -> i32 {
        let mut cmd = Command::with_capacity(0);
        cmd.reset(Op::Flush, 2);
        run(q, cmd).result
    }

    fn contents(dev: &EmuDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        // SAFETY: the test reads inside the store into a buffer of `len` bytes.
        unsafe { dev.shared.store.read(offset, buf.as_mut_ptr(), len) };
        buf
    }

    #[test]
    fn a_power_cut_drops_what_was_not_flushed_and_keeps_what_was() {
        let dev = open("emu:null,size=64k,wcache=1,cut=drop");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        assert_eq!(write(q.as_mut(), 0, 1, 4096), 4096);
        assert_eq!(flush(q.as_mut()), 0);
        assert_eq!(write(q.as_mut(), 0, 2, 1024), 1024);
        assert_eq!(write(q.as_mut(), 8192, 3, 4096), 4096);
        // Reads see the cache before the cut.
        assert_eq!(contents(&dev, 0, 1024), vec![2; 1024]);
        assert_eq!(dev.unflushed_sectors(), 2 + 8);
        assert!(dev.power_cut());
        assert!(!dev.powered());
        assert_eq!(contents(&dev, 0, 4096), vec![1; 4096]);
        assert_eq!(contents(&dev, 8192, 4096), vec![0; 4096]);
        // Without power every command fails, flushes too.
        assert_eq!(write(q.as_mut(), 0, 9, 512), -libc::EIO);
        assert_eq!(flush(q.as_mut()), -libc::EIO);
        dev.power_on();
        assert_eq!(write(q.as_mut(), 0, 9, 512), 512);
    }

    fn durable_write(q: &mut dyn Queue, offset: u64, byte: u8, len: usize) -> i32 {
        let mut buf = vec![byte; len];
        let mut cmd = Command::with_capacity(1);
        cmd.reset(Op::Write, 3);
        cmd.durability = Durability::Ordered;
        cmd.push(offset, buf.as_mut_ptr(), len as u32);
        run(q, cmd).segments[0].result
    }

    #[test]
    fn a_fua_write_survives_a_cut_alone() {
        for cut in ["drop", "tear"] {
            let dev = open(&format!("emu:null,size=64k,wcache=1,cut={cut},cut_seed=3"));
            let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
            assert_eq!(write(q.as_mut(), 0, 1, 4096), 4096);
            assert_eq!(flush(q.as_mut()), 0);
            assert_eq!(write(q.as_mut(), 0, 2, 4096), 4096); // over the flushed 1s
            let mut buf = vec![3u8; 4096];
            let mut cmd = Command::with_capacity(1);
            cmd.reset(Op::Write, 4);
            cmd.durability = Durability::Fua;
            cmd.push(8192, buf.as_mut_ptr(), 4096);
            assert_eq!(run(q.as_mut(), cmd).segments[0].result, 4096);
            assert!(dev.power_cut());
            assert_eq!(contents(&dev, 8192, 4096), vec![3; 4096], "cut={cut}: the FUA write");
            if cut == "drop" {
                assert_eq!(contents(&dev, 0, 4096), vec![1; 4096], "the plain write before it was not flushed");
            }
        }
    }

    #[test]
    fn a_durable_write_survives_a_cut_with_everything_written_before_it_and_nothing_after() {
        let dev = open("emu:null,size=64k,wcache=1,cut=drop");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        assert_eq!(write(q.as_mut(), 0, 1, 4096), 4096);
        assert_eq!(durable_write(q.as_mut(), 8192, 2, 4096), 4096);
        assert_eq!(dev.unflushed_sectors(), 0, "its flush and its FUA leave nothing unflushed");
        assert_eq!(write(q.as_mut(), 16384, 3, 4096), 4096);
        assert!(dev.power_cut());
        assert_eq!(contents(&dev, 0, 4096), vec![1; 4096], "written before: made durable by its flush");
        assert_eq!(contents(&dev, 8192, 4096), vec![2; 4096], "the durable write itself");
        assert_eq!(contents(&dev, 16384, 4096), vec![0; 4096], "written after it and never flushed");
        // Without power it fails like any other command.
        assert_eq!(durable_write(q.as_mut(), 8192, 4, 4096), -libc::EIO);
    }

    #[test]
    fn a_torn_cut_keeps_writes_whole_lost_or_torn_by_sector() {
        let dev = open("emu:null,size=1m,wcache=1,cut_seed=7");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        // 30 writes of 8 sectors, each a different byte, then 30 more over the same places.
        for round in 0..2u8 {
            for w in 0..30u8 {
                assert_eq!(write(q.as_mut(), w as u64 * 4096, 1 + w + round * 30, 4096), 4096);
            }
        }
        dev.power_cut();
        let mut fates = [0usize; 3]; // whole-old, whole-new, mixed
        for w in 0..30u8 {
            let block = contents(&dev, w as u64 * 4096, 4096);
            let mut seen = Vec::new();
            for sector in block.chunks(512) {
                let first = sector[0];
                assert!([0, 1 + w, 31 + w].contains(&first), "sector holds {first}, written nowhere");
                assert!(sector.iter().all(|&b| b == first), "a sector was torn inside");
                seen.push(first);
            }
            seen.dedup();
            fates[if seen.len() > 1 {
                2
            } else if seen[0] == 0 {
                0
            } else {
                1
            }] += 1;
        }
        assert!(fates.iter().all(|&n| n > 0), "whole, lost and torn outcomes all occur: {fates:?}");
    }

    #[test]
    fn cut_after_counts_commands_and_fails_the_next() {
        let dev = open("emu:null,size=64k,cut_after=2,cut=drop");
        let mut q = dev.open_queue(&QueueConfig::depth(4)).unwrap();
        assert_eq!(write(q.as_mut(), 0, 1, 512), 512);
        assert_eq!(flush(q.as_mut()), 0);
        assert!(dev.powered());
        assert_eq!(write(q.as_mut(), 512, 1, 512), -libc::EIO);
        assert!(!dev.powered());
        assert_eq!(contents(&dev, 0, 1024), [vec![1; 512], vec![0; 512]].concat());
        dev.power_on();
        assert!(dev.cut_after(0));
        assert_eq!(write(q.as_mut(), 0, 5, 512), -libc::EIO);
    }

    #[test]
    fn cut_options_are_checked() {
        use super::super::DeviceSpec;
        for bad in [
            "emu:null,wcache=0,cut_after=3",
            "emu:null,cut_after=1,cut_random=4",
            "emu:null,cut=melt",
            "emu:null,cut_random=0",
        ] {
            let e = DeviceSpec::parse(bad, None).unwrap_err().to_string();
            assert!(e.contains("cut"), "{bad}: {e}");
        }
        let super::super::spec::Backend::Emu(c) =
            DeviceSpec::parse("emu:null,cut_random=10,cut_seed=3", None).unwrap().backend
        else {
            panic!()
        };
        let plan = c.write_cache.unwrap();
        assert!((1..=10).contains(&plan.after.unwrap()));
        assert!(open("emu:null").write_cache_absent());
    }

    #[test]
    fn bad_presets_and_params_are_rejected() {
        use super::super::DeviceSpec;
        let e = DeviceSpec::parse("emu:floppy", None).unwrap_err().to_string();
        assert!(e.contains("dram-ssd"), "{e}");
        assert!(DeviceSpec::parse("emu:dram-ssd,slots=0", None).is_err());
        assert!(DeviceSpec::parse("emu:dram-ssd,xfer=fast", None).is_err());
        let super::super::spec::Backend::Emu(c) =
            DeviceSpec::parse("emu:dram-ssd,size=4g,xfer=3us", None).unwrap().backend
        else {
            panic!()
        };
        assert_eq!(c.size, 4 << 30);
        assert_eq!(c.params.read.xfer_ns, 3000.0);
        assert_eq!(c.params.read.cmd_ns, 1520.0);
    }
}
