//! `uring`: io_uring on a file or block device, O_DIRECT.
//!
//! Each queue is its own ring, created on the thread that uses it, so it can
//! be set up `SINGLE_ISSUER | DEFER_TASKRUN` (completions are posted only when
//! this thread asks, with no interrupts of user space). A queue that threads
//! take turns on ([`QueueConfig::shared`], the combining strategy's serving
//! role) is set up `COOP_TASKRUN | TASKRUN_FLAG` instead: a completion is
//! posted by task work on the thread that submitted it, at that thread's next
//! kernel entry (a sleeping one is woken for it), and a look at an empty
//! completion ring enters the kernel only when the ring's TASKRUN flag says
//! some task work is pending. A command's segments
//! become one SQE each and a whole batch of commands is sent with one
//! `io_uring_enter` at [`Queue::commit`]; the command completes when its last
//! CQE arrives. Memory the engine registers is used through fixed buffers
//! (`READ_FIXED`/`WRITE_FIXED`) and the target is a registered file; where the
//! kernel refuses either (memlock limit, old kernel) the queue falls back to
//! plain reads and writes and says so in [`UringDevice::describe`].
//!
//! Completion is learned either by spinning on the completion ring
//! ([`Queue::reap`]; with DEFER_TASKRUN a look whose ring says task work is
//! pending (TASKRUN flag) runs it with a zero-wait enter, and an empty look
//! with none pending makes no system call) or by sleeping in the kernel
//! ([`Queue::wait`]).
//! Kernel polling (IOPOLL) is probed at open and used only where the device
//! supports it; on these machines it does not, and the probe says why.

use super::aio::SharedAio;
use super::spec::Options;
use super::target::{Target, TargetConfig};
use super::{Cancel, Capabilities, Command, Counters, Device, DeviceStats, Durability, Op, Queue, QueueConfig};
use crate::error::{Error, Result};
use io_uring::{IoUring, opcode, squeue, types};
use std::collections::VecDeque;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Most segments one uring command carries (each is one SQE).
pub const MAX_SEGMENTS: usize = 256;
const SQ_ENTRIES: u32 = 512;
const SEG_BITS: u32 = 16;
/// Segment index in `user_data` of an `Ordered` write's leading flush (no real segment has it).
const FLUSH_SEG: u64 = (1 << SEG_BITS) - 1;
/// `user_data` of the cancellation requests themselves (their CQEs are not a command's).
const CANCEL_USER_DATA: u64 = u64::MAX;
/// `user_data` of the watchdog timeout long waits sleep under (its CQE is not a command's).
const WATCHDOG_USER_DATA: u64 = u64::MAX - 1;
/// A wait at least this long sleeps with no timer of its own, under a
/// watchdog timeout this far ahead shared by every such wait until it fires.
/// A timed wait arms and cancels a kernel timer each time, which in a VM
/// costs exits to the hypervisor: at depth 1 on a loop device the untimed
/// wait took sync-intr from a median 65K to 81K IOPS (5 alternating runs).
const WATCHDOG_NS: u64 = 100_000_000;

/// How completions are delivered to the ring's owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskRun {
    /// `SINGLE_ISSUER | DEFER_TASKRUN`: completions are posted when the owner enters.
    Defer,
    /// `COOP_TASKRUN`: posted at the next kernel transition, no IPI.
    Coop,
    /// Default io_uring behaviour.
    Plain,
}

/// Whether to use kernel polling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoPoll {
    /// Never.
    Off,
    /// Always; fail if the device cannot.
    On,
    /// Probe at open and use it if it works.
    Auto,
}

/// Options of the uring backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UringConfig {
    /// The file or block device.
    pub target: TargetConfig,
    /// Completion delivery mode.
    pub taskrun: TaskRun,
    /// Use registered (fixed) buffers when the engine offers a region.
    pub fixed_buffers: bool,
    /// Use a registered file.
    pub fixed_files: bool,
    /// Use a kernel submission thread.
    pub sqpoll: bool,
    /// Kernel polling.
    pub iopoll: IoPoll,
}

/// How often a look at a DEFER_TASKRUN ring with commands in flight enters
/// the kernel even when the ring's TASKRUN flag is clear (see `reap`).
const ENTER_EVERY_NS: u64 = 50_000;

const KNOWN: &[&str] = &["direct", "size", "readonly", "taskrun", "fixedbufs", "fixedfiles", "sqpoll", "iopoll"];

