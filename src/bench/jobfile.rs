//! fio job files: `iopath bench JOBFILE.fio`.
//!
//! fio's INI format: a `[global]` section whose options every later job
//! starts from, and one section per job (its name is the job's name). The
//! options iopath has are taken under fio's names (`rw`, `bs`, `iodepth`,
//! `numjobs`, `size`, `runtime`, `ioengine`, `filename`, `direct`, ...),
//! plus `iopath_path=` and `iopath_device=` for what fio has no word for.
//! An option iopath does not support is an error that names it, never
//! ignored. Jobs run as fio runs them: at the same time, except that a job
//! saying `stonewall` waits for every job before it ([`groups`]).

use super::distribution::Distribution;
use super::run::BenchConfig;
use super::workload::Rw;
use crate::error::{Error, Result};
use crate::path::PathSpec;
use crate::units::{parse_duration_default_unit, parse_size};

/// One job section, with `[global]`'s options folded in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// The section's name.
    pub name: String,
    /// `key` or `key=value`, in order (later ones win).
    pub options: Vec<(String, Option<String>)>,
    /// Its 1-based line in the file, for messages.
    pub line: usize,
    /// How many of `options` came from `[global]` (they come first).
    pub from_global: usize,
}

impl Job {
    fn get(&self, key: &str) -> Option<Option<&str>> {
        self.options.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_deref())
    }

    /// Whether the option is set (as a flag or with a value other than 0).
    pub fn has(&self, key: &str) -> bool {
        matches!(self.get(key), Some(None) | Some(Some("1" | "true")))
    }

    fn flag(&self, key: &str) -> Result<bool> {
        match self.get(key) {
            None => Ok(false),
            Some(None) => Ok(true),
            Some(Some(v)) => match v {
                "1" | "true" => Ok(true),
                "0" | "false" => Ok(false),
                _ => Err(self.error(key, v, "0 or 1")),
            },
        }
    }

    fn error(&self, key: &str, value: &str, hint: &str) -> Error {
        Error::spec("job file option", format!("{key}={value} in [{}] (line {})", self.name, self.line), hint)
    }
}

/// Options that fio has and iopath takes, with what they set (and [`FIO_EXTRAS`]).
const SUPPORTED: &[&str] = &[
    "rw",
    "readwrite",
    "rwmixread",
    "rwmixwrite",
    "bs",
    "blocksize",
    "iodepth",
    "numjobs",
    "size",
    "runtime",
    "time_based",
    "number_ios",
    "ioengine",
    "filename",
    "direct",
    "readonly",
    "thread",
    "group_reporting",
    "stonewall",
    "wait_for_previous",
    "randrepeat",
    "norandommap",
    "description",
    "name",
    "iopath_path",
    "iopath_device",
];

/// fio options iopath knows it lacks (issue 14 adds them); named in the error.
const NOT_YET: &[&str] = &["offset_increment", "trim_percentage", "trim_backlog", "zonemode", "nrfiles", "openfiles"];

/// Parses a job file's text into its jobs.
pub fn parse(text: &str) -> Result<Vec<Job>> {
    let mut global: Vec<(String, Option<String>)> = Vec::new();
    let mut jobs: Vec<Job> = Vec::new();
    let mut in_global = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let Some(name) = rest.strip_suffix(']') else {
                return Err(Error::spec("job file", format!("line {}: {line}", i + 1), "a section is [name]"));
            };
            let name = name.trim();
            in_global = name == "global";
            if !in_global {
                jobs.push(Job {
                    name: name.to_string(),
                    options: global.clone(),
                    line: i + 1,
                    from_global: global.len(),
                });
            }
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim().to_string(), Some(v.trim().to_string())),
            None => (line.to_string(), None),
        };
        if in_global {
            global.push((key, value));
        } else if let Some(job) = jobs.last_mut() {
            job.options.push((key, value));
        } else {
            return Err(Error::spec(
                "job file",
                format!("line {}: {line}", i + 1),
                "options go in [global] or in a [job] section",
            ));
        }
    }
    if jobs.is_empty() {
        return Err(Error::spec("job file", "no job", "add a [name] section (fio runs one job per section)"));
    }
    for job in &jobs {
        job.flag("stonewall")?;
        job.flag("wait_for_previous")?;
    }
    Ok(jobs)
}

