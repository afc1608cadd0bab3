//! Device spec strings: `emu:PRESET[,k=v...]`, `null[,size=N]`,
//! `uring:PATH[,k=v...]`, `psync:PATH[,k=v...]`, `aio:PATH[,k=v...]`.
//!
//! Each backend parses its own options (in its own file) from an
//! [`Options`] list; a key no backend takes is an error that lists the keys
//! that would have been accepted. The fault-injection options
//! ([`fault::KNOWN`]) are taken first, from any backend's spec, and wrap the
//! device in a [`FaultDevice`](fault::FaultDevice).

use super::{Device, aio, emu, fault, null, psync, uring};
use crate::error::{Error, Result};
use crate::units::{parse_duration_default_unit, parse_size};
use std::sync::Arc;
use std::time::Duration;

/// `key=value` options after a spec's first field.
#[derive(Debug, Clone)]
pub struct Options {
    backend: &'static str,
    spec: String,
    items: Vec<(String, String)>,
}

impl Options {
    /// Splits `a=1,b=2` (already stripped of the backend and first field).
    pub fn parse(backend: &'static str, spec: &str, fields: &[&str]) -> Result<Options> {
        let mut items = Vec::new();
        for field in fields.iter().filter(|f| !f.is_empty()) {
            let Some((key, value)) = field.split_once('=') else {
                return Err(Error::spec(
                    "device spec",
                    spec,
                    format!("option '{field}' for {backend} must look like key=value"),
                ));
            };
            let key = key.trim().to_ascii_lowercase();
            if items.iter().any(|(k, _)| *k == key) {
                return Err(Error::spec("device spec", spec, format!("option '{key}' is given twice")));
            }
            items.push((key, value.trim().to_string()));
        }
        Ok(Options { backend, spec: spec.to_string(), items })
    }

    /// Removes and returns the value of `key`, if given.
    pub fn take(&mut self, key: &str) -> Option<String> {
        let pos = self.items.iter().position(|(k, _)| k == key)?;
        Some(self.items.remove(pos).1)
    }

    /// Takes a size option (`size=4g`).
    pub fn take_size(&mut self, key: &str) -> Result<Option<u64>> {
        self.take(key).map(|v| parse_size(&v)).transpose()
    }

    /// Takes a duration option whose bare number is microseconds (`xfer=3us`, `cmd=1.52`).
    pub fn take_micros(&mut self, key: &str) -> Result<Option<Duration>> {
        self.take(key).map(|v| parse_duration_default_unit(&v, 1e3)).transpose()
    }

    /// Takes a number option.
    pub fn take_num<T: std::str::FromStr>(&mut self, key: &str) -> Result<Option<T>> {
        match self.take(key) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| Error::spec("device spec", self.spec.clone(), format!("{key}={v} is not a valid number"))),
        }
    }

    /// Takes a boolean option (`1/0`, `on/off`, `true/false`, `yes/no`).
    pub fn take_bool(&mut self, key: &str) -> Result<Option<bool>> {
        match self.take(key).as_deref() {
            None => Ok(None),
            Some("1" | "on" | "true" | "yes") => Ok(Some(true)),
            Some("0" | "off" | "false" | "no") => Ok(Some(false)),
            Some(v) => Err(Error::spec("device spec", self.spec.clone(), format!("{key}={v}: expected 1 or 0"))),
        }
    }

    /// An error for this spec.
    pub fn error(&self, hint: impl Into<String>) -> Error {
        Error::spec("device spec", self.spec.clone(), hint)
    }

    /// Fails if any option was not taken, naming the ones that are accepted.
    pub fn finish(self, known: &[&str]) -> Result<()> {
        match self.items.first() {
            None => Ok(()),
            Some((key, _)) => Err(Error::spec(
                "device spec",
                self.spec.clone(),
                format!(
                    "unknown option '{key}' for {}; known options: {}; fault injection (any device): {}",
                    self.backend,
                    known.join(", "),
                    fault::KNOWN.join(", ")
                ),
            )),
        }
    }
}

/// A parsed device spec: a backend and, if any fault option was given, the
/// faults to inject around it.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    /// The backend and its options.
    pub backend: Backend,
    /// Faults to inject (and the ownership audit); `None` leaves the device unwrapped.
    pub faults: Option<fault::FaultConfig>,
}