impl UringConfig {
    /// Parses `uring:PATH[,direct=1][,size=N][,readonly=1][,taskrun=defer|coop|plain][,fixedbufs=1]
    /// [,fixedfiles=1][,sqpoll=0][,iopoll=auto|on|off]`.
    pub fn parse(path: &str, mut opts: Options, default_size: Option<u64>) -> Result<UringConfig> {
        let target = TargetConfig::parse(path, &mut opts, default_size)?;
        let taskrun_given = opts.take("taskrun");
        let taskrun = match taskrun_given.as_deref() {
            None | Some("defer") => TaskRun::Defer,
            Some("coop") => TaskRun::Coop,
            Some("plain") => TaskRun::Plain,
            Some(v) => return Err(opts.error(format!("taskrun={v}: expected defer, coop or plain"))),
        };
        let iopoll = match opts.take("iopoll").as_deref() {
            None | Some("auto") => IoPoll::Auto,
            Some("on" | "1") => IoPoll::On,
            Some("off" | "0") => IoPoll::Off,
            Some(v) => return Err(opts.error(format!("iopoll={v}: expected auto, on or off"))),
        };
        let fixed_buffers = opts.take_bool("fixedbufs")?.unwrap_or(true);
        let fixed_files = opts.take_bool("fixedfiles")?.unwrap_or(true);
        let sqpoll = opts.take_bool("sqpoll")?.unwrap_or(false);
        if sqpoll && taskrun_given.is_some() && taskrun != TaskRun::Plain {
            // The kernel refuses the task-work flags on an SQPOLL ring (EINVAL).
            return Err(opts.error(format!(
                "taskrun={} cannot go with sqpoll=1: the kernel takes no task-work flags on a ring its own \
                 thread submits for; leave taskrun out (plain is used) or say taskrun=plain",
                taskrun_given.as_deref().unwrap_or_default()
            )));
        }
        opts.finish(KNOWN)?;
        Ok(UringConfig {
            target,
            // An SQPOLL ring takes none of the task-work flags (EINVAL).
            taskrun: if sqpoll { TaskRun::Plain } else { taskrun },
            fixed_buffers,
            fixed_files,
            sqpoll,
            iopoll,
        })
    }
}

struct Shared {
    config: UringConfig,
    target: Target,
    iopoll: bool,
    iopoll_note: String,
    notes: Mutex<Vec<String>>,
    fixed_buffers_ok: AtomicBool,
    counters: Counters,
}

/// io_uring on a file or block device.
pub struct UringDevice {
    shared: Arc<Shared>,
    /// The AIO context on the same file that [`Device::shared_aio`] gave out.
    crowd: OnceLock<Arc<SharedAio>>,
}

impl UringDevice {
    /// Opens the target and probes kernel polling.
    pub fn open(config: &UringConfig) -> Result<UringDevice> {
        let target = Target::open(&config.target)?;
        let (iopoll, iopoll_note) = match config.iopoll {
            IoPoll::Off => (false, "IOPOLL off (iopoll=off)".to_string()),
            IoPoll::On | IoPoll::Auto => match probe_iopoll(&target) {
                Ok(()) => (true, "IOPOLL on (probed: polled read works)".to_string()),
                Err(why) if config.iopoll == IoPoll::On => {
                    return Err(Error::Unsupported {
                        what: format!("kernel polling (IOPOLL) on {}", target.path.display()),
                        why: format!(
                            "{why}; use iopoll=off or iopoll=auto to fall back to interrupt-driven completions"
                        ),
                    });
                }
                Err(why) => (false, format!("kernel IOPOLL unavailable: {why}")),
            },
        };
        Ok(UringDevice {
            shared: Arc::new(Shared {
                config: config.clone(),
                target,
                iopoll,
                iopoll_note,
                notes: Mutex::new(Vec::new()),
                fixed_buffers_ok: AtomicBool::new(true),
                counters: Counters::default(),
            }),
            crowd: OnceLock::new(),
        })
    }

    /// Why kernel polling is or is not used.
    pub fn iopoll_note(&self) -> &str {
        &self.shared.iopoll_note
    }
}

/// Tries one polled read of the first block; Err says why polling is not possible.
pub fn probe_iopoll(target: &Target) -> std::result::Result<(), String> {
    if !target.direct {
        return Err("IOPOLL needs O_DIRECT".into());
    }
    // The queue's own word first, so that no ring is made where it says no: a ring
    // torn down sends task work (TWA_SIGNAL) to every thread that used it, and a
    // program thread that used the probe's ring then had a blocking read or write it
    // was in cut short (`dd if=/dev/urandom bs=1M` on a mount: "partial read").
    // A polled read of a file's hole (or of a file system that is not on a block
    // device) never reaches a device and so "works"; later reads of written data then
    // fail with EOPNOTSUPP: a file is judged by its file system's device.
    device_polls(target)?;
    // Made where iopath's own descriptors are made: a number the program just freed
    // (its standard output, closed as it exits) taken by the probe was closed again
    // through the interposer as if the program had closed it.
    let mut ring: IoUring = crate::sys::own_numbers(|| IoUring::builder().setup_iopoll().build(8).map(out_of_the_way))
        .map_err(|e| format!("ring setup failed: {e}"))?;
    let len = target.alignment.max(512) as usize;
    let layout = std::alloc::Layout::from_size_align(len, 4096).map_err(|e| e.to_string())?;
    // SAFETY: the layout has a non-zero size.
    let buf = unsafe { std::alloc::alloc(layout) };
    if buf.is_null() {
        return Err("out of memory".into());
    }
    let sqe = opcode::Read::new(types::Fd(target.file.as_raw_fd()), buf, len as u32).offset(0).build().user_data(1);
    // SAFETY: `buf` stays allocated until the completion below has been reaped.
    let result = unsafe { ring.submission().push(&sqe) }
        .map_err(|_| "submission queue full".to_string())
        .and_then(|()| ring.submit().map_err(|e| format!("enter failed: {e}")))
        .and_then(|_| {
            // Polled completions appear only while someone polls: poll for up to a second.
            let give_up = crate::clock::now_ns() + 1_000_000_000;
            loop {
                if let Some(c) = ring.completion().next() {
                    return Ok(c.result());
                }
                if crate::clock::now_ns() > give_up {
                    return Err("no completion within 1 s of polling".to_string());
                }
                ring.submit_and_wait(1).map_err(|e| format!("enter failed: {e}"))?;
            }
        });
    if result.as_ref().is_err_and(|e| e.starts_with("no completion")) {
        // The kernel may still write into it: leak the block rather than free it under the read.
        return Err(result.unwrap_err());
    }
    // SAFETY: the read has completed (or never started); nothing refers to `buf` now.
    unsafe { std::alloc::dealloc(buf, layout) };
    match result? {
        r if r >= 0 => Ok(()),
        r if -r == libc::EOPNOTSUPP => {
            Err("polled read failed with EOPNOTSUPP: the device has no poll queues (NVMe poll_queues=0, loop, virtio)"
                .into())
        }
        r => Err(format!("polled read failed: {}", std::io::Error::from_raw_os_error(-r))),
    }
}

