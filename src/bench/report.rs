//! Rendering benchmark results: a readable table, and JSON that fio tooling reads.
//!
//! The JSON follows fio's `--output-format=json` layout and field names for
//! everything fio also reports (`jobs[].read.iops`, `bw_bytes`,
//! `lat_ns.percentile["99.000000"]`, `usr_cpu`, `ctx`, ...). iopath's own
//! figures go in `jobs[].iopath`. iopath measures each request end to end, so
//! `clat_ns` (completion latency) equals `lat_ns` and `slat_ns` is zero.

use super::run::BenchResult;
use super::stats::{DirStats, Measurements};
use crate::path::channel::segment_bucket_label;
use crate::units::format_size;
use serde_json::{Map, Value, json};

/// The percentiles fio reports by default.
pub const FIO_PERCENTILES: [f64; 17] =
    [1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99];

fn lat_object(d: &DirStats, percentiles: &[f64]) -> Value {
    let h = &d.latency_ns;
    let mut pct = Map::new();
    if d.ios > 0 {
        for &p in percentiles {
            pct.insert(format!("{p:.6}"), json!(h.value_at_quantile(p / 100.0)));
        }
    }
    json!({
        "min": if d.ios > 0 { h.min() } else { 0 },
        "max": h.max(),
        "mean": if d.ios > 0 { h.mean() } else { 0.0 },
        "stddev": if d.ios > 0 { h.stdev() } else { 0.0 },
        "N": d.ios,
        "percentile": pct,
    })
}

