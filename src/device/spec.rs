//! Device spec strings: `emu:PRESET[,k=v...]`, `null[,size=N]`,
//! `uring:PATH[,k=v...]`, `psync:PATH[,k=v...]`.
//!
//! Each backend parses its own options (in its own file) from an
//! [`Options`] list; a key no backend takes is an error that lists the keys
//! that would have been accepted.

use super::{Device, emu, null, psync, uring};
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
            items.push((key.trim().to_ascii_lowercase(), value.trim().to_string()));
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
                format!("unknown option '{key}' for {}; known options: {}", self.backend, known.join(", ")),
            )),
        }
    }
}

/// A parsed device spec.
#[derive(Debug, Clone)]
pub enum DeviceSpec {
    /// The emulated SSD.
    Emu(emu::EmuConfig),
    /// No device time, no data.
    Null(null::NullConfig),
    /// io_uring on a file or block device.
    Uring(uring::UringConfig),
    /// pread/pwrite on a file or block device.
    Psync(psync::PsyncConfig),
}

impl DeviceSpec {
    /// Parses a spec string. `default_size` (the benchmark's `--size`) sizes
    /// emulated devices and files that must be created.
    pub fn parse(spec: &str, default_size: Option<u64>) -> Result<DeviceSpec> {
        let (kind, rest) = spec.split_once(':').unwrap_or((spec, ""));
        let mut fields: Vec<&str> = rest.split(',').collect();
        let first = if fields.is_empty() { "" } else { fields.remove(0) };
        match kind {
            "emu" => {
                emu::EmuConfig::parse(first, Options::parse("emu", spec, &fields)?, default_size).map(DeviceSpec::Emu)
            }
            "null" => {
                // `null` and `null:size=1g` both work.
                let mut all = fields.clone();
                all.insert(0, first);
                null::NullConfig::parse(Options::parse("null", spec, &all)?, default_size).map(DeviceSpec::Null)
            }
            "uring" => uring::UringConfig::parse(first, Options::parse("uring", spec, &fields)?, default_size)
                .map(DeviceSpec::Uring),
            "psync" => psync::PsyncConfig::parse(first, Options::parse("psync", spec, &fields)?, default_size)
                .map(DeviceSpec::Psync),
            _ => Err(Error::spec(
                "device spec",
                spec,
                "expected emu:PRESET[,k=v] (presets: dram-ssd, optane, zssd, nand, null, custom), null, \
                 uring:PATH[,k=v] or psync:PATH[,k=v]",
            )),
        }
    }

    /// Opens the device.
    pub fn open(&self) -> Result<Arc<dyn Device>> {
        Ok(match self {
            DeviceSpec::Emu(c) => Arc::new(emu::EmuDevice::open(c)?),
            DeviceSpec::Null(c) => Arc::new(null::NullDevice::new(c)),
            DeviceSpec::Uring(c) => Arc::new(uring::UringDevice::open(c)?),
            DeviceSpec::Psync(c) => Arc::new(psync::PsyncDevice::open(c)?),
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
        let DeviceSpec::Null(c) = DeviceSpec::parse("null:size=2g", None).unwrap() else { panic!() };
        assert_eq!(c.size, 2 << 30);
        assert!(matches!(DeviceSpec::parse("null", None).unwrap(), DeviceSpec::Null(_)));
    }
}