/// Whether the block device (or, for a regular file, the block device under
/// its file system) has poll queues, from its `queue/io_poll`.
fn device_polls(target: &Target) -> std::result::Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = target.file.metadata().map_err(|e| format!("cannot stat the target: {e}"))?;
    let (dev, whose) =
        if target.is_block_device { (meta.rdev(), "device") } else { (meta.dev(), "file system's device") };
    let Some((name, dir)) = super::target::block_queue_dir(libc::major(dev), libc::minor(dev)) else {
        return Err(if target.is_block_device {
            format!("the device {} has no queue in /sys to say whether it polls", target.path.display())
        } else {
            "the file's file system is not on a block device (tmpfs, overlayfs, ...), which has no poll queues".into()
        });
    };
    match std::fs::read_to_string(dir.join("queue/io_poll")).map(|s| s.trim().to_string()) {
        Ok(v) if v == "1" => Ok(()),
        _ => Err(format!(
            "the {whose} {name} has no poll queues (queue/io_poll is not 1: NVMe poll_queues=0, loop, virtio)"
        )),
    }
}

impl Device for UringDevice {
    fn describe(&self) -> String {
        let s = &self.shared;
        let mut text = format!(
            "uring:{} (taskrun={:?}, sqpoll={}, {}, fixed buffers {})",
            s.target.describe(),
            s.config.taskrun,
            s.config.sqpoll,
            s.iopoll_note,
            if s.config.fixed_buffers && s.fixed_buffers_ok.load(Ordering::Relaxed) { "on" } else { "off" },
        );
        for note in s.notes.lock().expect("notes poisoned").iter() {
            text.push_str("; ");
            text.push_str(note);
        }
        text
    }

    fn size(&self) -> u64 {
        self.shared.target.size
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            max_segments: MAX_SEGMENTS,
            max_segment_bytes: self.shared.target.max_segment_bytes(),
            alignment: self.shared.target.alignment,
            queue_depth: SQ_ENTRIES,
            kernel_poll: self.shared.iopoll,
            timed: false,
            stores_data: true,
            submits_at_commit: !self.shared.config.sqpoll,
        }
    }

    fn completion_source(&self, polled: bool) -> String {
        let s = &self.shared;
        match (polled, s.iopoll) {
            (true, true) => "kernel polling: IOPOLL ring, spun on with GETEVENTS enters".into(),
            (true, false) => format!(
                "the completion ring, spun on in user space; sleeping waits block in io_uring_enter, or make \
                 the kernel's own pread/pwrite for a blocking read or write ({})",
                s.iopoll_note
            ),
            (false, _) => "interrupts: a blocking io_uring_enter on an interrupt-driven ring; a blocking read or \
                           write is the kernel's own pread/pwrite (nothing gains from a ring when every request \
                           sleeps)"
                .into(),
        }
    }

    fn open_queue(&self, config: &QueueConfig) -> Result<Box<dyn Queue>> {
        Ok(Box::new(UringQueue::new(Arc::clone(&self.shared), config)?))
    }

    /// Linux AIO on the same open file: not with kernel polling (a polled
    /// io_uring ring is faster for whoever spins on it), not with SQPOLL
    /// (chosen by the user), and not without O_DIRECT (buffered AIO
    /// completes inside `io_submit`, so a shared context would batch nothing).
    fn shared_aio(&self) -> Result<Option<Arc<SharedAio>>> {
        let s = &self.shared;
        if !s.target.direct || s.iopoll || s.config.sqpoll {
            return Ok(None);
        }
        if let Some(crowd) = self.crowd.get() {
            return Ok(Some(Arc::clone(crowd)));
        }
        let made = Arc::new(SharedAio::on(s.target.duplicate()?)?);
        Ok(Some(Arc::clone(self.crowd.get_or_init(|| made))))
    }

    fn stats(&self) -> DeviceStats {
        let mut stats = self.shared.counters.snapshot();
        if let Some(crowd) = self.crowd.get() {
            stats.add(&crowd.stats());
        }
        stats
    }
}

struct Slot {
    command: Option<Command>,
    remaining: usize,
    /// iopath asked the kernel to cancel it ([`Queue::cancel`]).
    cancel_asked: bool,
    /// Times it was sent again after the kernel cancelled it on its own.
    resent: u8,
}

