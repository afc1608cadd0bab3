//! Seed 002's application results: unmodified programs on Linux's ext4 and
//! on iopath's file system (under `iopath run --mount`), side by side on two
//! identical loop devices, with the paper's gains beside iopath's.
//!
//! Root only (loop devices, mkfs.ext4, mount), and only from the `iopath`
//! tool (it runs programs through `iopath run`); a workload whose program is
//! missing (db_bench from rocksdb-tools, python3) is left out and said so.
//! `scripts/real-apps` is the full benchmark (more programs, both idle
//! states, every run checked); this is its short form with verdicts.

use super::experiments::LoopDevice;
use super::{Chart, ChartKind, DataTable, Finding, Runner, Section, Series};
use crate::bench::stats::median;
use crate::error::Result;
use std::path::PathBuf;
use std::process::Command;

/// Seed 002 (AIOS, Lee et al., USENIX ATC '19), its application results on
/// the file-system path against ext4: (workload, lowest and highest gain).
const PAPER: &[(&str, f64, f64)] = &[
    ("RocksDB fillsync", 0.22, 0.44),
    ("RocksDB readrandom", 0.11, 0.32),
    ("varmail-like (create, append, fsync, delete)", 0.299, 0.299),
    ("OLTP insert (single-row transactions)", 0.15, 0.15),
];

/// Why a workload most likely falls short of the paper's gain here.
const WHY_NOT: &[(&str, &str)] = &[
    (
        "RocksDB readrandom",
        "every read pays the interposer and the file layer inside the process, and each process starts with an \
         empty page cache (the kernel's outlives its programs); the paper's gain came from a faster read path in the \
         kernel on an Optane SSD",
    ),
    (
        "OLTP insert (single-row transactions)",
        "SQLite's rollback journal makes two namespace changes per transaction (the journal's create and delete), \
         each sent to iopath's journal before the call returns so that a killed process keeps it, and each fsync \
         waits for them; ext4 keeps them in kernel memory",
    ),
    (
        "varmail-like (create, append, fsync, delete)",
        "each create and delete is written to iopath's journal before the call returns (so that a killed process \
         keeps it), a device round trip ext4 does not make",
    ),
];

/// Small files created, appended to, fsync'd, read and deleted, as
/// Filebench's varmail does: `python3 -c VARMAIL DIR SECONDS`. Prints the
/// operations done, then "ok" if every file read back holds what was written.
const VARMAIL: &str = r#"
import os, sys, time, zlib
d, seconds = sys.argv[1], float(sys.argv[2])
os.makedirs(d, exist_ok=True)
live, n, ok, end = [], 0, True, time.monotonic() + seconds
body = lambda i, k: (b"%08d" % i) * (k // 8)
while time.monotonic() < end:
    name = os.path.join(d, "m%d" % n)
    fd = os.open(name, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    os.write(fd, body(n, 16384)); os.fsync(fd)
    os.write(fd, body(n + 1, 8192)); os.fsync(fd); os.close(fd)
    live.append(n)
    if len(live) > 1:
        i = live[n % len(live)]
        with open(os.path.join(d, "m%d" % i), "rb") as f:
            ok &= f.read() == body(i, 16384) + body(i + 1, 8192)
    if len(live) > 50:
        os.unlink(os.path.join(d, "m%d" % live.pop(0)))
    n += 1
print(n, "ok" if ok else "CORRUPT")
"#;

/// Single-row transactions in SQLite (rollback journal, synchronous=FULL):
/// `python3 -c OLTP DB COUNT`. Prints the count, then "ok" if the table holds
/// every row and `PRAGMA integrity_check` says ok.
const OLTP: &str = r#"
import sqlite3, sys
db, count = sys.argv[1], int(sys.argv[2])
c = sqlite3.connect(db, isolation_level=None)
c.execute("pragma journal_mode=delete"); c.execute("pragma synchronous=full")
c.execute("drop table if exists t"); c.execute("create table t(k integer primary key, v text)")
for i in range(count):
    c.execute("begin"); c.execute("insert into t values(?, ?)", (i, "%0100d" % i)); c.execute("commit")
rows = c.execute("select count(*) from t").fetchone()[0]
check = c.execute("pragma integrity_check").fetchone()[0]
print(count, "ok" if rows == count and check == "ok" else "CORRUPT %d %s" % (rows, check))
"#;

/// Where a workload's files are, and how its commands run there.
struct Side {
    name: &'static str,
    dir: PathBuf,
    /// `iopath run --mount DIR=DEVICE --` for iopath, nothing for ext4.
    prefix: Vec<String>,
}

impl Side {
    /// Runs `program args` here; its stdout and stderr together, or why it failed.
    fn run(&self, program: &str, args: &[String]) -> std::result::Result<String, String> {
        let mut argv: Vec<String> = self.prefix.clone();
        argv.push(program.to_string());
        argv.extend(args.iter().cloned());
        let out = Command::new(&argv[0]).args(&argv[1..]).output().map_err(|e| format!("cannot run {program}: {e}"))?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!("{program} on {} failed: {}", self.name, text.trim().lines().last().unwrap_or("")))
        }
    }
}

