//! What the interposer routes, from the environment.
//!
//! - `IOPATH_FILES`: glob patterns, separated by `:` or `,`, matched against
//!   a file's absolute path (`*` and `?` stay within one path component,
//!   `**` crosses them). Unset or empty: nothing is routed.
//! - `IOPATH_PATH`: the iopath path spec for every routed file (default
//!   `2q`: blocking threads' requests merged into shared device batches by a
//!   dispatcher that spins on the device while the callers sleep).
//! - `IOPATH_LOG=1`: one line on stderr per routing decision and a summary
//!   of routed and passed-through calls at exit. `IOPATH_LOG=/abs/path`:
//!   the same lines appended to that file instead (outside every mount),
//!   for a program that keeps its children's stderr: cargo stores each
//!   line rustc writes there in a file of its target directory, and with
//!   that directory on a mount every line of the log cost a hand-over of
//!   the mount (a build took 61-75 s with the log on stderr, 36-38 s
//!   without it).
//! - `IOPATH_MOUNT=DIR=DEVICE[;DIR=DEVICE]`: every path under DIR is served
//!   by the iopath file system on DEVICE (a device spec or a bare path;
//!   made with `iopath mkfs`); see `mount.rs`. A relative DIR is taken
//!   against the working directory when the program starts.
//! - `IOPATH_MOUNT_WAIT`: seconds to wait for another process that has a
//!   mount's device mounted (default 10; then calls into the mount fail
//!   with EBUSY and a message naming that process; calls within another
//!   such stretch only look, without waiting again).
//! - `IOPATH_FSYNC_PATH`: the mounts' fsync path (`conventional`, `aios`,
//!   `journaled`; default `journaled`, measured fastest for programs: see
//!   `mount.rs`).
//! - `IOPATH_NAMESPACE_COMMIT`: when a mount's creates, unlinks, renames,
//!   mkdirs and rmdirs reach the device: `written` (the default: in the
//!   journal before the call returns, so a killed process keeps them, as
//!   with the kernel) or `deferred` (at the next fsync; a killed process
//!   loses them). See `iopath::fs::NamespaceCommit`.
//! - `IOPATH_SHM_LOG`: the size of each mount's shared-memory log (a size;
//!   `0` turns it off; default 8 MiB): with `written`, the changes go into
//!   a file in `/dev/shm` that outlives the process, and the journal writes
//!   them to the device in groups (`iopath::fs::shm_log`).
//! - `IOPATH_CACHE`: the mounts' page cache bound (a size: `256m`, `2g`;
//!   default an eighth of the machine's memory, at least 64 MiB: buffered
//!   programs count on a cache as large as the kernel's, and pages are
//!   taken only as files are read).
//! - `IOPATH_READ_AROUND`: the mounts' read-around cluster (a size; `0`
//!   turns it off; default 64 KiB): while the page cache has room, a read
//!   that misses also reads the uncached blocks around it, out to the
//!   aligned cluster that holds it (`iopath::fs::MountOptions::read_around_bytes`).
//! - `IOPATH_WRITE_BEHIND=0`: the mounts keep long streams of writes dirty
//!   until an fsync, a sync or the dirty budget instead of writing them
//!   behind the writer (`iopath::fs::MountOptions::write_behind`).
//! - `IOPATH_CARRY`: the bound of each mount's carried cache (a size; `0`
//!   turns it off; default the page cache's bound, at most 1 GiB): the clean
//!   blocks a process leaves in `/dev/shm` at exit for the next process that
//!   mounts the device (`iopath::fs::carry`), as the kernel's page cache
//!   outlives a process.
//! - `IOPATH_FRAMES`: the bound of the page frames the process takes from
//!   a file in `/dev/shm` that the next process takes after it (a size;
//!   `0` turns it off; default 512 MiB, at most a sixteenth of the
//!   machine's memory): fresh memory is zeroed and, in a virtual machine
//!   that gives freed memory back to its host, faulted in there again
//!   (`iopath::frames`).
//! - `IOPATH_IDLE_POLL=1`: while the program runs, ask that idle CPUs poll
//!   instead of halting (`iopath::idle::IdlePolling`; root only, a refusal is
//!   logged and changes nothing else).