/// fio's summary of per-500 ms samples: min, max, mean, standard deviation, count.
fn sample_summary(samples: &[f64]) -> (f64, f64, f64, f64, usize) {
    if samples.is_empty() {
        return (0.0, 0.0, 0.0, 0.0, 0);
    }
    let n = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / n;
    let var = if samples.len() > 1 { samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples.iter().copied().fold(0.0, f64::max);
    (min, max, mean, var.sqrt(), samples.len())
}

/// One direction's fio object (read, write or trim).
fn dir_object(r: &BenchResult, op: crate::device::Op) -> Value {
    let m = &r.measurements;
    let wall_ns = m.wall_ns;
    let d = match op {
        crate::device::Op::Read => &m.read,
        crate::device::Op::Trim => &m.trim,
        _ => &m.write,
    };
    let percentiles = &r.config.fio.percentiles;
    let (bw_samples, iops_samples) = r.samples.samples(op, wall_ns);
    let (bw_min, bw_max, bw_mean, bw_dev, bw_n) = sample_summary(&bw_samples);
    let (iops_min, iops_max, iops_mean, iops_dev, iops_n) = sample_summary(&iops_samples);
    let zero_lat = json!({"min": 0, "max": 0, "mean": 0.0, "stddev": 0.0, "N": 0});
    json!({
        "io_bytes": d.bytes,
        "io_kbytes": d.bytes / 1024,
        "bw_bytes": d.bw_bytes(wall_ns).round() as u64,
        "bw": (d.bw_bytes(wall_ns) / 1024.0).round() as u64,
        "iops": d.iops(wall_ns),
        "runtime": wall_ns / 1_000_000,
        "total_ios": d.ios,
        "short_ios": 0,
        "drop_ios": 0,
        "slat_ns": zero_lat,
        "clat_ns": lat_object(d, percentiles),
        "lat_ns": lat_object(d, percentiles),
        "bw_min": bw_min.round() as u64,
        "bw_max": bw_max.round() as u64,
        "bw_agg": if d.ios > 0 { 100.0 } else { 0.0 },
        "bw_mean": bw_mean,
        "bw_dev": bw_dev,
        "bw_samples": bw_n,
        "iops_min": iops_min.round() as u64,
        "iops_max": iops_max.round() as u64,
        "iops_mean": iops_mean,
        "iops_stddev": iops_dev,
        "iops_samples": iops_n,
    })
}

/// fio's latency buckets: the share of requests (percent) whose latency lies
/// in each range, by unit (`latency_ns`, `latency_us`, `latency_ms`): bucket
/// "4" of `latency_us` holds 2-4 us. Each histogram bucket of iopath's goes
/// to exactly one of fio's, so the three add up to 100.
fn latency_buckets(m: &Measurements) -> (Value, Value, Value) {
    const EDGES: [u64; 11] = [2, 4, 10, 20, 50, 100, 250, 500, 750, 1000, 2000];
    let h = m.latency_histogram();
    let total = h.len().max(1) as f64;
    // counts[unit][edge]; slot 11 of ms is ">=2000".
    let mut counts = [[0u64; 12]; 3];
    for v in h.iter_recorded() {
        let ns = h.median_equivalent(v.value_iterated_to());
        let (unit, scaled) = match ns {
            0..1_000 => (0, ns),
            1_000..1_000_000 => (1, ns / 1_000),
            _ => (2, ns / 1_000_000),
        };
        let slot = EDGES.iter().position(|&e| scaled < e).unwrap_or(11);
        counts[unit][slot] += v.count_since_last_iteration();
    }
    let bucket = |unit: usize| -> Value {
        let shown = if unit == 2 { 11 } else { 10 };
        let mut out = Map::new();
        for (i, e) in EDGES.iter().take(shown).enumerate() {
            out.insert(e.to_string(), json!(counts[unit][i] as f64 * 100.0 / total));
        }
        if unit == 2 {
            out.insert(">=2000".into(), json!(counts[2][11] as f64 * 100.0 / total));
        }
        Value::Object(out)
    };
    (bucket(0), bucket(1), bucket(2))
}

fn opt_f64(v: Option<f64>) -> Value {
    v.map_or(Value::Null, |x| json!(x))
}

/// iopath's own figures for one job.
fn iopath_object(r: &BenchResult) -> Value {
    let m = &r.measurements;
    json!({
        "partial": r.interrupted,
        "device": r.device_description,
        "path": r.config.path_name,
        "dispatch": r.config.path.dispatch.name(),
        "completion": completion_object(r),
        "knobs": knobs_object(&r.config.path),
        "threads": r.config.threads,
        "iodepth": r.config.iodepth,
        "share_of_peak": opt_f64(m.share_of_peak()),
        "peak_bw_bytes": opt_f64(m.peak_bw_bytes),
        "device_utilization": opt_f64(m.device_utilization()),
        "device_ns_mean": m.device_ns_mean(),
        "software_ns_mean": m.software_ns_mean(),
        "lat_ns_mean": m.latency_ns_mean(),
        "ctx_per_io": m.ctx_per_io(),
        "voluntary_ctx_per_io": if m.total_ios() > 0 { m.usage.voluntary_ctx as f64 / m.total_ios() as f64 } else { 0.0 },
        "involuntary_ctx_per_io": if m.total_ios() > 0 { m.usage.involuntary_ctx as f64 / m.total_ios() as f64 } else { 0.0 },
        "cpu_ns_per_io": m.cpu_ns_per_io(),
        "polls_per_io": m.polls_per_io(),
        "sleeps_per_io": m.sleeps_per_io(),
        "merge": {
            "commands": m.path.commands,
            "segments": m.path.segments,
            "mean_segments": m.mean_segments(),
            "segments_histogram": segments_histogram(m),
            "merged_requests": m.path.merged_requests,
            "merge_wait_ns_mean": m.merge_wait_ns_mean(),
        },
        "steps_ns": if m.path.noticed + m.path.woken > 0 {
            json!({
                "merge_wait": m.merge_wait_ns_mean(),
                "device": m.device_ns_mean(),
                "noticed": m.noticed_ns_mean(),
                "woken": m.woken_ns_mean(),
                "woken_share": m.woken_share(),
            })
        } else {
            Value::Null
        },
        "device_commands": m.device.commands,
        "errors": {
            "queue_errors": m.path.queue_errors,
            "cancels": m.path.cancels,
            "abandoned": m.path.abandoned,
            "faults_injected": m.device.faults_injected,
            "ownership_violations": m.device.ownership_violations,
        },
        "hogs": m.hogs.map_or(Value::Null, |h| json!({
            "count": h.count,
            "duty_pct": h.duty_pct,
            "ops_per_sec": h.ops_per_sec,
        })),
        "verified_blocks": m.verified_blocks,
        "started_unix_ms": r.started_unix_ms,
        "idle_polling": r.idle_polling,
        "logs": r.logs_written.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
    })
}

/// The path's knobs as they were in effect (defaults resolved where the
/// strategy has one of its own they are `null`).
fn knobs_object(p: &crate::path::PathConfig) -> Value {
    json!({
        "pipeline": p.pipeline,
        "combine_budget": p.combine_budget,
        "combine_polling": p.combine_polling.name(),
        "crowd": p.crowd.name(),
        "unplug_thresh": p.unplug_thresh,
        "unplug_ns": p.unplug.map(|d| d.as_nanos() as u64),
        "max_segments": p.max_segments,
        "waiter_spin_ns": p.waiter_spin_ns(),
        "timeout_ns": p.timeout.as_nanos() as u64,
    })
}

/// The completion policy, what it waited on and what it decided.
fn completion_object(r: &BenchResult) -> Value {
    let w = &r.measurements.path.wait;
    json!({
        "policy": r.config.path.completion.name(),
        "source": r.completion_source,
        "switches": w.mode_switches,
        "probes": w.mode_probes,
        "oversleeps": w.oversleeps,
        "time_in_mode_ns": {
            "poll": w.mode_ns[0],
            "hybrid": w.mode_ns[1],
            "interrupt": w.mode_ns[2],
            "yield": w.mode_ns[3],
            "crowd_yield": w.mode_ns[4],
        },
    })
}

/// Commands by segment count, as `{"1": n, "2": n, "3-4": n, ...}` (empty buckets left out).
fn segments_histogram(m: &Measurements) -> Value {
    let mut hist = Map::new();
    for (i, &n) in m.path.segments_hist.iter().enumerate() {
        if n > 0 {
            hist.insert(segment_bucket_label(i), json!(n));
        }
    }
    Value::Object(hist)
}

/// One fio-style job object.
pub fn job_json(r: &BenchResult) -> Value {
    let m = &r.measurements;
    let c = &r.config;
    let options = if c.fio.job_options.is_empty() {
        let mut o = json!({
            "rw": c.rw.name(),
            "bs": c.block_size.to_string(),
            "numjobs": c.threads.to_string(),
            "iodepth": c.iodepth.to_string(),
            "size": r.size.to_string(),
            "rwmixread": c.rwmixread.to_string(),
            "ioengine": c.device,
        });
        if c.fio.distribution != crate::bench::distribution::Distribution::Uniform {
            o["random_distribution"] = json!(c.fio.distribution.name());
        }
        o
    } else {
        Value::Object(c.fio.job_options.iter().map(|(k, v)| (k.clone(), json!(v))).collect())
    };
    let (lat_ns, lat_us, lat_ms) = latency_buckets(m);
    let mut depth = Map::new();
    for (label, low) in [("1", 1), ("2", 2), ("4", 4), ("8", 8), ("16", 16), ("32", 32), (">=64", 64)] {
        let high = if low == 64 { u32::MAX } else { low * 2 - 1 };
        depth.insert(label.into(), json!(if (low..=high).contains(&c.iodepth) { 100.0 } else { 0.0 }));
    }
    json!({
        "jobname": c.fio.job_name.clone().unwrap_or_else(|| format!("{}-{}", c.rw.name(), c.path_name)),
        "groupid": c.fio.group,
        "error": 0,
        "eta": 0,
        "job options": options,
        "elapsed": m.wall_ns / 1_000_000_000,
        "job_runtime": m.wall_ns / 1_000_000,
        "read": dir_object(r, crate::device::Op::Read),
        "write": dir_object(r, crate::device::Op::Write),
        "trim": dir_object(r, crate::device::Op::Trim),
        "sync": {"total_ios": m.sync.ios, "lat_ns": lat_object(&m.sync, &c.fio.percentiles)},
        "iodepth_level": depth,
        // iopath does not count requests per submit or reap call: fio's two
        // histograms of them hold the configured depth's bucket.
        "iodepth_submit": depth_calls(c.iodepth),
        "iodepth_complete": depth_calls(c.iodepth),
        "latency_ns": lat_ns,
        "latency_us": lat_us,
        "latency_ms": lat_ms,
        "latency_depth": c.iodepth,
        "latency_target": 0,
        "latency_percentile": 100.0,
        "latency_window": 0,
        "usr_cpu": m.usr_cpu_pct(),
        "sys_cpu": m.sys_cpu_pct(),
        "ctx": m.usage.voluntary_ctx + m.usage.involuntary_ctx,
        "majf": 0,
        "minf": 0,
        "iopath": iopath_object(r),
    })
}

/// fio's `iodepth_submit`/`iodepth_complete` buckets, all in the one holding `depth`.
fn depth_calls(depth: u32) -> Value {
    let mut out = Map::new();
    for (label, low, high) in [("0", 0, 0), ("4", 1, 4), ("8", 5, 8), ("16", 9, 16), ("32", 17, 32), ("64", 33, 64)] {
        out.insert(label.into(), json!(if (low..=high).contains(&depth) { 100.0 } else { 0.0 }));
    }
    out.insert(">=64".into(), json!(if depth > 64 { 100.0 } else { 0.0 }));
    Value::Object(out)
}

/// A whole fio-style JSON document for a set of jobs.
pub fn to_json(results: &[BenchResult]) -> Value {
    let timestamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    json!({
        "fio version": format!("iopath-{}", env!("CARGO_PKG_VERSION")),
        "timestamp": timestamp,
        "iopath_partial": results.iter().any(|r| r.interrupted),
        "jobs": results.iter().map(job_json).collect::<Vec<_>>(),
    })
}

/// fio's `json+`: [`to_json`] plus, in every latency object with requests,
/// `bins` (latency in ns -> requests), the histogram `fio_jsonplus_clat2csv`
/// turns into CSV. iopath's bins are its histogram's (3 significant digits).
pub fn to_json_plus(results: &[BenchResult]) -> Value {
    let mut doc = to_json(results);
    let bins = |d: &DirStats| -> Value {
        let mut out = Map::new();
        for v in d.latency_ns.iter_recorded() {
            out.insert(d.latency_ns.highest_equivalent(v.value_iterated_to()).to_string(), json!(v.count_at_value()));
        }
        Value::Object(out)
    };
    if let Some(jobs) = doc["jobs"].as_array_mut() {
        for (job, r) in jobs.iter_mut().zip(results) {
            let m = &r.measurements;
            for (name, d) in [("read", &m.read), ("write", &m.write), ("trim", &m.trim)] {
                if d.ios > 0 {
                    job[name]["clat_ns"]["bins"] = bins(d);
                    job[name]["lat_ns"]["bins"] = bins(d);
                }
            }
        }
    }
    doc
}

/// Formats nanoseconds with a unit that keeps 3-4 significant digits.
pub fn format_ns(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0}ns")
    } else if ns < 1e6 {
        format!("{:.2}us", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2}ms", ns / 1e6)
    } else {
        format!("{:.2}s", ns / 1e9)
    }
}