/// The backends iopath knows.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The emulated SSD.
    Emu(emu::EmuConfig),
    /// No device time, no data.
    Null(null::NullConfig),
    /// io_uring on a file or block device.
    Uring(uring::UringConfig),
    /// pread/pwrite on a file or block device.
    Psync(psync::PsyncConfig),
    /// Linux native AIO on a file or block device.
    Aio(aio::AioConfig),
}

impl DeviceSpec {
    /// The file or block device it names, if it names one (`None` for an
    /// emulated device in memory and the null device, which no other process sees).
    pub fn backing_file(&self) -> Option<std::path::PathBuf> {
        match &self.backend {
            Backend::Emu(c) => c.file.clone(),
            _ => self.target().map(|t| t.path.clone()),
        }
    }

    /// The file or block device of a kernel backend (uring, psync, aio).
    pub fn target(&self) -> Option<&super::target::TargetConfig> {
        match &self.backend {
            Backend::Uring(uring::UringConfig { target, .. })
            | Backend::Psync(psync::PsyncConfig { target })
            | Backend::Aio(aio::AioConfig { target }) => Some(target),
            Backend::Emu(_) | Backend::Null(_) => None,
        }
    }

    /// [`DeviceSpec::target`], to change how it is opened.
    pub fn target_mut(&mut self) -> Option<&mut super::target::TargetConfig> {
        match &mut self.backend {
            Backend::Uring(uring::UringConfig { target, .. })
            | Backend::Psync(psync::PsyncConfig { target })
            | Backend::Aio(aio::AioConfig { target }) => Some(target),
            Backend::Emu(_) | Backend::Null(_) => None,
        }
    }

    /// Parses a spec string. `default_size` (the benchmark's `--size`) sizes
    /// emulated devices and files that must be created.
    pub fn parse(spec: &str, default_size: Option<u64>) -> Result<DeviceSpec> {
        // A bare path (no `kind:`) that exists is a file or block device on io_uring, as
        // `iopath mkfs` takes it: one way to name a device in every subcommand.
        if !spec.contains(':') && !spec.starts_with("null") && std::path::Path::new(spec).exists() {
            return DeviceSpec::parse(&format!("uring:{spec}"), default_size);
        }
        // `emu:dram-ssd,k=v`, `null`, `null:size=1g` and `null,size=1g` all work.
        let (kind, rest) = match spec.find([':', ',']) {
            Some(i) if spec.as_bytes()[i] == b':' => (&spec[..i], &spec[i + 1..]),
            Some(i) => (&spec[..i], &spec[i..]),
            None => (spec, ""),
        };
        let mut fields: Vec<&str> = rest.split(',').collect();
        let first = if fields.is_empty() { "" } else { fields.remove(0) };
        let options = |backend: &'static str, fields: &[&str]| -> Result<(Options, Option<fault::FaultConfig>)> {
            let mut opts = Options::parse(backend, spec, fields)?;
            let faults = fault::FaultConfig::take(&mut opts)?;
            Ok((opts, faults))
        };
        let (backend, faults) = match kind {
            "emu" => {
                let (opts, faults) = options("emu", &fields)?;
                (Backend::Emu(emu::EmuConfig::parse(first, opts, default_size)?), faults)
            }
            "null" => {
                let mut all = fields.clone();
                all.insert(0, first);
                let (opts, faults) = options("null", &all)?;
                (Backend::Null(null::NullConfig::parse(opts, default_size)?), faults)
            }
            "uring" => {
                let (opts, faults) = options("uring", &fields)?;
                (Backend::Uring(uring::UringConfig::parse(first, opts, default_size)?), faults)
            }
            "psync" => {
                let (opts, faults) = options("psync", &fields)?;
                (Backend::Psync(psync::PsyncConfig::parse(first, opts, default_size)?), faults)
            }
            "aio" => {
                let (opts, faults) = options("aio", &fields)?;
                (Backend::Aio(aio::AioConfig::parse(first, opts, default_size)?), faults)
            }
            _ => {
                return Err(Error::spec(
                    "device spec",
                    spec,
                    if spec.contains(':') {
                        "expected emu:PRESET[,k=v] (presets: dram-ssd, optane, zssd, nand, null, custom), null, \
                         uring:PATH[,k=v], psync:PATH[,k=v], aio:PATH[,k=v] or the path of a file or block device"
                    } else {
                        "no such file or block device (a bare path must exist; uring:PATH creates a file at --size), \
                         and not a device spec: emu:PRESET[,k=v], null, uring:PATH[,k=v], psync:PATH[,k=v] or aio:PATH[,k=v]"
                    },
                ));
            }
        };
        Ok(DeviceSpec { backend, faults })
    }

    /// Whether the device keeps data someone else may own: a file or block
    /// device, or an emulated device backed by a file (not emulated memory,
    /// which exists only for the run, nor `null`).
    pub fn holds_user_data(&self) -> bool {
        match &self.backend {
            Backend::Emu(c) => c.file.is_some(),
            Backend::Null(_) => false,
            _ => self.target().is_some(),
        }
    }

    /// Says what may be written: `read_only` opens files and block devices
    /// read-only (and maps an emulated device's file copy-on-write); `guard`
    /// decides what an existing target iopath did not create may have
    /// written to it.
    pub fn protect(&mut self, guard: super::target::Guard, read_only: bool) {
        if let Some(target) = self.target_mut() {
            target.guard = guard;
            target.read_only |= read_only;
        } else if let Backend::Emu(c) = &mut self.backend {
            c.guard = guard;
            c.read_only |= read_only;
        }
    }

    /// Opens the device (wrapped for fault injection when faults were given).
    pub fn open(&self) -> Result<Arc<dyn Device>> {
        let device: Arc<dyn Device> = match &self.backend {
            Backend::Emu(c) => Arc::new(emu::EmuDevice::open(c)?),
            Backend::Null(c) => Arc::new(null::NullDevice::new(c)),
            Backend::Uring(c) => Arc::new(uring::UringDevice::open(c)?),
            Backend::Psync(c) => Arc::new(psync::PsyncDevice::open(c)?),
            Backend::Aio(c) => Arc::new(aio::AioDevice::open(c)?),
        };
        Ok(match &self.faults {
            Some(faults) => Arc::new(fault::FaultDevice::new(device, faults.clone())),
            None => device,
        })
    }
}