impl Slot {
    /// A slot holding `command` (or free), nothing of it outstanding yet.
    fn holding(command: Option<Command>) -> Slot {
        Slot { command, remaining: 0, cancel_asked: false, resent: 0 }
    }
}

/// Times a command the kernel cancelled on its own is sent again before its
/// `-ECANCELED` is handed back.
const MAX_RESENDS: u8 = 3;

struct UringQueue {
    shared: Arc<Shared>,
    ring: IoUring,
    fd: i32,
    fixed_file: bool,
    registered: Option<(usize, usize)>,
    slots: Vec<Slot>,
    free_slots: Vec<usize>,
    /// Slots whose last CQE has arrived, to be handed back.
    ready: Vec<usize>,
    in_flight: usize,
    /// Whether this ring is an IOPOLL ring.
    iopoll: bool,
    /// How this ring's completions are posted.
    taskrun: TaskRun,
    /// When a look last entered the kernel for deferred task work.
    last_enter_ns: u64,
    /// `user_data` of the SQEs pushed into the ring and not yet taken by the
    /// kernel, oldest first: the ones a failed enter leaves behind.
    unsent: VecDeque<u64>,
    /// Set when an enter failed for a reason other than a transient one: the
    /// ring takes no more submissions (a later enter could still consume the
    /// SQEs whose commands were handed back failed), only completions.
    broken: Option<i32>,
    /// Whether a watchdog timeout is in the ring and has not fired yet.
    watchdog_armed: bool,
    /// Its duration, on the heap so that its address is stable until the
    /// kernel has read it.
    watchdog_ts: Box<types::Timespec>,
}

fn os_err(context: &str, source: std::io::Error) -> Error {
    Error::Os { context: context.to_string(), source }
}

impl UringQueue {
    fn new(shared: Arc<Shared>, config: &QueueConfig) -> Result<UringQueue> {
        let mut builder = IoUring::builder();
        builder.setup_cqsize(SQ_ENTRIES * 2);
        // A ring shared by threads taking turns cannot be tied to one issuer: its
        // completions are posted by task work on whichever thread submitted, run at that
        // thread's next kernel entry (cooperative; a sleeping one is woken for it).
        let taskrun = match shared.config.taskrun {
            TaskRun::Defer if config.shared => TaskRun::Coop,
            taskrun => taskrun,
        };
        match taskrun {
            TaskRun::Defer => {
                // With TASKRUN_FLAG the kernel also marks deferred task work as pending
                // in the ring, so an empty look needs no enter while there is none.
                builder.setup_single_issuer().setup_defer_taskrun().setup_taskrun_flag();
            }
            TaskRun::Coop => {
                builder.setup_coop_taskrun().setup_taskrun_flag();
            }
            TaskRun::Plain => {}
        }
        if shared.config.sqpoll {
            builder.setup_sqpoll(1000);
        }
        // An interrupt-driven waiter gets an interrupt-driven ring even where the
        // device can be polled: on an IOPOLL ring a blocking enter spins in the kernel.
        let iopoll = shared.iopoll && config.polled;
        if iopoll {
            builder.setup_iopoll();
        }
        let ring = crate::sys::own_numbers(|| builder.build(SQ_ENTRIES).map(out_of_the_way))
            .map_err(|e| os_err("io_uring setup", e))?;
        let fd = shared.target.file.as_raw_fd();
        let fixed_file = shared.config.fixed_files && ring.submitter().register_files(&[fd]).is_ok();
        let mut registered = None;
        if shared.config.fixed_buffers
            && let Some((ptr, len)) = config.registered
        {
            let iov = libc::iovec { iov_base: ptr.cast(), iov_len: len };
            // SAFETY: the engine keeps the region alive for as long as any of its queues.
            match unsafe { ring.submitter().register_buffers(&[iov]) } {
                Ok(()) => registered = Some((ptr as usize, len)),
                Err(e) => {
                    if shared.fixed_buffers_ok.swap(false, Ordering::Relaxed) {
                        shared.notes.lock().expect("notes poisoned").push(format!(
                            "buffer registration refused ({e}); using plain reads/writes (raise `ulimit -l` to allow it)"
                        ));
                    }
                }
            }
        }
        let depth = config.depth.max(1) as usize;
        Ok(UringQueue {
            shared,
            ring,
            fd,
            fixed_file,
            registered,
            taskrun,
            last_enter_ns: 0,
            slots: (0..depth).map(|_| Slot::holding(None)).collect(),
            free_slots: (0..depth).rev().collect(),
            ready: Vec::with_capacity(depth),
            in_flight: 0,
            iopoll,
            unsent: VecDeque::with_capacity(SQ_ENTRIES as usize),
            broken: None,
            watchdog_armed: false,
            watchdog_ts: Box::new(types::Timespec::new().nsec(WATCHDOG_NS as u32)),
        })
    }

    fn buffer_index(&self, buf: *mut u8, len: u32) -> Option<u16> {
        let (start, size) = self.registered?;
        let addr = buf as usize;
        (addr >= start && addr + len as usize <= start + size).then_some(0)
    }

    fn entry(&self, op: Op, offset: u64, buf: *mut u8, len: u32) -> squeue::Entry {
        self.entry_with(op, offset, buf, len, 0)
    }