/// The interposer's settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// Patterns of files to route.
    pub files: Vec<String>,
    /// The path spec of each file's engine.
    pub path: String,
    /// Print routing decisions and a summary.
    pub log: bool,
    /// Where the log goes if not to stderr (`IOPATH_LOG` was an absolute path).
    pub log_file: Option<std::path::PathBuf>,
    /// Ask that idle CPUs poll while the program runs.
    pub idle_poll: bool,
    /// Mounts: (directory, device).
    pub mounts: Vec<(String, String)>,
    /// The mounts' fsync path, if set.
    pub fsync_path: Option<iopath::fs::FsyncPath>,
    /// When the mounts' namespace changes reach the device, if set.
    pub namespace_commit: Option<iopath::fs::NamespaceCommit>,
    /// How long to wait for another process to let go of a mount, in milliseconds.
    pub mount_wait_ms: u64,
    /// The mounts' page cache bound in bytes, if set.
    pub cache_bytes: Option<u64>,
    /// The mounts' carried cache bound in bytes, if set (0: none).
    pub carry_bytes: Option<u64>,
    /// The bound of the page frames kept in /dev/shm in bytes, if set (0: none).
    pub frames_bytes: Option<u64>,
    /// The size of each mount's shared-memory log in bytes, if set (0: none).
    pub shm_log_bytes: Option<u64>,
    /// Whether the mounts write long streams behind the writer, if set
    /// (`IOPATH_WRITE_BEHIND=0` turns it off).
    pub write_behind: Option<bool>,
    /// The mounts' read-around cluster in bytes, if set (`IOPATH_READ_AROUND`; 0: none).
    pub read_around_bytes: Option<u64>,
}

/// The path used when `IOPATH_PATH` is not set: each of the program's
/// threads polls its own ring and yields between looks (through the
/// interposer on a loop device it was ahead of `2q` and `stm` for fio at 1,
/// 4 and 16 jobs and for db_bench at 1 and 4 threads; README).
pub const DEFAULT_PATH: &str = "auto";

impl Config {
    /// Reads the settings from the environment.
    pub fn from_env() -> Config {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        fn parsed<T>(name: &str, value: Option<String>, parse: impl Fn(&str) -> iopath::Result<T>) -> Option<T> {
            value.and_then(|v| match parse(&v) {
                Ok(p) => Some(p),
                Err(e) => {
                    crate::say(&format!("{name}: {e}; using the default"));
                    None
                }
            })
        }
        let fsync_path = parsed("IOPATH_FSYNC_PATH", var("IOPATH_FSYNC_PATH"), iopath::fs::FsyncPath::parse);
        let namespace_commit =
            parsed("IOPATH_NAMESPACE_COMMIT", var("IOPATH_NAMESPACE_COMMIT"), iopath::fs::NamespaceCommit::parse);
        Config {
            idle_poll: var("IOPATH_IDLE_POLL").is_some_and(|v| v != "0"),
            mounts: var("IOPATH_MOUNT").map(|v| parse_mounts(&v)).unwrap_or_default(),
            fsync_path,
            namespace_commit,
            cache_bytes: parsed("IOPATH_CACHE", var("IOPATH_CACHE"), iopath::units::parse_size),
            carry_bytes: parsed("IOPATH_CARRY", var("IOPATH_CARRY"), iopath::units::parse_size),
            frames_bytes: parsed("IOPATH_FRAMES", var("IOPATH_FRAMES"), iopath::units::parse_size),
            shm_log_bytes: parsed("IOPATH_SHM_LOG", var("IOPATH_SHM_LOG"), iopath::units::parse_size),
            write_behind: var("IOPATH_WRITE_BEHIND").map(|v| v != "0"),
            read_around_bytes: parsed("IOPATH_READ_AROUND", var("IOPATH_READ_AROUND"), iopath::units::parse_size),
            mount_wait_ms: var("IOPATH_MOUNT_WAIT")
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|s| *s >= 0.0)
                .map_or(10_000, |s| (s * 1000.0) as u64),
            ..Config::from_values(
                var("IOPATH_FILES").as_deref(),
                var("IOPATH_PATH").as_deref(),
                var("IOPATH_LOG").as_deref(),
            )
        }
    }

    /// Builds the settings from the variables' values.
    pub fn from_values(files: Option<&str>, path: Option<&str>, log: Option<&str>) -> Config {
        Config {
            files: files.unwrap_or_default().split([':', ',']).filter(|p| !p.is_empty()).map(str::to_string).collect(),
            // 2q, not stm: measured through the interposer (scripts/real-clients, README), 2q was
            // ahead of stm for fio at 1, 4 and 16 jobs and for db_bench at 4 and 16 threads.
            path: path.unwrap_or(DEFAULT_PATH).to_string(),
            log: log.is_some_and(|v| v != "0"),
            log_file: log.filter(|v| v.starts_with('/')).map(std::path::PathBuf::from),
            idle_poll: false,
            mounts: Vec::new(),
            fsync_path: None,
            namespace_commit: None,
            mount_wait_ms: 10_000,
            cache_bytes: None,
            carry_bytes: None,
            frames_bytes: None,
            shm_log_bytes: None,
            write_behind: None,
            read_around_bytes: None,
        }
    }

    /// Whether `path` matches one of the patterns.
    pub fn wants(&self, path: &str) -> bool {
        self.files.iter().any(|p| glob_match(p.as_bytes(), path.as_bytes()))
    }
}