/// Formats a rate with a K/M suffix.
pub fn format_count(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}K", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// Formats bytes/s in MB/s (decimal, as device data sheets do).
pub fn format_bw(bytes_per_s: f64) -> String {
    format!("{:.1}MB/s", bytes_per_s / 1e6)
}

fn dir_row(name: &str, d: &DirStats, wall_ns: u64) -> Option<String> {
    if d.ios == 0 {
        return None;
    }
    let h = &d.latency_ns;
    let q = |p: f64| format_ns(h.value_at_quantile(p) as f64);
    Some(format!(
        "{name:<6} {:>9} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        format_count(d.iops(wall_ns)),
        format_bw(d.bw_bytes(wall_ns)),
        format_ns(h.mean()),
        q(0.50),
        q(0.90),
        q(0.99),
        q(0.999),
        q(0.9999),
        format_ns(h.max() as f64),
    ))
}

/// A human-readable report of one run.
pub fn to_table(r: &BenchResult) -> String {
    let m: &Measurements = &r.measurements;
    let c = &r.config;
    let mut out = String::new();
    let mode = if c.iodepth == 1 { "blocking".to_string() } else { format!("iodepth {}", c.iodepth) };
    out.push_str(&format!(
        "iopath bench: {} {}, {} thread(s), {mode}, {} region, {:.2} s\n",
        c.rw.name(),
        format_size(c.block_size),
        c.threads,
        format_size(r.size),
        m.wall_ns as f64 / 1e9
    ));
    if r.interrupted {
        out.push_str(&format!(
            "PARTIAL: interrupted after {:.2} s; the figures cover only that time\n",
            m.wall_ns as f64 / 1e9
        ));
    }
    out.push_str(&format!("device: {}\n", r.device_description));
    let polling = match c.path.dispatch {
        crate::path::DispatchKind::Combine | crate::path::DispatchKind::Hybrid => {
            format!(", {} polling", c.path.combine_polling.name())
        }
        crate::path::DispatchKind::Auto => format!(", crowd={}", c.path.crowd.name()),
        _ => String::new(),
    };
    out.push_str(&format!("path:   {} ({}{polling})\n\n", c.path_name, c.path.label()));
    out.push_str(&format!(
        "{:<6} {:>9} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
        "", "IOPS", "BW", "mean", "p50", "p90", "p99", "p99.9", "p99.99", "max"
    ));
    let rows = [
        dir_row("read", &m.read, m.wall_ns),
        dir_row("write", &m.write, m.wall_ns),
        dir_row("trim", &m.trim, m.wall_ns),
    ];
    for row in rows.into_iter().flatten() {
        out.push_str(&row);
        out.push('\n');
    }
    out.push_str(&format!(
        "\ncpu:    usr {:.1}% sys {:.1}%, {} per I/O; context switches per I/O {:.2} ({} voluntary, {} involuntary)\n",
        m.usr_cpu_pct(),
        m.sys_cpu_pct(),
        format_ns(m.cpu_ns_per_io()),
        m.ctx_per_io(),
        m.usage.voluntary_ctx,
        m.usage.involuntary_ctx,
    ));
    out.push_str(&format!("wait:   {:.1} polls and {:.2} sleeps per I/O", m.polls_per_io(), m.sleeps_per_io()));
    if m.path.wait.oversleeps > 0 {
        out.push_str(&format!(
            ", {:.2} oversleeps per I/O",
            m.path.wait.oversleeps as f64 / m.total_ios().max(1) as f64
        ));
    }
    if m.sleeps_per_io() > 0.5 && m.voluntary_ctx_per_io() < 0.2 * m.sleeps_per_io() {
        out.push_str(
            " (most sleeps cost no context switch: the wake-up came before the thread had switched out, as it \
             does when the device answers within the time it takes to go to sleep)",
        );
    }
    out.push_str(&format!("\n        on {}\n", r.completion_source));
    if r.idle_polling {
        out.push_str(
            "        idle CPUs polled instead of halting (PM QoS CPU latency limit 0 us): wake-ups were cheap\n",
        );
    }
    let w = &m.path.wait;
    let in_modes: u64 = w.mode_ns.iter().sum();
    if in_modes > 0 {
        let share = |i: usize| 100.0 * w.mode_ns[i] as f64 / in_modes as f64;
        out.push_str(&format!(
            "policy: {} switch(es), {} probe(s); time in yield {:.1}%, poll {:.1}%, hybrid {:.1}%, interrupt \
             {:.1}%; yielding in a crowd (more waiters than CPUs) {:.1}%\n",
            w.mode_switches,
            w.mode_probes,
            share(3),
            share(0),
            share(1),
            share(2),
            share(4),
        ));
    }
    out.push_str(&format!(
        "merge:  {:.2} requests per device command ({} commands)",
        m.mean_segments(),
        m.path.commands
    ));
    if m.path.merged_requests > 0 {
        out.push_str(&format!(", requests waited {} to be merged", format_ns(m.merge_wait_ns_mean())));
        let hist: Vec<String> = m
            .path
            .segments_hist
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| {
                format!("{}:{:.0}%", segment_bucket_label(i), 100.0 * *n as f64 / m.path.commands.max(1) as f64)
            })
            .collect();
        out.push_str(&format!("\n        commands by size: {}", hist.join(" ")));
    }
    out.push('\n');
    if let (Some(share), Some(util)) = (m.share_of_peak(), m.device_utilization()) {
        out.push_str(&format!(
            "device: {:.1}% of peak bandwidth ({}), {:.1}% utilized; device time {} + software {} per I/O\n",
            share * 100.0,
            format_bw(m.peak_bw_bytes.unwrap_or(0.0)),
            util * 100.0,
            format_ns(m.device_ns_mean()),
            format_ns(m.software_ns_mean()),
        ));
    }
    if let Some(h) = &m.hogs {
        out.push_str(&format!(
            "hogs:   {} competing thread(s) at {}% duty did {} work units/s (CPU above counts I/O threads only)\n",
            h.count,
            h.duty_pct,
            format_count(h.ops_per_sec)
        ));
    }
    if m.verified_blocks > 0 || c.verify {
        out.push_str(&format!(
            "verify: {} blocks read back and checked byte for byte, all correct\n",
            m.verified_blocks
        ));
    }
    out
}