    /// An SQE for one segment; `rw_flags` (`RWF_*`) go on reads and writes.
    fn entry_with(&self, op: Op, offset: u64, buf: *mut u8, len: u32, rw_flags: i32) -> squeue::Entry {
        let fixed = self.buffer_index(buf, len);
        macro_rules! build {
            ($fd:expr) => {
                match (op, fixed) {
                    (Op::Read, Some(i)) => {
                        opcode::ReadFixed::new($fd, buf, len, i).offset(offset).rw_flags(rw_flags).build()
                    }
                    (Op::Read, None) => opcode::Read::new($fd, buf, len).offset(offset).rw_flags(rw_flags).build(),
                    (Op::Write, Some(i)) => {
                        opcode::WriteFixed::new($fd, buf, len, i).offset(offset).rw_flags(rw_flags).build()
                    }
                    (Op::Write, None) => opcode::Write::new($fd, buf, len).offset(offset).rw_flags(rw_flags).build(),
                    (Op::Flush, _) => opcode::Fsync::new($fd).flags(types::FsyncFlags::DATASYNC).build(),
                    (Op::Trim, _) => opcode::Fallocate::new($fd, len as u64)
                        .offset(offset)
                        .mode(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE)
                        .build(),
                }
            };
        }
        if self.fixed_file { build!(types::Fixed(0)) } else { build!(types::Fd(self.fd)) }
    }

