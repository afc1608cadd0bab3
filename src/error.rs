//! The error type of the whole library.
//!
//! Every error says what went wrong and, where there is one, what to do about
//! it. Device errors keep the operation, the byte range and the OS error code
//! so that a failed request in a merged batch can be traced to its caller.

use std::io;
use std::path::PathBuf;

/// Result alias used throughout iopath.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in iopath.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A device spec, path spec, size or duration string could not be understood.
    #[error("invalid {what} '{value}': {hint}")]
    InvalidSpec {
        /// What kind of value was being parsed ("device spec", "size", ...).
        what: &'static str,
        /// The text the user gave.
        value: String,
        /// Why it is wrong and what would be accepted.
        hint: String,
    },

    /// Opening, creating or sizing a target file or device failed.
    #[error("cannot {action} '{path}': {source}{}", hint_suffix(.source))]
    Target {
        /// What iopath was doing ("open", "create", "lay out", ...).
        action: &'static str,
        /// The file or device node.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// iopath refuses to write to a target that may hold someone's data.
    #[error("refusing to write to '{path}': {why}; {fix}")]
    Refused {
        /// The file or device node.
        path: PathBuf,
        /// What it holds, or why it is protected.
        why: String,
        /// What to do instead (and the flag that allows it).
        fix: String,
    },

    /// A buffer, offset or length does not meet the device's alignment rule.
    #[error(
        "{what} {value:#x} is not a multiple of {align} bytes; the device (O_DIRECT) needs \
         {align}-byte aligned buffers, offsets and lengths: allocate buffers with \
         iopath::IoBuf and use a block size that is a multiple of {align}"
    )]
    Misaligned {
        /// "buffer address", "offset" or "length".
        what: &'static str,
        /// The offending value.
        value: u64,
        /// The required alignment in bytes.
        align: u64,
    },

    /// The request reaches past the end of the device.
    #[error(
        "I/O of {len} bytes at offset {offset} reaches past the end of the device \
         ({size} bytes); use a smaller --size or offset"
    )]
    OutOfRange {
        /// Start of the request in bytes.
        offset: u64,
        /// Length of the request in bytes.
        len: u64,
        /// Size of the device in bytes.
        size: u64,
    },

    /// A request of zero bytes was made.
    #[error("zero-length I/O at offset {offset}: every request must move at least one byte")]
    ZeroLength {
        /// Where the request was aimed.
        offset: u64,
    },

    /// The request has more bytes than one command can carry.
    #[error("I/O of {len} bytes is larger than the largest the device accepts ({max} bytes)")]
    TooLarge {
        /// Length asked for.
        len: u64,
        /// Largest segment the device accepts.
        max: u64,
    },

    /// The device reported an error for this request.
    #[error("device error on {op} of {len} bytes at offset {offset}: {}", io::Error::from_raw_os_error(*.errno))]
    Device {
        /// "read", "write" or "flush".
        op: &'static str,
        /// Start of the failed request.
        offset: u64,
        /// Length of the failed request.
        len: u64,
        /// The errno the device (or the emulator's fault injection) reported.
        errno: i32,
    },

    /// The device moved fewer bytes than asked (e.g. a read past the end of a file).
    #[error("short {op} at offset {offset}: {done} of {len} bytes moved; the target may be smaller than expected")]
    Short {
        /// "read" or "write".
        op: &'static str,
        /// Start of the request.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// Bytes moved.
        done: u64,
    },

    /// A request did not complete within the engine's timeout.
    #[error(
        "{op} at offset {offset} did not complete within {timeout_ms} ms and the device was asked \
         to cancel it; the device may be hung (if it is just slow, raise the limit with --timeout, \
         e.g. --timeout 60s, or PathConfig::timeout in the library)"
    )]
    Timeout {
        /// "read", "write" or "flush".
        op: &'static str,
        /// Start of the request.
        offset: u64,
        /// The timeout that expired.
        timeout_ms: u64,
    },

    /// The backend or kernel lacks something the configuration asked for.
    #[error("{what} is not supported here: {why}")]
    Unsupported {
        /// The feature.
        what: String,
        /// Why, and what to use instead.
        why: String,
    },

    /// A system call failed outside of a request (ring setup, mmap, ...).
    #[error("{context}: {source}")]
    Os {
        /// What iopath was doing.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// Ctrl-C or SIGTERM arrived before there was anything to report.
    #[error("interrupted (Ctrl-C or SIGTERM) while {during}")]
    Interrupted {
        /// What iopath was doing.
        during: String,
    },

    /// The device holds no iopath file system, or a damaged one.
    #[error("{why}")]
    Format {
        /// What is wrong, and what to do.
        why: String,
    },

    /// A file operation was refused (no such file, name taken, no space, ...).
    #[error("cannot {op} '{name}': {why}")]
    File {
        /// "create", "open", "write", "rename", ...
        op: &'static str,
        /// The file's name.
        name: String,
        /// The matching errno (ENOENT, EEXIST, ENOSPC, ...).
        errno: i32,
        /// Why, and what to do.
        why: String,
    },

    /// `--verify` found data that is not what was written.
    #[error("verify failed at offset {offset}: {detail}")]
    Verify {
        /// Offset of the block that failed.
        offset: u64,
        /// What differed.
        detail: String,
    },
}

fn hint_suffix(err: &io::Error) -> &'static str {
    match err.kind() {
        io::ErrorKind::NotFound => " (check the path; its directory must exist)",
        io::ErrorKind::PermissionDenied => " (run as a user that may open it, e.g. root for block devices)",
        _ if err.raw_os_error() == Some(libc::EINVAL) => {
            " (the file system may not support O_DIRECT here; add direct=0 to the device spec)"
        }
        _ => "",
    }
}

impl Error {
    /// Builds an [`Error::InvalidSpec`].
    pub fn spec(what: &'static str, value: impl Into<String>, hint: impl Into<String>) -> Self {
        Error::InvalidSpec { what, value: value.into(), hint: hint.into() }
    }

    /// The OS error number behind this error, if there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Device { errno, .. } => Some(*errno),
            Error::Target { source, .. } | Error::Os { source, .. } => source.raw_os_error(),
            Error::Timeout { .. } => Some(libc::ETIMEDOUT),
            Error::File { errno, .. } => Some(*errno),
            Error::Format { .. } => Some(libc::EUCLEAN),
            _ => None,
        }
    }

    /// Builds an [`Error::Os`] from the last OS error.
    pub fn last_os(context: impl Into<String>) -> Self {
        Error::Os { context: context.into(), source: io::Error::last_os_error() }
    }
}
