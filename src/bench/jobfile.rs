//! fio job files: `iopath bench JOBFILE.fio`.
//!
//! fio's INI format: a `[global]` section whose options every later job
//! starts from, and one section per job (its name is the job's name). The
//! options iopath has are taken under fio's names (`rw`, `bs`, `iodepth`,
//! `numjobs`, `size`, `runtime`, `ioengine`, `filename`, `direct`, ...),
//! plus `iopath_path=` and `iopath_device=` for what fio has no word for.
//! An option iopath does not support is an error that names it, never
//! ignored. Jobs run one after another, so every job after the first must
//! say `stonewall` (fio would otherwise run them at the same time, which
//! iopath does not do yet).

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
}

impl Job {
    fn get(&self, key: &str) -> Option<Option<&str>> {
        self.options.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_deref())
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

/// Options that fio has and iopath takes, with what they set.
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
const NOT_YET: &[&str] = &[
    "ramp_time",
    "rate",
    "rate_iops",
    "random_distribution",
    "bssplit",
    "bsrange",
    "thinktime",
    "fsync",
    "fdatasync",
    "end_fsync",
    "offset",
    "offset_increment",
    "startdelay",
    "cpus_allowed",
    "cpumask",
    "write_lat_log",
    "write_bw_log",
    "write_iops_log",
    "log_avg_msec",
    "percentile_list",
    "loops",
    "verify",
    "do_verify",
    "trim",
    "status-interval",
    "zonemode",
    "nrfiles",
    "openfiles",
];

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
                jobs.push(Job { name: name.to_string(), options: global.clone(), line: i + 1 });
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
    for (i, job) in jobs.iter().enumerate().skip(1) {
        if !job.flag("stonewall")? && !job.flag("wait_for_previous")? {
            return Err(Error::spec(
                "job file",
                format!("[{}] (line {})", job.name, job.line),
                format!(
                    "fio would run it at the same time as [{}]; iopath runs jobs one after another, so add \
                     stonewall to it",
                    jobs[i - 1].name
                ),
            ));
        }
    }
    Ok(jobs)
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
        if !SUPPORTED.contains(&key.as_str()) {
            return Err(job.error(
                key,
                value.as_deref().unwrap_or(""),
                &format!("not an fio option iopath knows; it takes: {}", SUPPORTED.join(", ")),
            ));
        }
    }
    let mut c = base.clone();
    let value = |key: &str| job.get(key).flatten();
    if let Some(rw) = value("rw").or(value("readwrite")) {
        // fio's "rw" is mixed sequential, "readwrite" the same; "randrw" random.
        c.rw = Rw::parse(if rw == "readwrite" { "rw" } else { rw }).map_err(|_| {
            job.error("rw", rw, "read, write, randread, randwrite, rw (readwrite) or randrw; trim is not supported")
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
        c.size = Some(parse_size(v).map_err(|_| job.error("size", v, "a size such as 1g"))?);
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
            "null" => "null",
            other => {
                return Err(job.error(
                    "ioengine",
                    other,
                    "io_uring, psync (pvsync, sync) or null; or name any iopath device with iopath_device=",
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
    }

    #[test]
    fn what_iopath_cannot_do_is_an_error_that_names_it() {
        let err = |text: &str| match parse(text).and_then(|j| to_config(&j[0], &BenchConfig::default())) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted: {text}"),
        };
        assert!(err("[a]\nrate_iops=20000\n").contains("rate_iops=20000 in [a] (line 1)"));
        assert!(err("[a]\nbogus=1\n").contains("not an fio option iopath knows"));
        assert!(err("[a]\nioengine=libaio\nfilename=/x\n").contains("io_uring, psync"));
        assert!(err("[a]\nrw=trim\n").contains("trim is not supported"));
        assert!(err("rw=read\n").contains("options go in [global] or in a [job] section"));
        assert!(err("[global]\nrw=read\n").contains("no job"));
        assert!(err("[a]\nrw=read\n[b]\nrw=write\n").contains("add stonewall"));
        assert!(err("[a]\nioengine=psync\n").contains("give filename="));
    }
}