    /// Pushes one SQE, making room by submitting what is queued if the ring is full.
    fn push(&mut self, entry: &squeue::Entry) -> std::io::Result<()> {
        loop {
            // SAFETY: the entry's buffer belongs to a command held in `slots` until its CQE.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                self.unsent.push_back(entry.get_user_data());
                return Ok(());
            }
            self.enter_submit()?;
        }
    }

    /// Pushes a chain of linked SQEs in one go, after making room for all of
    /// them: an enter between two of them would end the chain there (the
    /// kernel treats a link flag on the last SQE it is given as the chain's
    /// end), and an SQPOLL thread could take the first before the rest.
    fn push_chain(&mut self, entries: &[squeue::Entry]) -> std::io::Result<()> {
        loop {
            // SAFETY: the entries' buffers belong to a command held in `slots` until its CQEs.
            if unsafe { self.ring.submission().push_multiple(entries) }.is_ok() {
                self.unsent.extend(entries.iter().map(|e| e.get_user_data()));
                return Ok(());
            }
            if self.ring.submission().is_empty() {
                // Longer than the whole ring: never the case for one command (MAX_SEGMENTS + 1).
                return Err(std::io::Error::from_raw_os_error(libc::E2BIG));
            }
            self.enter_submit()?;
        }
    }

    /// After an enter that submitted: the kernel took every SQE but those
    /// still in the ring (SQPOLL takes them on its own time; they are its,
    /// not ours, from here on).
    fn note_taken(&mut self) {
        let left = if self.shared.config.sqpoll { 0 } else { self.ring.submission().len() };
        while self.unsent.len() > left {
            self.unsent.pop_front();
        }
    }

    fn enter_submit(&mut self) -> std::io::Result<()> {
        if let Some(errno) = self.broken {
            return Err(std::io::Error::from_raw_os_error(errno));
        }
        loop {
            match self.ring.submit() {
                Ok(_) => {
                    self.note_taken();
                    return Ok(());
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {
                    // The kernel is out of room for completions: drain them, then retry.
                    self.drain_cq();
                }
                Err(e) => {
                    self.break_ring(e.raw_os_error().unwrap_or(libc::EIO));
                    return Err(e);
                }
            }
        }
    }

    /// After an enter failed for good: the SQEs the kernel did not take never
    /// will (nothing enters with SQEs to submit again, and without SQPOLL only
    /// such an enter consumes them), so their segments fail and their buffers
    /// go back to the caller. Commands the kernel took complete as usual.
    fn break_ring(&mut self, errno: i32) {
        self.broken = Some(errno);
        if self.shared.config.sqpoll {
            // The kernel thread may still take them: their buffers stay the kernel's.
            return;
        }
        for user_data in std::mem::take(&mut self.unsent) {
            match user_data {
                CANCEL_USER_DATA => {}
                WATCHDOG_USER_DATA => self.watchdog_armed = false,
                _ => self.complete_sqe(user_data, -errno),
            }
        }
    }

    /// Whether a wait of `timeout_ns` can sleep untimed under the watchdog;
    /// pushes the watchdog's SQE if none is armed, for the waiting enter to
    /// send with whatever else is queued. Only rings with deferred task work
    /// qualify: on any other the watchdog, firing up to 100 ms after the wait
    /// ended, sends task work to the thread that armed it, which cuts short a
    /// blocking read or write it is in by then (a program's thread in the
    /// interposer: `os.read` of /dev/urandom gave part of what it asked).
    fn arm_watchdog(&mut self, timeout_ns: u64) -> bool {
        if timeout_ns < WATCHDOG_NS
            || self.iopoll
            || self.shared.config.sqpoll
            || self.taskrun != TaskRun::Defer
            || self.broken.is_some()
        {
            return false;
        }
        if !self.watchdog_armed {
            let entry = opcode::Timeout::new(&*self.watchdog_ts as *const types::Timespec)
                .build()
                .user_data(WATCHDOG_USER_DATA);
            // SAFETY: the timespec is heap-allocated and owned by the queue, which
            // outlives the ring's use of it (the ring is dropped with the queue).
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                return false;
            }
            // Tracked like any SQE, so a partial submission counts it right.
            self.unsent.push_back(WATCHDOG_USER_DATA);
            self.watchdog_armed = true;
        }
        true
    }

    /// Sends the ordered write in `slot` as a flush linked to its writes, each
    /// `RWF_DSYNC` (a block device gives them forced unit access, or a write and
    /// a flush where it has none): the kernel issues the writes when the flush
    /// is done, with no trip back to user space between them.
    fn submit_ordered(&mut self, slot: usize) {
        let base = (slot as u64) << SEG_BITS;
        let segments = &self.slots[slot].command.as_ref().expect("just stored").segments;
        let mut chain = Vec::with_capacity(segments.len() + 1);
        chain.push(
            self.entry(Op::Flush, 0, std::ptr::null_mut(), 0).flags(squeue::Flags::IO_LINK).user_data(base | FLUSH_SEG),
        );
        for (i, seg) in segments.iter().enumerate() {
            let entry = self.entry_with(Op::Write, seg.offset, seg.buf, seg.len, libc::RWF_DSYNC);
            let entry = if i + 1 < segments.len() { entry.flags(squeue::Flags::IO_LINK) } else { entry };
            chain.push(entry.user_data(base | i as u64));
        }
        if let Err(err) = self.push_chain(&chain) {
            let errno = err.raw_os_error().unwrap_or(libc::EIO);
            for entry in &chain {
                self.complete_sqe(entry.get_user_data(), -errno);
            }
        }
    }

    /// Records the result of one SQE; a command is ready when its last SQE is.
    fn complete_sqe(&mut self, user_data: u64, result: i32) {
        complete_sqe(&mut self.slots, &mut self.ready, user_data, result);
    }

    /// Moves CQEs into their commands; returns how many CQEs there were.
    fn drain_cq(&mut self) -> usize {
        let UringQueue { ring, slots, ready, watchdog_armed, .. } = self;
        let mut seen = 0;
        for cqe in ring.completion() {
            seen += 1;
            match cqe.user_data() {
                CANCEL_USER_DATA => {}
                WATCHDOG_USER_DATA => *watchdog_armed = false,
                user_data => complete_sqe(slots, ready, user_data, cqe.result()),
            }
        }
        seen
    }

    /// Pushes the SQEs of the command in `slot` (its results cleared) and
    /// counts them as outstanding.
    fn send_slot(&mut self, slot: usize) {
        let command = self.slots[slot].command.as_mut().expect("a command to send");
        let (op, durability) = (command.op, command.durability);
        let count = if op == Op::Flush { 1 } else { command.segments.len() };
        let rw_flags = match (op, durability) {
            (Op::Write, Durability::Fua) => libc::RWF_DSYNC,
            _ => 0,
        };
        if durability == Durability::Ordered && op == Op::Write {
            self.slots[slot].remaining = count + 1;
            self.submit_ordered(slot);
            return;
        }
        self.slots[slot].remaining = count;
        for i in 0..count {
            let user_data = ((slot as u64) << SEG_BITS) | i as u64;
            let entry = match op {
                Op::Flush => self.entry(Op::Flush, 0, std::ptr::null_mut(), 0),
                _ => {
                    let seg = self.slots[slot].command.as_ref().expect("just stored").segments[i];
                    self.entry_with(op, seg.offset, seg.buf, seg.len, rw_flags)
                }
            };
            if let Err(err) = self.push(&entry.user_data(user_data)) {
                // The rest of this command never reaches the kernel: fail those segments.
                let errno = err.raw_os_error().unwrap_or(libc::EIO);
                for rest in i..count {
                    self.complete_sqe(((slot as u64) << SEG_BITS) | rest as u64, -errno);
                }
                break;
            }
        }
    }

    /// Whether the finished command in `slot` was cancelled by the kernel on
    /// its own, not at iopath's request: io_uring cancels the requests a
    /// thread sent that are still queued to its workers (a flush, a
    /// `RWF_DSYNC` write) when that thread exits, and on a ring that threads
    /// take turns on (`combine`'s) the sender may have left long before the
    /// waiter. Reads and writes of the same bytes can simply be sent again.
    fn cancelled_by_the_kernel(&self, slot: usize) -> bool {
        let s = &self.slots[slot];
        let command = s.command.as_ref().expect("ready slot holds a command");
        !s.cancel_asked
            && s.resent < MAX_RESENDS
            && (command.result == -libc::ECANCELED || command.segments.iter().any(|g| g.result == -libc::ECANCELED))
    }

    fn collect_finished(&mut self, out: &mut Vec<Command>) -> usize {
        let mut n = 0;
        let mut resent = false;
        for slot in std::mem::take(&mut self.ready) {
            if self.broken.is_none() && self.cancelled_by_the_kernel(slot) {
                let command = self.slots[slot].command.as_mut().expect("ready slot holds a command");
                command.result = 0;
                command.segments.iter_mut().for_each(|g| g.result = 0);
                self.slots[slot].resent += 1;
                self.send_slot(slot);
                resent = true;
                continue;
            }
            out.push(self.slots[slot].command.take().expect("ready slot holds a command"));
            self.free_slots.push(slot);
            n += 1;
        }
        if resent {
            // If the ring broke, what it did not take was handed back failed
            // (`break_ring`) and is in `ready` for the next look.
            let _ = self.enter_submit();
        }
        self.in_flight -= n;
        n
    }
}