/// `DIR=DEVICE[;DIR=DEVICE]` as (directory, device) pairs; a malformed
/// entry is said on stderr and skipped.
pub fn parse_mounts(text: &str) -> Vec<(String, String)> {
    text.split(';')
        .filter(|m| !m.trim().is_empty())
        .filter_map(|m| match m.split_once('=') {
            Some((dir, device)) if !dir.is_empty() && !device.is_empty() => Some((dir.to_string(), device.to_string())),
            _ => {
                crate::say(&format!("IOPATH_MOUNT: '{m}' is not DIR=DEVICE; skipped"));
                None
            }
        })
        .collect()
}

/// Shell-style matching: `?` one character and `*` any run, neither crossing
/// `/`; `**` any run including `/`.
pub fn glob_match(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) if rest.first() == Some(&b'*') => {
            let rest = &rest[1..];
            (0..=text.len()).any(|i| glob_match(rest, &text[i..]))
        }
        Some((b'*', rest)) => {
            let run = text.iter().position(|&c| c == b'/').unwrap_or(text.len());
            (0..=run).any(|i| glob_match(rest, &text[i..]))
        }
        Some((b'?', rest)) => text.first().is_some_and(|&c| c != b'/') && glob_match(rest, &text[1..]),
        Some((&c, rest)) => text.first() == Some(&c) && glob_match(rest, &text[1..]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_as_a_shell_does() {
        assert!(glob_match(b"/data/*.sst", b"/data/000012.sst"));
        assert!(!glob_match(b"/data/*.sst", b"/data/sub/000012.sst"));
        assert!(glob_match(b"/data/**.sst", b"/data/sub/000012.sst"));
        assert!(glob_match(b"/dev/loop?", b"/dev/loop0"));
        assert!(!glob_match(b"/dev/loop?", b"/dev/loop10"));
        assert!(glob_match(b"/tmp/x.img", b"/tmp/x.img"));
        assert!(!glob_match(b"/tmp/x.img", b"/tmp/x.img2"));
        assert!(glob_match(b"*", b"file"));
    }

    #[test]
    fn mounts_are_dir_equals_device_pairs() {
        assert_eq!(
            parse_mounts("/mnt/db=/dev/loop0;data=uring:/tmp/f.img;"),
            vec![("/mnt/db".into(), "/dev/loop0".into()), ("data".into(), "uring:/tmp/f.img".into())]
        );
        assert!(parse_mounts("nodevice").is_empty());
    }

    #[test]
    fn the_environment_lists_patterns_and_the_path() {
        let c = Config::from_values(Some("/a/*:/b/**,/c"), None, Some("1"));
        assert_eq!(c.files, vec!["/a/*", "/b/**", "/c"]);
        assert_eq!(c.path, DEFAULT_PATH);
        assert!(c.log);
        assert_eq!(c.log_file, None);
        assert!(c.wants("/b/x/y"));
        assert!(!Config::from_values(None, Some("2q"), Some("0")).wants("/a/x"));
    }

    #[test]
    fn a_log_given_as_an_absolute_path_goes_to_that_file() {
        let c = Config::from_values(None, None, Some("/tmp/iopath.log"));
        assert!(c.log);
        assert_eq!(c.log_file.as_deref(), Some(std::path::Path::new("/tmp/iopath.log")));
        let relative = Config::from_values(None, None, Some("iopath.log"));
        assert!(relative.log && relative.log_file.is_none(), "a relative one means stderr, as before");
        let off = Config::from_values(None, None, Some("0"));
        assert!(!off.log && off.log_file.is_none());
    }
}
