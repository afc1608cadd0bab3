//! Sizes, durations and dates written the way fio and ls write them.
//!
//! Sizes take a binary suffix (`512`, `4k`, `128KiB`, `1g`, `2t`; fio's
//! default `kb_base=1024`). Durations take a unit (`500ns`, `20us`, `5ms`,
//! `2s`, `1m`, `1h`); a bare number means seconds, as in fio's `runtime=`.

use crate::error::{Error, Result};
use std::time::Duration;

/// Parses a size such as `4k`, `1g`, `128KiB` or `4096` into bytes.
pub fn parse_size(text: &str) -> Result<u64> {
    let bad = |hint: &str| Error::spec("size", text, hint.to_string());
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    if digits.is_empty() {
        return Err(bad("expected a number with an optional k, m, g or t suffix, e.g. 4k or 1g"));
    }
    let number: u64 = digits.parse().map_err(|_| bad("number too large"))?;
    let shift = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad("unknown suffix; use k, m, g or t (powers of 1024)")),
    };
    number.checked_mul(1u64 << shift).ok_or_else(|| bad("size does not fit in 64 bits"))
}

/// Parses a duration such as `2s`, `500ms`, `20us` or `1.5us`; a bare number is seconds.
pub fn parse_duration(text: &str) -> Result<Duration> {
    parse_duration_default_unit(text, 1_000_000_000.0)
}

/// Parses a duration whose bare number is in the unit of `unit_ns` nanoseconds.
pub fn parse_duration_default_unit(text: &str, unit_ns: f64) -> Result<Duration> {
    let bad = |hint: &str| Error::spec("duration", text, hint.to_string());
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let number: f64 =
        digits.parse().map_err(|_| bad("expected a number with a unit, e.g. 2s, 500ms, 20us or 800ns"))?;
    let scale = match suffix.to_ascii_lowercase().as_str() {
        "" => unit_ns,
        "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" | "sec" => 1e9,
        "m" | "min" => 60e9,
        "h" => 3600e9,
        _ => return Err(bad("unknown unit; use ns, us, ms, s, m or h")),
    };
    let nanos = number * scale;
    if !nanos.is_finite() || nanos < 0.0 || nanos > u64::MAX as f64 {
        return Err(bad("duration out of range"));
    }
    Ok(Duration::from_nanos(nanos.round() as u64))
}

/// Formats a byte count with a binary suffix (`4KiB`, `1GiB`) for reports.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes;
    let mut unit = 0;
    while unit < UNITS.len() - 1 && value >= 1024 && value.is_multiple_of(1024) {
        value /= 1024;
        unit += 1;
    }
    format!("{value}{}", UNITS[unit])
}

/// `YYYY-MM-DD HH:MM UTC` from seconds since the epoch (civil-from-days).
pub fn utc_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_civil() {
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_date(1_795_000_000), "2026-11-18 11:06 UTC");
        assert_eq!(utc_date(951_782_400), "2000-02-29 00:00 UTC");
    }

    #[test]
    fn sizes_follow_fio() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("4k").unwrap(), 4096);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("128KiB").unwrap(), 131072);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("2t").unwrap(), 2 << 40);
        assert!(parse_size("4x").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("k").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("16777216t").is_err());
    }

    #[test]
    fn durations_follow_fio() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.52us").unwrap(), Duration::from_nanos(1520));
        assert_eq!(parse_duration("800ns").unwrap(), Duration::from_nanos(800));
        assert!(parse_duration("2 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_duration_default_unit("7", 1e3).unwrap(), Duration::from_micros(7));
    }

    #[test]
    fn sizes_format_readably() {
        assert_eq!(format_size(4096), "4KiB");
        assert_eq!(format_size(1 << 30), "1GiB");
        assert_eq!(format_size(1000), "1000B");
    }
}