/// Records the result of one SQE in its command; a command is ready (its slot
/// pushed to `ready`) when its last SQE is.
fn complete_sqe(slots: &mut [Slot], ready: &mut Vec<usize>, user_data: u64, result: i32) {
    let slot = (user_data >> SEG_BITS) as usize;
    let seg = (user_data & ((1 << SEG_BITS) - 1)) as usize;
    let s = &mut slots[slot];
    let command = s.command.as_mut().expect("completion for a free slot");
    if command.op == Op::Flush || seg as u64 == FLUSH_SEG {
        command.result = result.min(0);
    } else if result == -libc::ECANCELED && command.result < 0 {
        // An `Ordered` write's data after its flush failed: the flush's error is the cause.
        command.segments[seg].result = command.result;
    } else {
        command.segments[seg].result = result;
    }
    debug_assert!(s.remaining > 0, "a completion for a finished command");
    s.remaining -= 1;
    if s.remaining == 0 {
        ready.push(slot);
    }
}

impl Queue for UringQueue {
    unsafe fn submit(&mut self, mut command: Command) {
        let free = self.free_slots.pop();
        let (Some(slot), None) = (free, self.broken) else {
            // More in flight than the queue was opened for (a caller bug), or a ring that
            // takes no more submissions: never lose the command, hand it back failed.
            debug_assert!(free.is_some(), "uring queue over its depth");
            command.fail_all(self.broken.unwrap_or(libc::EBUSY));
            let slot = free.unwrap_or_else(|| {
                self.slots.push(Slot::holding(None));
                self.slots.len() - 1
            });
            self.slots[slot] = Slot::holding(Some(command));
            self.ready.push(slot);
            self.in_flight += 1;
            return;
        };
        self.shared.counters.record(&command);
        self.slots[slot] = Slot::holding(Some(command));
        self.in_flight += 1;
        self.send_slot(slot);
    }

    fn commit(&mut self) -> Result<()> {
        if self.ring.submission().is_empty() {
            return Ok(());
        }
        self.enter_submit().map_err(|e| os_err("io_uring_enter (submit)", e))
    }

    fn reap(&mut self, out: &mut Vec<Command>) -> Result<usize> {
        if self.in_flight == 0 {
            return Ok(0);
        }
        if self.sends_when_waiting() && !self.ring.submission().is_empty() {
            // A caller left its commit to a wait that did not come (its policy
            // looked first): send now. A failure hands the commands back failed.
            let _ = self.commit();
        }
        if self.ring.completion().is_empty() && self.ready.is_empty() {
            // Deferred task work (and IOPOLL) posts completions only inside an enter;
            // cooperative task work is run at the submitter's next kernel entry. For
            // both, the ring's TASKRUN flag says whether any is pending (liburing's
            // peek does the same), so an empty look with none pending costs no
            // system call: a yielding waiter in MariaDB made ~250K enters a second,
            // most of them finding nothing.
            //
            // With DEFER_TASKRUN the flag is not always raised: the continuation of a
            // linked chain (the flush before an ordered write, then the write) was seen
            // to sit in the task-work list with the flag clear (kernel 6.18), and a
            // polling or yielding waiter looked at an empty ring for seconds (db_bench
            // fillsync on a mount: 60 ms per fsync, 55 us with taskrun=coop). So while
            // commands are in flight a look enters at least every ENTER_EVERY_NS anyway.
            let now = crate::clock::now_ns();
            let needs_enter = match self.taskrun {
                TaskRun::Defer => {
                    self.ring.submission().taskrun() || now.saturating_sub(self.last_enter_ns) >= ENTER_EVERY_NS
                }
                TaskRun::Coop => self.ring.submission().taskrun(),
                TaskRun::Plain => false,
            } || self.iopoll;
            if needs_enter {
                self.last_enter_ns = now;
                // SAFETY: a plain GETEVENTS enter with no argument; it submits nothing.
                let r = unsafe {
                    self.ring.submitter().enter::<libc::sigset_t>(0, 0, 1 /* IORING_ENTER_GETEVENTS */, None)
                };
                if let Err(e) = r
                    && e.raw_os_error() != Some(libc::EINTR)
                {
                    return Err(os_err("io_uring_enter (poll)", e));
                }
            }
        }
        self.drain_cq();
        Ok(self.collect_finished(out))
    }

