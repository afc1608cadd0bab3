//! The timing model of the emulated SSD, as a pure function of time.
//!
//! A device has `slots` commands in service at once and `channels` data units
//! that 4 KiB stripes of the address space map onto round-robin. A command
//! waits for a free slot, spends a fixed per-command time (`cmd`: protocol,
//! controller, set-up), then moves each of its bytes on the channel that owns
//! them at a per-4-KiB transfer time (`xfer`); channels work in parallel and
//! each serves one transfer at a time. The command completes when its last
//! channel is done. Reads and writes have their own figures.
//!
//! The model takes the current time as an argument and returns a deadline, so
//! it is tested with made-up clocks and never sleeps.

use super::Op;

/// Bytes per stripe unit and per transfer-time quantum.
pub const STRIPE_BYTES: u64 = 4096;

/// Timing of one direction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DirectionTiming {
    /// Fixed time per command in nanoseconds.
    pub cmd_ns: f64,
    /// Transfer time per 4 KiB on one channel in nanoseconds.
    pub xfer_ns: f64,
}

/// Everything the model needs to know about a device.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelParams {
    /// Commands in service at once.
    pub slots: u32,
    /// Independent data channels, striped by 4 KiB offset.
    pub channels: u32,
    /// Read timing.
    pub read: DirectionTiming,
    /// Write timing.
    pub write: DirectionTiming,
    /// Time a flush takes once earlier commands have finished.
    pub flush_ns: f64,
}

/// A named set of parameters with the source of its figures.
#[derive(Debug, Clone)]
pub struct Preset {
    /// Name used in device specs (`emu:NAME`).
    pub name: &'static str,
    /// The parameters.
    pub params: ModelParams,
    /// Where the figures come from.
    pub source: &'static str,
}

const fn timing(cmd_ns: f64, xfer_ns: f64) -> DirectionTiming {
    DirectionTiming { cmd_ns, xfer_ns }
}

/// The built-in presets.
pub fn presets() -> Vec<Preset> {
    vec![
        Preset {
            name: "dram-ssd",
            // Seed 000 (Yu 2012, §6.2, Table 6): TailwindStorage Extreme 3804 DRAM-SSD,
            // 7 µs hardware latency per 4 KiB page, 177 µs per 128 KiB request, ~700 MB/s.
            // 1.52 µs + 32 x 5.48 µs = 176.9 µs; peak 4096 B / 5.48 µs = 747 MB/s.
            params: ModelParams {
                slots: 1,
                channels: 1,
                read: timing(1520.0, 5480.0),
                write: timing(1520.0, 5480.0),
                flush_ns: 0.0,
            },
            source: "seed 000 (Yu 2012) §6.2: 7 us per 4 KiB, 177 us per 128 KiB, ~700 MB/s",
        },
        Preset {
            name: "optane",
            // Intel Optane SSD DC P4800X data sheet: ~10 us 4 KiB read at QD1, 550K random
            // read IOPS, 2.4 GB/s sequential read; 500K random write IOPS, 2.0 GB/s write.
            // 4 channels x 4 KiB / 6.8 us = 2.41 GB/s (588K IOPS); 3.2 + 6.8 = 10 us.
            params: ModelParams {
                slots: 6,
                channels: 4,
                read: timing(3200.0, 6800.0),
                write: timing(2000.0, 8200.0),
                flush_ns: 0.0,
            },
            source: "Intel Optane DC P4800X data sheet: ~10 us QD1 read, 550K IOPS, 2.4 GB/s",
        },
        Preset {
            name: "zssd",
            // Samsung SZ985 Z-SSD data sheet: 12-15 us read latency, 750K random read IOPS,
            // 3.2 GB/s sequential read, 3.0 GB/s sequential write, ~16 us write latency.
            // 8 channels x 4 KiB / 10.24 us = 3.2 GB/s (781K IOPS); 2.76 + 10.24 = 13 us.
            params: ModelParams {
                slots: 12,
                channels: 8,
                read: timing(2760.0, 10240.0),
                write: timing(5100.0, 10900.0),
                flush_ns: 0.0,
            },
            source: "Samsung SZ985 Z-SSD data sheet: 12-15 us read, 750K IOPS, 3.2 GB/s",
        },
        Preset {
            name: "nand",
            // A PCIe 4 TLC data-centre NVMe SSD (e.g. Samsung PM1733 class): ~80 us random
            // read, ~20 us write into the DRAM write buffer, ~1M random read IOPS, ~7 GB/s.
            // 80 slots / 80 us = 1M IOPS; 16 channels x 4 KiB / 9.36 us = 7.0 GB/s.
            params: ModelParams {
                slots: 80,
                channels: 16,
                read: timing(70640.0, 9360.0),
                write: timing(10640.0, 9360.0),
                flush_ns: 0.0,
            },
            source: "PCIe 4 TLC NVMe data sheets (PM1733 class): ~80 us read, ~20 us write, ~1M IOPS",
        },
        Preset {
            name: "null",
            // No device time at all: what is left is the pure software cost of a path,
            // including the data copy into and out of the emulated store.
            params: ModelParams {
                slots: 1,
                channels: 1,
                read: timing(0.0, 0.0),
                write: timing(0.0, 0.0),
                flush_ns: 0.0,
            },
            source: "zero device time (measures software cost; data is still copied)",
        },
    ]
}