/// What one run of a workload gives: (operations per second, what its check found), or why it failed.
type Outcome = std::result::Result<(f64, String), String>;

/// One workload: its name (as in [`PAPER`]) and how it runs on a side.
struct Workload {
    name: &'static str,
    run: Box<dyn Fn(&Side) -> Outcome>,
}

/// A workload's runs: ext4's and iopath's rates, and every check.
struct Results {
    name: &'static str,
    ext4: Vec<f64>,
    iopath: Vec<f64>,
    checks: Vec<String>,
}

fn have(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

/// The number before `ops/sec` on db_bench's line for `bench`.
fn db_bench_rate(text: &str, bench: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with(bench) && l.contains("ops/sec"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "ops/sec")?;
    words.get(at.checked_sub(1)?)?.parse().ok()
}

fn workloads(quick: bool) -> (Vec<Workload>, Vec<String>) {
    let mut out = Vec::new();
    let mut missing = Vec::new();
    let db = |side: &Side, name: &str, extra: &[&str]| -> Vec<String> {
        let mut a = vec![
            format!("--db={}", side.dir.join(name).display()),
            "--compression_type=none".into(),
            "--value_size=100".into(),
            "--seed=42".into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    if have("db_bench") {
        let syncs = if quick { "2000" } else { "20000" };
        out.push(Workload {
            name: PAPER[0].0,
            run: Box::new(move |side| {
                side.run("rm", &["-rf".into(), side.dir.join("sync").display().to_string()])?;
                let text =
                    side.run("db_bench", &db(side, "sync", &["--benchmarks=fillsync", &format!("--num={syncs}")]))?;
                let rate = db_bench_rate(&text, "fillsync").ok_or("db_bench printed no fillsync line")?;
                Ok((rate, "db_bench ok".into()))
            }),
        });
        let (keys, seconds) = if quick { ("100000", "1") } else { ("500000", "3") };
        out.push(Workload {
            name: PAPER[1].0,
            run: Box::new(move |side| {
                // Built once per side (`test` runs where the files are: on a mount, under `iopath run`).
                if side.run("test", &["-e".into(), side.dir.join("read/CURRENT").display().to_string()]).is_err() {
                    side.run("db_bench", &db(side, "read", &["--benchmarks=fillseq", &format!("--num={keys}")]))?;
                }
                let args = db(
                    side,
                    "read",
                    &[
                        "--use_existing_db=1",
                        "--benchmarks=readrandom",
                        &format!("--num={keys}"),
                        "--threads=4",
                        &format!("--duration={seconds}"),
                        "--cache_size=8388608",
                    ],
                );
                let text = side.run("db_bench", &args)?;
                let rate = db_bench_rate(&text, "readrandom").ok_or("db_bench printed no readrandom line")?;
                let line = text.lines().find(|l| l.starts_with("readrandom")).unwrap_or("");
                let found = line.rsplit_once('(').map_or("", |(_, f)| f.trim_end_matches(')'));
                let all = found.split(" of ").collect::<Vec<_>>();
                let check = if all.len() == 2 && all[0] == all[1].trim_end_matches(" found") {
                    "every key found".to_string()
                } else {
                    format!("keys MISSING: {found}")
                };
                Ok((rate, check))
            }),
        });
    } else {
        missing.push("db_bench (Debian's rocksdb-tools): the RocksDB workloads are left out".to_string());
    }
    if have("python3") {
        let seconds = if quick { "1" } else { "3" };
        out.push(Workload {
            name: PAPER[2].0,
            run: Box::new(move |side| {
                let dir = side.dir.join("mail").display().to_string();
                side.run("rm", &["-rf".into(), dir.clone()])?;
                let text = side.run("python3", &["-c".into(), VARMAIL.into(), dir, seconds.into()])?;
                let (n, check) = last_result(&text)?;
                Ok((n / seconds.parse::<f64>().unwrap_or(1.0), check))
            }),
        });
        let count = if quick { 300 } else { 2000 };
        out.push(Workload {
            name: PAPER[3].0,
            run: Box::new(move |side| {
                let db = side.dir.join("oltp.db").display().to_string();
                let start = std::time::Instant::now();
                let text = side.run("python3", &["-c".into(), OLTP.into(), db, count.to_string()])?;
                let (n, check) = last_result(&text)?;
                Ok((n / start.elapsed().as_secs_f64(), check))
            }),
        });
    } else {
        missing.push("python3: the varmail-like and OLTP workloads are left out".to_string());
    }
    (out, missing)
}

/// The last line a workload script printed: (count, "ok" or what is wrong).
fn last_result(text: &str) -> std::result::Result<(f64, String), String> {
    let line = text.lines().rev().find(|l| !l.starts_with("iopath:") && !l.trim().is_empty()).unwrap_or("");
    let (n, check) = line.split_once(' ').ok_or_else(|| format!("unexpected output: {text}"))?;
    let n: f64 = n.parse().map_err(|_| format!("unexpected output: {text}"))?;
    Ok((n, if check == "ok" { "data checked".into() } else { format!("check FAILED: {check}") }))
}

fn skipped(why: String) -> Section {
    Section {
        key: "apps".into(),
        title: TITLE.into(),
        source: SOURCE.into(),
        setup: SETUP.into(),
        explanation: format!("Skipped: {why}."),
        tables: Vec::new(),
        findings: Vec::new(),
        chart: chart(Vec::new(), Vec::new()),
    }
}

const TITLE: &str = "Unmodified programs on iopath's file system against ext4";
const SOURCE: &str = "seed 002 (AIOS, USENIX ATC '19), its application results on the file-system path";
const SETUP: &str = "two identical loop devices with direct I/O over files in /dev/shm: ext4 (mkfs.ext4, default \
                     mount) on one, iopath's file system on the other under `iopath run --mount`; the same commands \
                     on both, the sides alternating";

fn chart(categories: Vec<String>, series: Vec<Series>) -> Chart {
    Chart {
        kind: ChartKind::Bars,
        title: "Throughput against ext4 on the same device".into(),
        x_label: "workload".into(),
        y_label: "iopath / ext4".into(),
        x_log2: false,
        categories,
        series,
        reference: Some(1.0),
    }
}

/// A directory made for the run and removed after it (unmounted first if mounted).
struct Scratch {
    path: PathBuf,
    mounted: bool,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.mounted {
            // A program's io_uring rings are torn down after it exits and hold their files
            // until then: the file system can be busy for a moment.
            for _ in 0..100 {
                if Command::new("umount").arg(&self.path).status().is_ok_and(|s| s.success()) {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn scratch(name: &str) -> std::result::Result<Scratch, String> {
    let path = std::env::temp_dir().join(format!("iopath-reproduce-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&path).map_err(|e| format!("cannot make {}: {e}", path.display()))?;
    Ok(Scratch { path, mounted: false })
}

fn command_ok(program: &str, args: &[&str]) -> std::result::Result<(), String> {
    let out = Command::new(program).args(args).output().map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{program} {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// This executable, if it is the `iopath` tool (the programs run through its `run`).
fn iopath_tool() -> std::result::Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let out = Command::new(&exe).arg("--version").output().map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    if String::from_utf8_lossy(&out.stdout).starts_with("iopath") {
        Ok(exe)
    } else {
        Err("it runs programs through `iopath run`: run it from the iopath tool".into())
    }
}

/// The `apps` experiment.
pub fn apps(runner: &mut Runner, quick: bool) -> Result<Section> {
    let setup = (|| -> std::result::Result<_, String> {
        let tool = iopath_tool()?;
        if !have("mkfs.ext4") {
            return Err("it needs mkfs.ext4 (Debian's e2fsprogs)".into());
        }
        let (work, missing) = workloads(quick);
        if work.is_empty() {
            return Err(format!("none of its programs is here ({})", missing.join("; ")));
        }
        let mib = if quick { 512 } else { 2048 };
        let ext4_dev = LoopDevice::set_up_sized(mib)?;
        let iopath_dev = LoopDevice::set_up_sized(mib)?;
        let mut ext4_dir = scratch("ext4")?;
        command_ok("mkfs.ext4", &["-q", "-F", &ext4_dev.device])?;
        command_ok("mount", &[&ext4_dev.device, ext4_dir.path.to_str().unwrap_or("")])?;
        ext4_dir.mounted = true;
        let spec = format!("uring:{}", iopath_dev.device);
        command_ok(tool.to_str().unwrap_or("iopath"), &["mkfs", &spec, "--allow-overwrite", "--allow-fs-overwrite"])?;
        let iopath_dir = scratch("mnt")?;
        Ok((tool, work, missing, ext4_dev, iopath_dev, ext4_dir, iopath_dir, spec))
    })();
    let (tool, work, missing, _ext4_dev, _iopath_dev, ext4_dir, iopath_dir, spec) = match setup {
        Ok(s) => s,
        Err(why) => return Ok(skipped(why)),
    };
    let sides = [
        Side { name: "ext4", dir: ext4_dir.path.clone(), prefix: Vec::new() },
        Side {
            name: "iopath",
            dir: iopath_dir.path.clone(),
            prefix: vec![
                tool.display().to_string(),
                "run".into(),
                "--wait".into(),
                "30".into(),
                "--mount".into(),
                format!("{}={spec}", iopath_dir.path.display()),
                "--".into(),
            ],
        },
    ];
    let rounds = if quick { 1 } else { 3 };
    runner.plan((rounds * work.len() * sides.len()) as u64);
    let mut results: Vec<Results> = work
        .iter()
        .map(|w| Results { name: w.name, ext4: Vec::new(), iopath: Vec::new(), checks: Vec::new() })
        .collect();
    for round in 0..rounds {
        for (w, result) in work.iter().zip(results.iter_mut()) {
            let order: Vec<&Side> = if round % 2 == 0 { sides.iter().collect() } else { sides.iter().rev().collect() };
            for side in order {
                let (rate, check) = (w.run)(side).unwrap_or_else(|e| (0.0, format!("run FAILED: {e}")));
                let rates = if side.name == "ext4" { &mut result.ext4 } else { &mut result.iopath };
                rates.push(rate);
                result.checks.push(format!("{}: {check}", side.name));
                runner.tick();
            }
        }
    }
    let fsck = Command::new(&tool).args(["fsck", &spec]).output();
    let fsck_clean = fsck.as_ref().is_ok_and(|o| o.status.success());
    drop(sides);
    drop(iopath_dir);
    drop(ext4_dir);
    // The page frames the programs kept for the next process (crate::frames): memory in /dev/shm.
    crate::frames::remove_unheld(crate::frames::default_dir());

    let mut rows = Vec::new();
    let mut findings = Vec::new();
    let mut ratios = Vec::new();
    let mut paper_mid = Vec::new();
    for Results { name, ext4, iopath: mine, checks } in &results {
        let (e, m) = (median(ext4.clone()), median(mine.clone()));
        let ratio = if e > 0.0 { m / e } else { 0.0 };
        let &(_, low, high) = PAPER.iter().find(|p| p.0 == *name).expect("every workload is in PAPER");
        let paper = if low == high {
            format!("+{:.0}%", low * 100.0)
        } else {
            format!("+{:.0}-{:.0}%", low * 100.0, high * 100.0)
        };
        let failed: Vec<&String> = checks.iter().filter(|c| c.contains("FAILED") || c.contains("MISSING")).collect();
        let threshold = 1.0 + low / 2.0;
        findings.push(Finding {
            why_not: WHY_NOT.iter().find(|w| w.0 == *name).map_or(String::new(), |w| w.1.to_string()),
            claim: format!("{name}: faster on the asynchronous file-system path than on ext4"),
            paper: paper.clone(),
            iopath: format!("{:+.0}% ({ratio:.2}x ext4)", (ratio - 1.0) * 100.0),
            holds: ratio >= threshold && failed.is_empty(),
            rule: format!(
                "iopath's median at least {threshold:.3}x ext4's (half the paper's smallest gain), every check passed"
            ),
        });
        rows.push(vec![
            name.to_string(),
            format!("{e:.0}"),
            format!("{m:.0}"),
            format!("{ratio:.2}x"),
            paper,
            if failed.is_empty() {
                "passed".into()
            } else {
                failed.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; ")
            },
        ]);
        ratios.push(ratio);
        paper_mid.push(1.0 + (low + high) / 2.0);
    }
    let categories: Vec<String> =
        results.iter().map(|r| r.name.split(' ').take(2).collect::<Vec<_>>().join(" ")).collect();
    let series = vec![
        Series {
            name: "iopath / ext4".into(),
            points: ratios.iter().enumerate().map(|(i, r)| (i as f64, *r)).collect(),
        },
        Series {
            name: "the paper's gain (middle)".into(),
            points: paper_mid.iter().enumerate().map(|(i, r)| (i as f64, *r)).collect(),
        },
    ];
    let mut explanation = format!(
        "The paper measured its file-system path (asynchronous I/O stack, lightweight block I/O) inside the kernel \
         on an Optane SSD; here iopath's file system runs in the program's own process through an interposer, on a \
         loop device whose worker shares this machine's CPUs. What wins is one round trip per small fsync (iopath's \
         `journaled` path, the mounts' default) where ext4's jbd2 takes several; what loses is per-call and per-file \
         work in the interposer and a page cache that starts cold with every process. Medians of {rounds} round(s) \
         of each workload on each side, alternating; `iopath fsck` after the last run: {}. scripts/real-apps runs \
         more programs, both idle states and checks every run.",
        if fsck_clean { "clean" } else { "NOT CLEAN" }
    );
    if !missing.is_empty() {
        explanation.push_str(&format!(" Left out: {}.", missing.join("; ")));
    }
    Ok(Section {
        key: "apps".into(),
        title: TITLE.into(),
        source: SOURCE.into(),
        setup: format!("{SETUP}; {rounds} round(s)"),
        explanation,
        tables: vec![DataTable {
            caption: "Throughput on each side (medians), the paper's gain, and what the checks found.".into(),
            columns: ["workload", "ext4 (ops/s)", "iopath (ops/s)", "iopath / ext4", "paper", "checks"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            rows,
        }],
        findings,
        chart: chart(categories, series),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn db_bench_lines_and_script_results_parse() {
        let line = "fillsync     :      83.510 micros/op 11974 ops/sec 1.670 seconds 20000 operations;";
        assert_eq!(db_bench_rate(line, "fillsync"), Some(11974.0));
        assert_eq!(db_bench_rate(line, "readrandom"), None);
        assert_eq!(last_result("iopath: mounted x\n1234 ok\n").unwrap(), (1234.0, "data checked".into()));
        assert!(last_result("12 CORRUPT 3 ok\n").unwrap().1.contains("FAILED"));
        assert!(last_result("Traceback").is_err());
    }
}