    fn wait(&mut self, out: &mut Vec<Command>, timeout_ns: u64) -> Result<usize> {
        if self.in_flight == 0 {
            return Ok(0);
        }
        // What the completion ring already holds needs no system call; what
        // is still deferred task work the waiting enter below runs before it
        // would sleep (so no separate GETEVENTS look first: fio's pattern).
        self.drain_cq();
        let n = self.collect_finished(out);
        if n > 0 {
            return Ok(n);
        }
        // Sends what a caller left uncommitted for this wait (`sends_when_waiting`;
        // a broken ring's leftovers never), and a new watchdog: the kernel submits,
        // then sleeps.
        let watched = self.arm_watchdog(timeout_ns);
        let to_submit = if self.sends_when_waiting() { self.ring.submission().len() as u32 } else { 0 };
        let r = if watched {
            // Sleeps untimed until a completion, the watchdog's included (a timed
            // sleep arms a kernel timer per wait: 8x the hrtimer starts, measured).
            // SAFETY: a GETEVENTS enter with no argument; the SQEs' buffers belong to
            // commands held in `slots` until their CQEs, and the watchdog's timespec
            // lives on the heap as long as the queue.
            unsafe {
                self.ring.submitter().enter::<libc::sigset_t>(to_submit, 1, 1 /* GETEVENTS */, None)
            }
        } else {
            let ts = types::Timespec::new().sec(timeout_ns / 1_000_000_000).nsec((timeout_ns % 1_000_000_000) as u32);
            let args = types::SubmitArgs::new().timespec(&ts);
            // SAFETY: GETEVENTS with a valid extended argument that outlives the call;
            // the SQEs' buffers belong to commands held in `slots` until their CQEs.
            unsafe {
                self.ring.submitter().enter(to_submit, 1, 1 /* GETEVENTS */ | 8 /* EXT_ARG */, Some(&args))
            }
        };
        if to_submit > 0 {
            self.note_taken();
            if !self.ring.submission().is_empty() {
                // The kernel took only some (its completion ring full) or none (an
                // error), and did not wait: the plain submit retries, or fails what it
                // cannot send. The caller waits again.
                let _ = self.enter_submit();
                self.drain_cq();
                return Ok(self.collect_finished(out));
            }
        }
        match r {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
            Err(e) => return Err(os_err("io_uring_enter (wait)", e)),
        }
        self.drain_cq();
        Ok(self.collect_finished(out))
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    unsafe fn run_blocking(&mut self, command: &mut Command) -> bool {
        // Reads, writes (a durable one with RWF_DSYNC, an ordered one after a
        // datasync) and flushes (a datasync); trims go through the ring.
        if command.op == Op::Trim || self.broken.is_some() {
            return false;
        }
        self.shared.counters.record(command);
        // SAFETY: forwarded from the caller's contract.
        unsafe { super::psync::run_command(&self.shared.target.file, command) };
        true
    }

    fn sends_when_waiting(&self) -> bool {
        // An SQPOLL thread takes SQEs on its own; a broken ring sends nothing more.
        !self.shared.config.sqpoll && self.broken.is_none()
    }

    fn cancel(&mut self, which: Cancel) -> Result<()> {
        if self.broken.is_some() {
            return Ok(());
        }
        let (mut targets, mut cancelled) = (Vec::new(), Vec::new());
        for (slot, s) in self.slots.iter().enumerate() {
            let Some(command) = &s.command else { continue };
            if s.remaining == 0 || (which != Cancel::All && which != Cancel::Tag(command.tag)) {
                continue;
            }
            let sqes = if command.op == Op::Flush { 1 } else { command.segments.len() };
            cancelled.push(slot);
            targets.extend((0..sqes).map(|i| ((slot as u64) << SEG_BITS) | i as u64));
            if command.durability == Durability::Ordered && command.op == Op::Write {
                targets.push(((slot as u64) << SEG_BITS) | FLUSH_SEG);
            }
        }
        for slot in cancelled {
            self.slots[slot].cancel_asked = true;
        }
        for user_data in targets {
            // A segment that already finished answers ENOENT; one the kernel cannot stop
            // (block I/O under way) answers EALREADY and completes on its own time.
            let entry = opcode::AsyncCancel::new(user_data).build().user_data(CANCEL_USER_DATA);
            self.push(&entry).map_err(|e| os_err("io_uring cancel", e))?;
        }
        self.commit()
    }
}

impl Drop for UringQueue {
    fn drop(&mut self) {
        // Buffers of commands still in the kernel must not be freed under it: wait them
        // out, however long it takes (asking the kernel to cancel them after a second).
        let mut sink = Vec::new();
        let cancel_at = crate::clock::now_ns() + 1_000_000_000;
        let mut cancelled = false;
        while self.in_flight > 0 {
            if !cancelled && crate::clock::now_ns() >= cancel_at {
                cancelled = true;
                let _ = self.cancel(Cancel::All);
            }
            if self.wait(&mut sink, 10_000_000).is_err() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            sink.clear();
        }
    }
}
/// `ring` on a descriptor number from [`crate::sys::HIGH_FDS_FROM`] up:
/// io_uring_setup takes the lowest free number, which a program counts on
/// being its own (with the interposer, a shell's `exec 3>file` replaced a
/// mount's ring on 3, and every later command failed with EBADF). The
/// descriptor is copied up and the ring mapped again from the copy; the
/// low number and the first mapping go with `ring`. Called inside
/// [`crate::sys::own_numbers`] with the setup.
fn out_of_the_way(ring: IoUring) -> IoUring {
    if ring.as_raw_fd() >= crate::sys::HIGH_FDS_FROM {
        return ring;
    }
    let Some(high) = crate::sys::copy_high(ring.as_raw_fd(), 0) else { return ring };
    // SAFETY: `high` is a descriptor of this same ring, owned from here on,
    // and the parameters are the ones the kernel filled in when it was set up.
    match unsafe { IoUring::from_fd(high, ring.params().clone()) } {
        Ok(moved) => moved,
        Err(_) => ring, // (from_fd closed `high`)
    }
}