/// Parses and opens a device spec in one step.
pub fn open_device(spec: &str, default_size: Option<u64>) -> Result<Arc<dyn Device>> {
    DeviceSpec::parse(spec, default_size)?.open()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(spec: &str) -> String {
        DeviceSpec::parse(spec, None).unwrap_err().to_string()
    }

    #[test]
    fn unknown_backend_lists_the_known_ones() {
        let e = err("floppy:/dev/fd0");
        assert!(e.contains("emu:PRESET"), "{e}");
    }

    #[test]
    fn a_bare_path_is_a_file_on_io_uring_if_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk.img");
        std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
        let Backend::Uring(c) = DeviceSpec::parse(file.to_str().unwrap(), None).unwrap().backend else {
            panic!("a bare path is not io_uring")
        };
        assert_eq!(c.target.path, file);
        // A typo of a spec is not a file to create: it must exist.
        let e = err(dir.path().join("none.img").to_str().unwrap());
        assert!(e.contains("no such file") && e.contains("uring:PATH"), "{e}");
        let e = err("emu-dram-ssd");
        assert!(e.contains("emu:PRESET"), "{e}");
    }

    #[test]
    fn unknown_option_lists_the_known_ones() {
        let e = err("emu:dram-ssd,colour=blue");
        assert!(e.contains("unknown option 'colour'"), "{e}");
        assert!(e.contains("xfer"), "{e}");
    }

    #[test]
    fn malformed_option_is_explained() {
        let e = err("emu:dram-ssd,fast");
        assert!(e.contains("key=value"), "{e}");
    }

    #[test]
    fn null_takes_size() {
        let Backend::Null(c) = DeviceSpec::parse("null:size=2g", None).unwrap().backend else { panic!() };
        assert_eq!(c.size, 2 << 30);
        assert!(matches!(DeviceSpec::parse("null", None).unwrap().backend, Backend::Null(_)));
    }

    #[test]
    fn fault_options_work_on_every_backend() {
        for spec in
            ["emu:dram-ssd,fail_nth=3", "null,commit_fail_rate=0.5", "uring:/x,wait_fail_nth=2", "psync:/x,audit=1"]
        {
            let parsed = DeviceSpec::parse(spec, None).unwrap();
            assert!(parsed.faults.is_some(), "{spec}");
        }
        assert!(DeviceSpec::parse("emu:dram-ssd", None).unwrap().faults.is_none());
    }
}
