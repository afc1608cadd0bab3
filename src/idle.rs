//! What an idle CPU does here, and a request that idle CPUs poll instead of sleeping.
//!
//! A wake-up of a thread whose CPU is idle costs what that CPU needs to leave
//! its idle state: on bare metal the exit latency of a deep C-state, in a
//! virtual machine a halted vCPU that the host must schedule again. On these
//! VMs (cpuidle driver `haltpoll` with `guest_halt_poll_ns=0`: an idle vCPU
//! halts at once) that is 10-40 µs, more than the I/O it waits for; every
//! completion that wakes a sleeping caller, every loop-device worker woken on
//! the idle CPU, pays it.
//!
//! Linux bounds it with a PM QoS CPU latency request: while a process holds
//! `/dev/cpu_dma_latency` open with 0 written to it, idle CPUs poll rather than
//! halt (the idle governors pick the polling state), and the request ends when
//! the file is closed, with the process if need be. cyclictest and tuned's
//! `latency-performance` profile use the same request. [`IdlePolling`] holds
//! one for as long as it lives (`--idle-poll` on the `iopath` tool); the price
//! is idle CPUs spinning: power on bare metal, host CPU time in a VM.
//! [`IdleFacts`] reads what is in force, for `iopath doctor` and the reports.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;

/// The kernel's PM QoS CPU latency request file.
const CPU_LATENCY_FILE: &str = "/dev/cpu_dma_latency";
/// The limit in force when no one asks for one (`PM_QOS_CPU_LATENCY_DEFAULT_VALUE`, 2000 s).
const NO_LIMIT_US: i32 = 2_000_000_000;

/// A held request that idle CPUs poll (a PM QoS CPU latency limit of 0 µs);
/// dropping it ends the request.
#[derive(Debug)]
pub struct IdlePolling {
    /// Open for as long as the request stands: the kernel ends it at close.
    _request: File,
}

impl IdlePolling {
    /// Asks that idle CPUs poll until the returned value is dropped. Needs
    /// write access to `/dev/cpu_dma_latency` (root, normally).
    pub fn request() -> Result<IdlePolling> {
        let refused = |source: std::io::Error| {
            let hint = match source.raw_os_error() {
                Some(libc::EACCES) | Some(libc::EPERM) => " (only root may ask: run as root, or leave out --idle-poll)",
                Some(libc::ENOENT) => " (this kernel has no PM QoS CPU latency device: leave out --idle-poll)",
                _ => "",
            };
            Error::Os { context: format!("cannot ask that idle CPUs poll through {CPU_LATENCY_FILE}{hint}"), source }
        };
        let mut request = std::fs::OpenOptions::new().write(true).open(CPU_LATENCY_FILE).map_err(refused)?;
        request.write_all(&0i32.to_ne_bytes()).map_err(refused)?;
        Ok(IdlePolling { _request: request })
    }
}

/// One idle state of CPU 0, as cpuidle lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct IdleState {
    /// Its name (`POLL`, `haltpoll`, `C1`, ...).
    pub name: String,
    /// How long leaving it takes, in µs (as the driver declares it).
    pub exit_latency_us: u64,
    /// Switched off by the administrator (`disable`).
    pub disabled: bool,
}

/// How idle CPUs wait on this machine.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IdleFacts {
    /// The cpuidle driver (`haltpoll`, `intel_idle`, `acpi_idle`), if cpuidle is in use.
    pub driver: Option<String>,
    /// The cpuidle governor (`haltpoll`, `menu`, `teo`, `ladder`).
    pub governor: Option<String>,
    /// CPU 0's idle states.
    pub states: Vec<IdleState>,
    /// In a KVM guest with the haltpoll driver: how long an idle vCPU polls
    /// before it halts (`haltpoll.guest_halt_poll_ns`; 0: it halts at once).
    pub guest_halt_poll_ns: Option<u64>,
    /// The PM QoS CPU latency limit now in force, in µs, when it can be read
    /// (root); `Some(0)`: idle CPUs poll. `None` also when no one asks for a limit.
    pub latency_limit_us: Option<i32>,
}