/// When a scheduled command starts and completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// When a slot took it.
    pub start_ns: u64,
    /// When it completes.
    pub deadline_ns: u64,
}

/// The mutable state of the model: when each slot and channel is next free.
#[derive(Debug, Clone)]
pub struct Model {
    params: ModelParams,
    slot_free_ns: Vec<u64>,
    channel_free_ns: Vec<u64>,
    channel_work_ns: Vec<f64>,
    busy_until_ns: u64,
    busy_ns: u64,
}

impl Model {
    /// A device that is idle.
    pub fn new(params: ModelParams) -> Model {
        assert!(params.slots >= 1, "a device needs at least one slot");
        assert!(params.channels >= 1, "a device needs at least one channel");
        Model {
            slot_free_ns: vec![0; params.slots as usize],
            channel_free_ns: vec![0; params.channels as usize],
            channel_work_ns: vec![0.0; params.channels as usize],
            busy_until_ns: 0,
            busy_ns: 0,
            params,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &ModelParams {
        &self.params
    }

    /// Nanoseconds so far with at least one command in service.
    pub fn busy_ns(&self) -> u64 {
        self.busy_ns
    }

    /// Schedules a command arriving at `now_ns` that moves the given
    /// `(offset, len)` ranges, and returns when it starts and completes.
    pub fn schedule(&mut self, now_ns: u64, op: Op, ranges: impl Iterator<Item = (u64, u64)>) -> Schedule {
        self.schedule_command(now_ns, op, super::Durability::Cached, ranges)
    }

    /// Schedules a write that is not [`Durability::Cached`](super::Durability):
    /// an `Ordered` one starts once everything accepted before it has finished
    /// (its flush); both move their data as a write does and then pay the flush
    /// time (their FUA).
    pub fn schedule_write(
        &mut self,
        now_ns: u64,
        durability: super::Durability,
        ranges: impl Iterator<Item = (u64, u64)>,
    ) -> Schedule {
        self.schedule_command(now_ns, Op::Write, durability, ranges)
    }

    fn schedule_command(
        &mut self,
        now_ns: u64,
        op: Op,
        durability: super::Durability,
        ranges: impl Iterator<Item = (u64, u64)>,
    ) -> Schedule {
        let (slot, slot_free) =
            self.slot_free_ns.iter().copied().enumerate().min_by_key(|&(_, t)| t).expect("at least one slot");
        let mut start_ns = now_ns.max(slot_free);
        if durability == super::Durability::Ordered {
            start_ns = start_ns.max(self.slot_free_ns.iter().copied().max().unwrap_or(0));
        }
        let deadline_ns = match op {
            Op::Flush => {
                // A flush completes once everything accepted before it has finished.
                let drained = self.slot_free_ns.iter().copied().max().unwrap_or(0).max(start_ns);
                drained + self.params.flush_ns.round() as u64
            }
            Op::Read | Op::Write => {
                let timing = if op == Op::Read { self.params.read } else { self.params.write };
                let done = self.data_deadline(start_ns, timing, ranges);
                if durability == super::Durability::Cached { done } else { done + self.params.flush_ns.round() as u64 }
            }
            // A trim changes the mapping, not the media: a write command's fixed cost.
            Op::Trim => start_ns + self.params.write.cmd_ns.round() as u64,
        };
        self.slot_free_ns[slot] = deadline_ns;
        if deadline_ns > self.busy_until_ns {
            self.busy_ns += deadline_ns - start_ns.max(self.busy_until_ns);
            self.busy_until_ns = deadline_ns;
        }
        debug_assert!(deadline_ns >= start_ns);
        debug_assert!(start_ns >= now_ns);
        Schedule { start_ns, deadline_ns }
    }

    fn data_deadline(
        &mut self,
        start_ns: u64,
        timing: DirectionTiming,
        ranges: impl Iterator<Item = (u64, u64)>,
    ) -> u64 {
        let channels = self.params.channels as u64;
        self.channel_work_ns.iter_mut().for_each(|w| *w = 0.0);
        for (offset, len) in ranges {
            let mut pos = offset;
            let end = offset + len;
            while pos < end {
                let unit = pos / STRIPE_BYTES;
                let piece_end = ((unit + 1) * STRIPE_BYTES).min(end);
                let channel = (unit % channels) as usize;
                self.channel_work_ns[channel] += (piece_end - pos) as f64 * timing.xfer_ns / STRIPE_BYTES as f64;
                pos = piece_end;
            }
        }
        let transfer_start = start_ns + timing.cmd_ns.round() as u64;
        let mut deadline = transfer_start;
        for (free, work) in self.channel_free_ns.iter_mut().zip(&self.channel_work_ns) {
            if *work > 0.0 {
                let done = transfer_start.max(*free) + work.round() as u64;
                *free = done;
                deadline = deadline.max(done);
            }
        }
        deadline
    }

    /// Sustained bandwidth in bytes/s for a mix with `read_fraction` reads,
    /// with commands so large that per-command time vanishes. `None` for a
    /// device with no transfer time.
    pub fn peak_bandwidth(&self, read_fraction: f64) -> Option<f64> {
        let rf = read_fraction.clamp(0.0, 1.0);
        let per_byte_ns = |t: DirectionTiming| t.xfer_ns / (STRIPE_BYTES as f64 * self.params.channels as f64);
        let ns_per_byte = rf * per_byte_ns(self.params.read) + (1.0 - rf) * per_byte_ns(self.params.write);
        (ns_per_byte > 0.0).then(|| 1e9 / ns_per_byte)
    }
}

/// Looks up a preset by name.
pub fn preset(name: &str) -> Option<Preset> {
    presets().into_iter().find(|p| p.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dram() -> Model {
        Model::new(preset("dram-ssd").unwrap().params)
    }

    #[test]
    fn one_4k_read_on_dram_ssd_takes_7us() {
        let s = dram().schedule(1000, Op::Read, [(0, 4096)].into_iter());
        assert_eq!(s.start_ns, 1000);
        assert_eq!(s.deadline_ns - s.start_ns, 7000);
    }

    #[test]
    fn one_128k_read_on_dram_ssd_takes_177us() {
        let s = dram().schedule(0, Op::Read, [(0, 128 << 10)].into_iter());
        // 1.52 + 32 x 5.48 = 176.88 us, the seed's 177 us.
        assert_eq!(s.deadline_ns, 176_880);
    }

    #[test]
    fn back_to_back_commands_queue_behind_each_other() {
        let mut m = dram();
        let a = m.schedule(0, Op::Write, [(0, 4096)].into_iter());
        let b = m.schedule(10, Op::Write, [(8192, 4096)].into_iter());
        let c = m.schedule(20, Op::Read, [(4096, 4096)].into_iter());
        assert_eq!(a.deadline_ns, 7000);
        assert_eq!(b.start_ns, 7000);
        assert_eq!(b.deadline_ns, 14_000);
        assert_eq!(c.deadline_ns, 21_000);
        assert_eq!(m.busy_ns(), 21_000);
    }

    #[test]
    fn a_32_segment_vector_command_pays_one_command_time() {
        let ranges = (0..32u64).map(|i| (i * 1_000_000 * 4096 % (1 << 30), 4096));
        let s = dram().schedule(0, Op::Read, ranges);
        assert_eq!(s.deadline_ns, 1520 + 32 * 5480);
    }

    #[test]
    fn idle_gaps_do_not_count_as_busy() {
        let mut m = dram();
        m.schedule(0, Op::Read, [(0, 4096)].into_iter());
        m.schedule(100_000, Op::Read, [(0, 4096)].into_iter());
        assert_eq!(m.busy_ns(), 14_000);
    }

    #[test]
    fn channels_work_in_parallel_and_slots_overlap() {
        let params = ModelParams {
            slots: 2,
            channels: 2,
            read: timing(1000.0, 4000.0),
            write: timing(1000.0, 4000.0),
            flush_ns: 0.0,
        };
        let mut m = Model::new(params);
        // 8 KiB spans both channels: 1 us + 4 us.
        assert_eq!(m.schedule(0, Op::Read, [(0, 8192)].into_iter()).deadline_ns, 5000);
        // Second slot is free, but both channels are busy until 5 us.
        assert_eq!(m.schedule(0, Op::Read, [(0, 4096)].into_iter()).deadline_ns, 9000);
    }

    #[test]
    fn flush_waits_for_earlier_commands() {
        let mut m = dram();
        m.schedule(0, Op::Write, [(0, 4096)].into_iter());
        assert_eq!(m.schedule(0, Op::Flush, std::iter::empty()).deadline_ns, 7000);
    }

    #[test]
    fn peak_bandwidth_matches_design() {
        let peak = dram().peak_bandwidth(1.0).unwrap();
        assert!((peak - 747.4e6).abs() < 1e6, "{peak}");
        let optane = Model::new(preset("optane").unwrap().params).peak_bandwidth(1.0).unwrap();
        assert!((optane - 2.41e9).abs() < 0.02e9, "{optane}");
        assert!(Model::new(preset("null").unwrap().params).peak_bandwidth(0.5).is_none());
    }

    #[test]
    fn every_preset_names_its_source() {
        for p in presets() {
            assert!(!p.source.is_empty(), "{}", p.name);
        }
    }

    #[test]
    fn a_durable_write_waits_for_the_device_to_drain_first() {
        // 1 us + 4 us per 4 KiB write, 500 ns per flush: a durable write sent
        // behind a plain one starts when that one is done and pays the flush after.
        let mut m = Model::new(ModelParams {
            slots: 4,
            channels: 4,
            read: timing(1000.0, 4000.0),
            write: timing(1000.0, 4000.0),
            flush_ns: 500.0,
        });
        assert_eq!(m.schedule(0, Op::Write, [(0, 4096)].into_iter()).deadline_ns, 5000);
        // Another channel and slot are free at 100 ns, but its flush waits for the first.
        assert_eq!(
            m.schedule_write(100, super::super::Durability::Ordered, [(4096, 4096)].into_iter()).deadline_ns,
            5000 + 5000 + 500
        );
        // A FUA write does not wait for the others: its own channel, then the flush time.
        assert_eq!(
            m.schedule_write(200, super::super::Durability::Fua, [(8192, 4096)].into_iter()).deadline_ns,
            200 + 5000 + 500
        );
    }
}