/// The jobs in groups that run one after another, as fio runs them: a job
/// that says `stonewall` (or `wait_for_previous`) starts a new group once
/// every job before it has finished; the jobs of a group run at the same time.
pub fn groups(jobs: &[Job]) -> Vec<std::ops::Range<usize>> {
    let mut out: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let waits = job.flag("stonewall").unwrap_or(false) || job.flag("wait_for_previous").unwrap_or(false);
        match out.last_mut() {
            Some(group) if !waits => group.end = i + 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

/// The fio options [`apply_option`] takes (on the command line too).
const FIO_EXTRAS: &[&str] = &[
    "random_distribution",
    "rate",
    "rate_iops",
    "ramp_time",
    "write_lat_log",
    "write_bw_log",
    "write_iops_log",
    "log_avg_msec",
    "log_offset",
    "percentile_list",
    "thinktime",
    "thinktime_spin",
    "thinktime_blocks",
    "fsync",
    "end_fsync",
    "offset",
    "loops",
    "startdelay",
    "cpus_allowed",
    "bssplit",
    "bsrange",
    "fdatasync",
    "verify",
    "do_verify",
];

/// `P%` as a number (fio's share of a file or device), if `text` is one.
fn percent(text: &str) -> Option<f64> {
    text.trim().strip_suffix('%').map(|p| p.trim().parse::<f64>().unwrap_or(f64::NAN))
}

/// Sets one of fio's skew, pacing, warm-up, log or report options on
/// `config`, with fio's spelling and meaning: `random_distribution=zipf:1.2`,
/// `rate_iops=R[,W]` and `rate=R[,W]` (per thread and per direction; one
/// value caps each direction, an empty one or 0 leaves it free), `ramp_time`
/// (seconds unless given a unit), `write_lat_log=NAME` (and `_bw_`,
/// `_iops_`), `log_avg_msec`, `percentile_list=P:P:...`, `thinktime`
/// (microseconds unless a unit is given), `thinktime_spin`, `thinktime_blocks`,
/// `fsync=N` (0: none), `end_fsync`, `offset` (bytes or `P%`), `loops`, `startdelay` (seconds),
/// `cpus_allowed`, `bssplit=SIZE/PCT:...[,writes]`, `bsrange=MIN-MAX[,writes]`
/// (both set the block size to the smallest size: requests align to it).
pub fn apply_option(config: &mut BenchConfig, key: &str, value: &str) -> Result<()> {
    let bad = |hint: &str| Error::spec("fio option", format!("{key}={value}"), hint);
    match key {
        "random_distribution" => config.fio.distribution = Distribution::parse(value)?,
        "rate_iops" | "rate" => {
            let bs = config.block_size.max(1) as f64;
            let parse = |text: &str| -> Result<Option<f64>> {
                if text.is_empty() {
                    return Ok(None);
                }
                let n = if key == "rate" {
                    parse_size(text).map(|b| b as f64 / bs)
                } else {
                    parse_size(text).map(|n| n as f64)
                }
                .map_err(|_| bad("a number per second, e.g. 20000 (rate_iops) or 100m (rate), reads[,writes]"))?;
                // fio's default, spelled out: no cap.
                Ok((n > 0.0).then_some(n))
            };
            let mut parts = value.split(',');
            let read = parse(parts.next().unwrap_or(""))?;
            let write = match parts.next() {
                Some(w) => parse(w)?,
                None => read,
            };
            if parts.next().is_some() {
                return Err(bad("reads[,writes]; trim is not supported"));
            }
            config.fio.rate_iops = [read, write];
        }
        "ramp_time" => {
            let d = parse_duration_default_unit(value, 1e9).map_err(|_| bad("e.g. 1 (seconds) or 500ms"))?;
            config.fio.ramp = (!d.is_zero()).then_some(d);
        }
        "write_lat_log" => config.fio.logs.lat = Some(value.to_string()),
        "write_bw_log" => config.fio.logs.bw = Some(value.to_string()),
        "write_iops_log" => config.fio.logs.iops = Some(value.to_string()),
        "log_offset" => config.fio.logs.offsets = value != "0",
        "end_fsync" => config.fio.end_fsync = value != "0",
        "thinktime" | "thinktime_spin" | "startdelay" => {
            // fio: thinktime in microseconds, startdelay in seconds, unless a unit is given.
            let unit = if key == "startdelay" { 1e9 } else { 1e3 };
            let d = parse_duration_default_unit(value, unit).map_err(|_| bad("a time such as 100 or 2ms"))?;
            match key {
                "thinktime" => config.fio.thinktime = d,
                "thinktime_spin" => config.fio.thinktime_spin = d,
                _ => config.fio.startdelay = d,
            }
        }
        // fio's default, spelled out: no flushes.
        "fsync" | "fdatasync" if value.trim() == "0" => config.fio.fsync_every = None,
        "thinktime_blocks" | "fsync" | "fdatasync" | "loops" => {
            let n: u64 = value.parse().ok().filter(|n| *n > 0).ok_or_else(|| bad("a count of 1 or more"))?;
            match key {
                "thinktime_blocks" => config.fio.thinktime_blocks = n,
                // iopath's flush is a data sync (fdatasync on a file, a cache flush on a device).
                "fsync" | "fdatasync" => config.fio.fsync_every = Some(n),
                _ => config.fio.loops = n,
            }
        }
        "bssplit" | "bsrange" => {
            let lists: Vec<&str> = value.split(',').collect();
            if lists.len() > 2 {
                return Err(bad("reads[,writes]; trim is not supported"));
            }
            let mut split = [Vec::new(), Vec::new()];
            for (d, list) in lists.iter().enumerate() {
                split[d] =
                    if key == "bssplit" { parse_bssplit(list) } else { parse_bsrange(list) }.ok_or_else(|| {
                        bad(if key == "bssplit" {
                            "SIZE/PERCENT:SIZE/PERCENT... (a size with no percent shares what is left), reads[,writes]"
                        } else {
                            "MIN-MAX (e.g. 4k-64k: multiples of MIN up to MAX), reads[,writes]"
                        })
                    })?;
            }
            if lists.len() == 1 {
                split[1] = split[0].clone();
            }
            // The smallest size is the unit requests are aligned to (fio's blockalign).
            config.block_size = split.iter().flatten().map(|&(b, _)| b).min().unwrap_or(config.block_size);
            config.fio.bs_split = split;
        }
        "verify" => {
            // iopath checks its own self-describing pattern (every 512-byte sector names its
            // offset and version), whichever checksum the job asked for.
            config.verify = !matches!(value, "0" | "null");
            config.fio.verify_readback = config.verify;
        }
        // Read by `to_config` once every option is in (it may come before `verify`).
        "do_verify" if matches!(value, "0" | "1") => {}
        "do_verify" => return Err(bad("0 or 1")),
        "offset" => match percent(value) {
            Some(p) if (0.0..100.0).contains(&p) => config.fio.offset_percent = Some(p),
            Some(_) => return Err(bad("a share of the device from 0% up to (not including) 100%")),
            None => {
                config.fio.offset = parse_size(value).map_err(|_| bad("a size such as 1g, or a share such as 25%"))?
            }
        },
        "cpus_allowed" => {
            let mut cpus = Vec::new();
            for part in value.split(',') {
                let (a, b) = part.split_once('-').unwrap_or((part, part));
                match (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    (Ok(a), Ok(b)) if a <= b && b < 1024 => cpus.extend(a..=b),
                    _ => return Err(bad("CPU numbers and ranges, e.g. 0-1,3")),
                }
            }
            config.fio.cpus = cpus;
        }
        "log_avg_msec" => {
            let ms: u64 = value.parse().map_err(|_| bad("milliseconds, e.g. 500"))?;
            config.fio.logs.avg_ms = (ms > 0).then_some(ms);
        }
        "percentile_list" => {
            let list: Option<Vec<f64>> = value
                .split([':', ','])
                .map(|p| p.trim().parse::<f64>().ok().filter(|p| *p > 0.0 && *p <= 100.0))
                .collect();
            config.fio.percentiles = list.ok_or_else(|| bad("percentiles above 0 and at most 100, e.g. 50:99:99.9"))?;
        }
        _ => return Err(bad(&format!("not one of {}", FIO_EXTRAS.join(", ")))),
    }
    Ok(())
}

/// `4k/10:64k/90` (a size with no percent shares what the others leave) into
/// (bytes, weight) pairs.
fn parse_bssplit(text: &str) -> Option<Vec<(u64, u32)>> {
    let mut sized = Vec::new();
    let mut open = Vec::new();
    for part in text.split(':') {
        let (size, pct) = part.split_once('/').unwrap_or((part, ""));
        let size = parse_size(size.trim()).ok().filter(|s| *s > 0)?;
        match pct.trim() {
            "" => open.push(size),
            p => sized.push((size, p.parse::<u32>().ok().filter(|p| *p <= 100)?)),
        }
    }
    let used: u32 = sized.iter().map(|(_, p)| p).sum();
    if used > 100 || (open.is_empty() && used == 0) {
        return None;
    }
    let share = if open.is_empty() { 0 } else { (100 - used) / open.len() as u32 };
    sized.extend(open.into_iter().map(|s| (s, share)));
    Some(sized)
}

/// `4k-64k` into every multiple of 4k up to 64k, equally likely (as fio rounds a
/// random length down to a multiple of the smallest).
fn parse_bsrange(text: &str) -> Option<Vec<(u64, u32)>> {
    let (lo, hi) = text.split_once('-')?;
    let (lo, hi) = (parse_size(lo.trim()).ok()?, parse_size(hi.trim()).ok()?);
    if lo == 0 || hi < lo || hi / lo > 4096 {
        return None;
    }
    Some((1..=hi / lo).map(|k| (k * lo, 1)).collect())
}

/// The bench run a job describes, starting from `base` (the command line's settings).
pub fn to_config(job: &Job, base: &BenchConfig) -> Result<BenchConfig> {
    for (key, value) in &job.options {
        if NOT_YET.contains(&key.as_str()) {
            return Err(job.error(
                key,
                value.as_deref().unwrap_or(""),
                "iopath does not support this fio option yet; remove it to run the rest",
            ));
        }
        if !SUPPORTED.contains(&key.as_str()) && !FIO_EXTRAS.contains(&key.as_str()) {
            return Err(job.error(
                key,
                value.as_deref().unwrap_or(""),
                &format!(
                    "not an fio option iopath knows; it takes: {}, {}",
                    SUPPORTED.join(", "),
                    FIO_EXTRAS.join(", ")
                ),
            ));
        }
    }
    let mut c = base.clone();
    let value = |key: &str| job.get(key).flatten();
    if let Some(rw) = value("rw").or(value("readwrite")) {
        // fio's "rw" is mixed sequential, "readwrite" the same; "randrw" random.
        c.rw = Rw::parse(if rw == "readwrite" { "rw" } else { rw }).map_err(|_| {
            job.error("rw", rw, "read, write, randread, randwrite, rw (readwrite), randrw, trim or randtrim (trimwrite is not supported)")
        })?;
    }
    if let Some(v) = value("rwmixread") {
        c.rwmixread = v.parse().ok().filter(|p| *p <= 100).ok_or_else(|| job.error("rwmixread", v, "0-100"))?;
    }
    if let Some(v) = value("rwmixwrite") {
        let w: u32 = v.parse().ok().filter(|p| *p <= 100).ok_or_else(|| job.error("rwmixwrite", v, "0-100"))?;
        c.rwmixread = 100 - w;
    }
    if let Some(v) = value("bs").or(value("blocksize")) {
        c.block_size = parse_size(v).map_err(|_| job.error("bs", v, "a size such as 4k"))?;
    }
    if let Some(v) = value("iodepth") {
        c.iodepth = v.parse().ok().filter(|d| *d > 0).ok_or_else(|| job.error("iodepth", v, "1 or more"))?;
    }
    if let Some(v) = value("numjobs") {
        c.threads = v.parse().ok().filter(|d| *d > 0).ok_or_else(|| job.error("numjobs", v, "1 or more"))?;
    }
    if let Some(v) = value("size") {
        match percent(v) {
            Some(p) if p > 0.0 && p <= 100.0 => c.fio.size_percent = Some(p),
            Some(_) => return Err(job.error("size", v, "a share of the device above 0% and at most 100%")),
            None => {
                c.size =
                    Some(parse_size(v).map_err(|_| job.error("size", v, "a size such as 1g, or a share such as 50%"))?)
            }
        }
    }
    if let Some(v) = value("runtime") {
        // fio's runtime is in seconds unless it has a unit.
        c.runtime = Some(parse_duration_default_unit(v, 1e9).map_err(|_| job.error("runtime", v, "e.g. 5 or 500ms"))?);
    }
    if let Some(v) = value("number_ios") {
        c.ios = Some(v.parse().map_err(|_| job.error("number_ios", v, "a count"))?);
    }
    if job.get("randrepeat") == Some(Some("0")) {
        return Err(job.error("randrepeat", "0", "iopath's offsets always repeat from --seed; leave randrepeat out"));
    }
    // The device: iopath_device wins; otherwise ioengine and filename.
    if let Some(d) = value("iopath_device") {
        c.device = d.to_string();
    } else if let Some(engine) = value("ioengine") {
        let backend = match engine {
            "io_uring" => "uring",
            "psync" | "pvsync" | "sync" => "psync",
            "libaio" => "aio",
            "null" => "null",
            other => {
                return Err(job.error(
                    "ioengine",
                    other,
                    "io_uring, libaio, psync (pvsync, sync) or null; or name any iopath device with iopath_device=",
                ));
            }
        };
        if backend == "null" {
            c.device = "null".into();
        } else {
            let Some(file) = value("filename") else {
                return Err(job.error("ioengine", engine, "give filename= (the file or block device)"));
            };
            let direct = match value("direct") {
                Some("0") => ",direct=0",
                _ => "",
            };
            let ro = if job.flag("readonly")? { ",readonly=1" } else { "" };
            c.device = format!("{backend}:{file}{direct}{ro}");
        }
    } else if let Some(file) = value("filename") {
        c.device = format!("uring:{file}");
    }
    for (key, v) in &job.options {
        if FIO_EXTRAS.contains(&key.as_str()) {
            // A bare flag (`log_offset`) means 1; the others need their value.
            let v = match v.as_deref() {
                Some(v) => v,
                None if key == "log_offset" || key == "end_fsync" => "1",
                None => return Err(job.error(key, "", "give it a value: key=value")),
            };
            apply_option(&mut c, key, v).map_err(|e| match e {
                Error::InvalidSpec { hint, .. } => job.error(key, v, &hint),
                other => other,
            })?;
        }
    }
    if job.get("do_verify") == Some(Some("0")) {
        c.fio.verify_readback = false;
    }
    c.fio.job_name = Some(job.name.clone());
    c.fio.job_options =
        job.options[job.from_global..].iter().map(|(k, v)| (k.clone(), v.clone().unwrap_or_default())).collect();
    if let Some(p) = value("iopath_path") {
        let spec = PathSpec::parse(p)?;
        let path = spec.config()?;
        c.path_name = spec.shown_name(&path);
        c.path = path;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
; fio's examples style
[global]
ioengine=io_uring
filename=/tmp/x.img
direct=1
bs=4k
runtime=2
thread
group_reporting

[random-read]
rw=randread
iodepth=32

[mixed]
stonewall
rw=randrw
rwmixread=70
numjobs=4
iopath_path=stm
";

    #[test]
    fn jobs_take_global_options_and_their_own() {
        let jobs = parse(FILE).unwrap();
        assert_eq!(jobs.iter().map(|j| j.name.as_str()).collect::<Vec<_>>(), ["random-read", "mixed"]);
        let base = BenchConfig::default();
        let a = to_config(&jobs[0], &base).unwrap();
        assert_eq!((a.rw, a.iodepth, a.block_size, a.threads), (Rw::RandRead, 32, 4096, 1));
        assert_eq!(a.device, "uring:/tmp/x.img");
        assert_eq!(a.runtime, Some(std::time::Duration::from_secs(2)));
        let b = to_config(&jobs[1], &base).unwrap();
        assert_eq!((b.rw, b.rwmixread, b.threads, b.path_name.as_str()), (Rw::RandRw, 70, 4, "stm"));
        let aio = parse("[a]\nioengine=libaio\nfilename=/dev/loop0\n").unwrap();
        assert_eq!(to_config(&aio[0], &base).unwrap().device, "aio:/dev/loop0");
    }

    #[test]
    fn skew_pacing_warm_up_logs_and_percentiles_take_fios_meaning() {
        let text = "[global]\nbs=8k\n[mix]\nrw=randrw\nrwmixread=70\nrandom_distribution=zipf:1.2\n\
                    rate_iops=20000\nramp_time=1\nwrite_lat_log=mix\nlog_avg_msec=100\npercentile_list=50:99.9\n\
                    [bw]\nstonewall\nrate=,80k\n";
        let jobs = parse(text).unwrap();
        let c = to_config(&jobs[0], &BenchConfig::default()).unwrap();
        assert_eq!(c.fio.distribution, Distribution::Zipf(1.2));
        assert_eq!(c.fio.rate_iops, [Some(20000.0), Some(20000.0)], "one value caps each direction");
        assert_eq!(c.fio.ramp, Some(std::time::Duration::from_secs(1)));
        assert_eq!((c.fio.logs.lat.as_deref(), c.fio.logs.avg_ms), (Some("mix"), Some(100)));
        assert_eq!(c.fio.percentiles, [50.0, 99.9]);
        assert_eq!(c.fio.job_name.as_deref(), Some("mix"));
        assert_eq!(c.fio.job_options[0], ("rw".to_string(), "randrw".to_string()), "the job's own options only");
        let b = to_config(&jobs[1], &BenchConfig::default()).unwrap();
        assert_eq!(b.fio.rate_iops, [None, Some(10.0)], "80 KiB/s of 8 KiB writes, reads free");
        let jobs = parse("[c]\ncpus_allowed=0-2,5\nthinktime=50\nstartdelay=2\nend_fsync\n").unwrap();
        let c = to_config(&jobs[0], &BenchConfig::default()).unwrap();
        assert_eq!(c.fio.cpus, [0, 1, 2, 5]);
        assert_eq!(c.fio.thinktime, std::time::Duration::from_micros(50), "microseconds by default");
        assert_eq!(c.fio.startdelay, std::time::Duration::from_secs(2), "seconds by default");
        assert!(c.fio.end_fsync);
        let jobs = parse("[global]\ndo_verify=0\n[v]\nrw=write\nverify=crc32c\n[w]\nstonewall\nverify=md5\n").unwrap();
        let v = to_config(&jobs[0], &BenchConfig::default()).unwrap();
        assert!(v.verify && !v.fio.verify_readback, "do_verify=0 before verify= still holds");
        let jobs = parse("[w]\nrw=randwrite\nverify=md5\n").unwrap();
        let w = to_config(&jobs[0], &BenchConfig::default()).unwrap();
        assert!(w.verify && w.fio.verify_readback);
        // fio's defaults spelled out, as generated job files do: no flushes, no caps.
        let jobs = parse("[d]\nrw=randwrite\nfsync=4\nfsync=0\nfdatasync=0\nrate=0\nrate_iops=0,0\n").unwrap();
        let d = to_config(&jobs[0], &BenchConfig::default()).unwrap();
        assert_eq!((d.fio.fsync_every, d.fio.rate_iops), (None, [None, None]));
        let jobs = parse("[s]\nbs=8k\nbssplit=4k/10:64k:16k,32k\n[r]\nstonewall\nbsrange=4k-16k\n").unwrap();
        let c = to_config(&jobs[0], &BenchConfig::default()).unwrap();
        assert_eq!(c.fio.bs_split, [vec![(4096, 10), (65536, 45), (16384, 45)], vec![(32768, 100)]]);
        assert_eq!(c.block_size, 4096, "the smallest size, whatever bs said");
        let r = to_config(&jobs[1], &BenchConfig::default()).unwrap();
        assert_eq!(r.fio.bs_split[0], [(4096, 1), (8192, 1), (12288, 1), (16384, 1)]);
    }

    #[test]
    fn stonewall_starts_a_group_and_the_rest_run_together() {
        let jobs = parse("[a]\n[b]\n[c]\nstonewall\n[d]\n[e]\nwait_for_previous\n").unwrap();
        assert_eq!(groups(&jobs), [0..2, 2..4, 4..5]);
    }

    #[test]
    fn what_iopath_cannot_do_is_an_error_that_names_it() {
        let err = |text: &str| match parse(text).and_then(|j| to_config(&j[0], &BenchConfig::default())) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted: {text}"),
        };
        assert!(err("[a]\nzonemode=zbd\n").contains("zonemode=zbd in [a] (line 1)"));
        assert!(err("[a]\nrandom_distribution=zipf:0\n").contains("random_distribution=zipf:0 in [a]"));
        assert!(err("[a]\nrate_iops=fast\n").contains("rate_iops=fast in [a]"));
        assert!(err("[a]\npercentile_list=99:101\n").contains("at most 100"));
        assert!(err("[a]\ncpus_allowed=3-1\n").contains("e.g. 0-1,3"));
        assert!(err("[a]\nfsync\n").contains("give it a value"));
        assert!(err("[a]\nbssplit=4k/70:64k/50\n").contains("SIZE/PERCENT"));
        assert!(err("[a]\nbsrange=64k-4k\n").contains("MIN-MAX"));
        assert!(err("[a]\noffset_increment=1g\n").contains("does not support this fio option yet"));
        assert!(err("[a]\nbogus=1\n").contains("not an fio option iopath knows"));
        assert!(err("[a]\nioengine=posixaio\nfilename=/x\n").contains("io_uring, libaio, psync"));
        assert!(err("[a]\nrw=trimwrite\n").contains("trimwrite is not supported"));
        assert!(err("rw=read\n").contains("options go in [global] or in a [job] section"));
        assert!(err("[global]\nrw=read\n").contains("no job"));
        assert!(err("[a]\nioengine=psync\n").contains("give filename="));
        assert!(err("[a]\nsize=0%\n").contains("above 0% and at most 100%"));
        assert!(err("[a]\nsize=x%\n").contains("above 0% and at most 100%"));
        assert!(err("[a]\noffset=100%\n").contains("up to (not including) 100%"));
    }
}
