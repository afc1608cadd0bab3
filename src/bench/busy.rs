//! What else is using the CPUs just before a benchmark starts.
//!
//! On a 2-vCPU machine one stray spinning process halves the CPUs a run
//! has, and on a loop device (whose worker runs on the same CPUs) it changes
//! the figures in either direction: it once made this VM's loop device look
//! 3-4x faster, every hand-off to the worker staying on one CPU. So `bench`
//! and `compare` look first (a short sample of `/proc`) and say who is busy.

use std::collections::HashMap;
use std::time::Duration;

/// Another process's share of the CPUs during the sample.
#[derive(Debug, Clone, PartialEq)]
pub struct BusyProcess {
    /// Process id.
    pub pid: u32,
    /// Its command name (`/proc/PID/stat`'s second field).
    pub name: String,
    /// CPU time it used, as a fraction of one CPU over the sample.
    pub cpus: f64,
}

/// A process's name and CPU time (user + system, clock ticks) from the text
/// of its `/proc/PID/stat`; `None` if the text is not such a line. The name
/// sits in parentheses and may itself hold spaces and parentheses.
pub fn parse_stat(text: &str) -> Option<(String, u64)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?.to_string();
    // After the name: state (field 3) ... utime (14), stime (15).
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((name, utime + stime))
}

fn sample() -> HashMap<u32, (String, u64)> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if let Some(stat) = std::fs::read_to_string(entry.path().join("stat")).ok().as_deref().and_then(parse_stat) {
            out.insert(pid, stat);
        }
    }
    out
}

/// The processes other than this one that used at least `min_cpus` of a
/// CPU over `window`, busiest first. Empty where `/proc` cannot be read.
pub fn others_busy(window: Duration, min_cpus: f64) -> Vec<BusyProcess> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks <= 0 {
        return Vec::new();
    }
    let me = std::process::id();
    let before = sample();
    std::thread::sleep(window);
    let after = sample();
    let seconds = window.as_secs_f64().max(1e-3);
    let mut busy: Vec<BusyProcess> = after
        .into_iter()
        .filter(|(pid, _)| *pid != me)
        .filter_map(|(pid, (name, t1))| {
            let t0 = before.get(&pid).map_or(t1, |b| b.1);
            let cpus = t1.saturating_sub(t0) as f64 / ticks as f64 / seconds;
            (cpus >= min_cpus).then_some(BusyProcess { pid, name, cpus })
        })
        .collect();
    busy.sort_by(|a, b| b.cpus.total_cmp(&a.cpus));
    busy
}

/// A warning naming what is busy, or `None` when nothing is.
pub fn warning(busy: &[BusyProcess]) -> Option<String> {
    if busy.is_empty() {
        return None;
    }
    let total: f64 = busy.iter().map(|b| b.cpus).sum();
    let names: Vec<String> =
        busy.iter().take(4).map(|b| format!("{} (pid {}) {:.0}%", b.name, b.pid, 100.0 * b.cpus)).collect();
    Some(format!(
        "note: other processes were using {:.0}% of a CPU just before this run: {}. The figures will show it; \
         stop them for a clean measurement (or use --hogs to measure contention on purpose).",
        100.0 * total,
        names.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_with_awkward_names() {
        let line = "16374 (iopath-io (0)) S 1 16374 16374 0 -1 4194304 1000 0 0 0 395000 12 0 0 20 0 18 0 100 0 0";
        assert_eq!(parse_stat(line), Some(("iopath-io (0)".to_string(), 395012)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (init) S 0"), None, "too short");
    }

    #[test]
    fn a_busy_thread_of_another_process_is_named() {
        // This process is left out by design; a child that spins is not.
        let mut child = std::process::Command::new("sh").args(["-c", "while :; do :; done"]).spawn().expect("sh runs");
        // Any CPU time at all counts here (a loaded test machine may give the
        // shell little of it); a few tries, so a slow start cannot fail the test.
        let mut busy = Vec::new();
        for _ in 0..5 {
            busy = others_busy(Duration::from_millis(400), 0.001);
            if busy.iter().any(|b| b.pid == child.id()) {
                break;
            }
        }
        child.kill().ok();
        child.wait().ok();
        assert!(busy.iter().any(|b| b.pid == child.id()), "the spinning shell was not seen: {busy:?}");
        let text = warning(&busy).expect("a warning");
        assert!(text.contains(&format!("pid {}", child.id())), "{text}");
        assert_eq!(warning(&[]), None);
    }
}