impl IdleFacts {
    /// Reads them from sysfs and `/dev/cpu_dma_latency`.
    pub fn read() -> IdleFacts {
        let trim = |p: &Path| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string());
        let root = Path::new("/sys/devices/system/cpu/cpuidle");
        let mut states = Vec::new();
        for index in 0.. {
            let dir = Path::new("/sys/devices/system/cpu/cpu0/cpuidle").join(format!("state{index}"));
            let Some(name) = trim(&dir.join("name")) else { break };
            states.push(IdleState {
                name,
                exit_latency_us: trim(&dir.join("latency")).and_then(|v| v.parse().ok()).unwrap_or(0),
                disabled: trim(&dir.join("disable")).is_some_and(|v| v == "1"),
            });
        }
        IdleFacts {
            driver: trim(&root.join("current_driver")).filter(|d| d != "none"),
            governor: trim(&root.join("current_governor_ro")).or_else(|| trim(&root.join("current_governor"))),
            states,
            guest_halt_poll_ns: trim(Path::new("/sys/module/haltpoll/parameters/guest_halt_poll_ns"))
                .and_then(|v| v.parse().ok()),
            latency_limit_us: read_latency_limit().filter(|&us| us < NO_LIMIT_US),
        }
    }

    /// Whether idle CPUs poll now (someone holds a 0 µs request).
    pub fn polling(&self) -> bool {
        self.latency_limit_us == Some(0)
    }

    /// Whether an idle CPU here sleeps in a state whose wake-up is expensive:
    /// a vCPU that halts without polling first, or a state deeper than 2 µs.
    pub fn sleeps_deeply(&self) -> bool {
        let halts_at_once = self.driver.as_deref() == Some("haltpoll") && self.guest_halt_poll_ns == Some(0);
        halts_at_once || self.states.iter().any(|s| !s.disabled && s.exit_latency_us > 2)
    }

    /// One line for people: driver, governor, states, the haltpoll setting, the limit.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        match (&self.driver, &self.governor) {
            (Some(d), Some(g)) => parts.push(format!("cpuidle driver {d}, governor {g}")),
            (Some(d), None) => parts.push(format!("cpuidle driver {d}")),
            _ => parts.push("no cpuidle driver (the idle loop halts)".into()),
        }
        if !self.states.is_empty() {
            let states: Vec<String> = self
                .states
                .iter()
                .map(|s| format!("{} {} us{}", s.name, s.exit_latency_us, if s.disabled { " (off)" } else { "" }))
                .collect();
            parts.push(format!("states {}", states.join(", ")));
        }
        if let Some(ns) = self.guest_halt_poll_ns {
            parts.push(if ns == 0 {
                "guest_halt_poll_ns=0 (an idle vCPU halts at once; the host must run it again to wake it)".into()
            } else {
                format!("guest_halt_poll_ns={ns} (an idle vCPU polls that long before it halts)")
            });
        }
        parts.push(match self.latency_limit_us {
            Some(0) => "PM QoS CPU latency limit 0 us: idle CPUs poll".into(),
            Some(us) => format!("PM QoS CPU latency limit {us} us"),
            None => "no PM QoS CPU latency limit".into(),
        });
        parts.join("; ")
    }
}

/// Whether idle CPUs poll now (a 0 µs PM QoS CPU latency limit is in force,
/// whoever asked); `false` where the limit cannot be read (not root). Reads
/// only the limit, not the rest of [`IdleFacts`].
pub fn polling_now() -> bool {
    read_latency_limit() == Some(0)
}

/// The PM QoS CPU latency limit in force, in µs (root only; opening the file
/// adds a request with no limit, which ends when it is closed here).
fn read_latency_limit() -> Option<i32> {
    let mut file = File::open(CPU_LATENCY_FILE).ok()?;
    let mut value = [0u8; 4];
    file.read_exact(&mut value).ok()?;
    Some(i32::from_ne_bytes(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_request_keeps_idle_cpus_polling_until_it_is_dropped() {
        // Only where the request can be made (root with PM QoS): elsewhere `request`
        // must fail with an error that says what to do.
        let before = IdleFacts::read();
        match IdlePolling::request() {
            Ok(held) => {
                assert_eq!(IdleFacts::read().latency_limit_us, Some(0), "the limit while the request is held");
                assert!(IdleFacts::read().polling() && polling_now());
                drop(held);
                // Another process may hold a request of its own; ours must be gone.
                assert_eq!(IdleFacts::read().latency_limit_us, before.latency_limit_us);
                assert_eq!(polling_now(), before.polling());
            }
            Err(e) => {
                let text = e.to_string();
                assert!(text.contains("/dev/cpu_dma_latency"), "{text}");
            }
        }
    }

    #[test]
    fn the_summary_says_what_a_halting_vcpu_costs() {
        let facts = IdleFacts {
            driver: Some("haltpoll".into()),
            governor: Some("haltpoll".into()),
            states: vec![
                IdleState { name: "POLL".into(), exit_latency_us: 0, disabled: false },
                IdleState { name: "haltpoll".into(), exit_latency_us: 1, disabled: false },
            ],
            guest_halt_poll_ns: Some(0),
            latency_limit_us: None,
        };
        assert!(facts.sleeps_deeply());
        assert!(!facts.polling());
        let text = facts.summary();
        assert!(text.contains("halts at once"), "{text}");
        assert!(text.contains("no PM QoS CPU latency limit"), "{text}");
        let polling = IdleFacts { guest_halt_poll_ns: Some(200_000), latency_limit_us: Some(0), ..facts };
        assert!(!polling.sleeps_deeply());
        assert!(polling.summary().contains("idle CPUs poll"));
    }
}
