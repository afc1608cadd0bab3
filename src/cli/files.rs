//! The file tools: `iopath ls`, `cat`, `cp`, `rm`, `mkdir`, `df` and `fsck`
//! on an iopath file system, for people (and scripts) looking into an image.
//!
//! Each mounts the device, does its work and unmounts (which commits), so
//! what it wrote is durable when it exits. Paths inside the file system
//! are absolute from its root (a leading `/` is optional); `cp` marks the
//! side that is inside with a leading `::`, as mtools does.

use super::mkfs::open_existing;
use clap::Args;
use iopath::fs::check::{self, Report};
use iopath::fs::lock::MountLock;
use iopath::fs::{FileSystem, Kind, Metadata};
use iopath::units::{format_size, utc_date};
use iopath::{Error, Result};
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

/// Bytes `cat` and `cp` move per call.
const CHUNK: usize = 1 << 20;

const LS_HELP: &str = "\
Lists directories of an iopath file system (the root if no PATH is given), or names files, as ls
does. -l shows the mode, links, size and modification time (UTC); -R descends into directories.

EXAMPLES:
  iopath ls /tmp/fs.img
  iopath ls -l /tmp/fs.img /db
  iopath ls -lR uring:/dev/loop0
";

/// Arguments of `iopath ls`.
#[derive(Args, Debug)]
#[command(after_long_help = LS_HELP)]
pub struct LsArgs {
    /// Device spec or bare path holding an iopath file system.
    device: String,
    /// Paths inside the file system (default: the root).
    paths: Vec<String>,
    /// Long listing: mode, links, size, modification time, name.
    #[arg(short = 'l')]
    long: bool,
    /// List subdirectories too.
    #[arg(short = 'R')]
    recursive: bool,
}

/// Arguments of `iopath cat`.
#[derive(Args, Debug)]
pub struct CatArgs {
    /// Device spec or bare path holding an iopath file system.
    device: String,
    /// Files inside the file system, written to stdout in turn.
    #[arg(required = true)]
    paths: Vec<String>,
}

const CP_HELP: &str = "\
Copies files (and with -r, directories) into, out of, or within an iopath file system. A path inside
it starts with '::' (as in mtools); the other paths are this machine's. When the destination is an
existing directory, each source goes into it under its own name. Permission bits are kept; the
copy is durable when iopath exits (it unmounts, which commits).

EXAMPLES:
  iopath cp /tmp/fs.img notes.txt ::/notes.txt         copy in
  iopath cp /tmp/fs.img -r ./data ::/                  copy a directory in, to /data
  iopath cp /tmp/fs.img ::/db/CURRENT .                copy out, into the current directory
  iopath cp /tmp/fs.img ::/a ::/b                      copy within the file system
";

/// Arguments of `iopath cp`.
#[derive(Args, Debug)]
#[command(after_long_help = CP_HELP)]
pub struct CpArgs {
    /// Device spec or bare path holding an iopath file system.
    device: String,
    /// Sources, then the destination; '::PATH' is inside the file system.
    #[arg(required = true, num_args = 2..)]
    paths: Vec<String>,
    /// Copy directories with everything in them (symbolic links stay links).
    #[arg(short = 'r', long)]
    recursive: bool,
}

/// Arguments of `iopath rm`.
#[derive(Args, Debug)]
pub struct RmArgs {
    /// Device spec or bare path holding an iopath file system.
    device: String,
    /// Paths inside the file system.
    #[arg(required = true)]
    paths: Vec<String>,
    /// Remove directories with everything in them.
    #[arg(short = 'r', long)]
    recursive: bool,
    /// A path that does not exist is no error.
    #[arg(short = 'f', long)]
    force: bool,
}

/// Arguments of `iopath mkdir`.
#[derive(Args, Debug)]
pub struct MkdirArgs {
    /// Device spec or bare path holding an iopath file system.
    device: String,
    /// Directories to make inside the file system.
    #[arg(required = true)]
    paths: Vec<String>,
    /// Make missing parents too, and let an existing directory be.
    #[arg(short = 'p', long)]
    parents: bool,
}

/// Arguments of `iopath df`.
#[derive(Args, Debug)]
pub struct DfArgs {
    /// Device spec or bare path holding an iopath file system.
    device: String,
}

const FSCK_HELP: &str = "\
Checks every structure of an iopath file system and reports everything wrong: the superblock, the
journal (replayed first, as a mount would), every inode (checksum, name, parent, mode, extents,
overflow chain, no written data past its end), the free-space bitmap against what files own (a
block owned twice, a block owned but marked free, a block marked in use that nothing owns), and the
directory tree (each parent a directory, no name twice in one directory, no loops). It repairs
nothing. Where it finds a problem it removes the device's carried cache (the blocks the last
program left in /dev/shm for the next): a mount takes the inode table that cache vouches for as
it is, and the next one now checks it whole and refuses the device. Exit status: 0 clean, 1
problems found or no file system to check.

EXAMPLES:
  iopath fsck /tmp/fs.img
  iopath fsck uring:/dev/loop0 --json
";

/// Arguments of `iopath fsck`.
#[derive(Args, Debug)]
#[command(after_long_help = FSCK_HELP)]
pub struct FsckArgs {
    /// Device spec or bare path holding an iopath file system.
    device: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

/// A mounted file system and the lock that keeps other processes off it.
struct Mounted {
    fs: FileSystem,
    _lock: Option<MountLock>,
}

impl std::ops::Deref for Mounted {
    type Target = FileSystem;
    fn deref(&self) -> &FileSystem {
        &self.fs
    }
}

impl Mounted {
    /// Unmounts (commits), then lets go of the lock.
    fn unmount(self) -> Result<()> {
        self.fs.unmount()
    }
}

/// Mounts the file system on `device`, saying on stderr what the mount repaired.
fn mount(device: &str) -> Result<Mounted> {
    let (engine, lock) = open_existing(device)?;
    // The same carried cache as the interposer's ([`iopath::fs::carry`]): what a
    // tool reads or writes is warm for the next program, and the other way round.
    let bytes = match std::env::var("IOPATH_CARRY") {
        Ok(v) if !v.is_empty() => iopath::units::parse_size(&v)?,
        _ => 1 << 30,
    };
    let carry = match &lock {
        Some(lock) if bytes > 0 => lock
            .carried_cache(bytes.min(engine.device().size()))
            .inspect_err(|e| eprintln!("going on without a carried cache: {e}"))
            .ok(),
        _ => None,
    };
    // And its shared-memory log: what a tool creates outlives it if it is killed.
    let log = lock.as_ref().and_then(|lock| {
        lock.shm_log(iopath::fs::shm_log::DEFAULT_BYTES)
            .inspect_err(|e| eprintln!("going on without a shared-memory log: {e}"))
            .ok()
    });
    let (fs, mounted) = FileSystem::mount_beside(engine, iopath::fs::MountOptions::default(), carry, log)?;
    if let Some(e) = &mounted.carry_error {
        eprintln!("the carried cache was set aside: {e}");
    }
    if mounted.replayed + mounted.from_log > 0 {
        eprintln!("replayed {} journal transaction(s) left by an unclean stop", mounted.replayed + mounted.from_log);
    }
    if mounted.orphans_reclaimed > 0 {
        eprintln!("freed {} file(s) unlinked while open before an unclean stop", mounted.orphans_reclaimed);
    }
    if let Some(old) = mounted.upgraded_from {
        eprintln!("upgraded the file system from format version {old} to {}", iopath::fs::format::VERSION);
    }
    Ok(Mounted { fs, _lock: lock })
}

fn lossy(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// `path` and `name` joined by one `/`.
fn join(path: &str, name: &str) -> String {
    if path.ends_with('/') { format!("{path}{name}") } else { format!("{path}/{name}") }
}

/// `drwxr-xr-x` from a mode.
fn mode_string(mode: u32) -> String {
    let kind = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFIFO => 'p',
        _ => '-',
    };
    let bits = "rwxrwxrwx".chars().enumerate().map(|(i, c)| if mode & (0o400 >> i) != 0 { c } else { '-' });
    std::iter::once(kind).chain(bits).collect()
}

fn long_line(m: &Metadata, name: &str) -> String {
    let when = utc_date(m.mtime_ns / 1_000_000_000);
    let when = when.trim_end_matches(" UTC");
    format!("{} {:>3} {:>12} {when} {name}", mode_string(m.mode), m.nlink, m.size)
}

/// `ls -l`'s line of a symbolic link: `name -> target`.
fn link_line(fs: &FileSystem, m: &Metadata, path: &str, name: &str) -> Result<String> {
    let target = fs.read_link(path)?;
    Ok(format!("{} -> {}", long_line(m, name), lossy(&target)))
}

/// Runs `iopath ls`.
pub fn run_ls(args: LsArgs) -> Result<()> {
    let fs = mount(&args.device)?;
    let paths = if args.paths.is_empty() { vec!["/".to_string()] } else { args.paths.clone() };
    let mut out = std::io::stdout().lock();
    let (mut files, mut dirs) = (0usize, 0usize);
    let headers = paths.len() > 1 || args.recursive;
    let mut queue: std::collections::VecDeque<String> = std::collections::VecDeque::new();
    for path in &paths {
        let m = fs.symlink_metadata(path)?;
        if m.kind == Kind::File {
            files += 1;
            let line = if args.long { long_line(&m, path) } else { path.clone() };
            writeln!(out, "{line}").map_err(stdout_error)?;
        } else if m.kind == Kind::Symlink {
            files += 1;
            let line = if args.long { link_line(&fs, &m, path, path)? } else { path.clone() };
            writeln!(out, "{line}").map_err(stdout_error)?;
        } else {
            queue.push_back(path.clone());
        }
    }
    let mut first = true;
    while let Some(dir) = queue.pop_front() {
        if headers {
            writeln!(out, "{}{dir}:", if first { "" } else { "\n" }).map_err(stdout_error)?;
        }
        first = false;
        let mut below = Vec::new();
        for entry in fs.read_dir(&dir)? {
            let name = lossy(&entry.name);
            let path = join(&dir, &name);
            if entry.kind == Kind::Dir {
                dirs += 1;
                below.push(path.clone());
            } else {
                files += 1;
            }
            let line = match (args.long, entry.kind) {
                (false, _) => name,
                (true, Kind::Symlink) => link_line(&fs, &fs.symlink_metadata(&path)?, &path, &name)?,
                (true, _) => long_line(&fs.metadata(&path)?, &name),
            };
            writeln!(out, "{line}").map_err(stdout_error)?;
        }
        if args.recursive {
            // Depth first, as ls -R: this directory's subdirectories come next.
            for path in below.into_iter().rev() {
                queue.push_front(path);
            }
        }
    }
    if args.long {
        writeln!(out, "{files} file(s), {dirs} directory(ies)").map_err(stdout_error)?;
    }
    drop(out);
    fs.unmount()
}

fn stdout_error(e: std::io::Error) -> Error {
    Error::Os { context: "cannot write to stdout".into(), source: e }
}

/// Runs `iopath cat`.
pub fn run_cat(args: CatArgs) -> Result<()> {
    let fs = mount(&args.device)?;
    let mut out = std::io::stdout().lock();
    let mut buf = vec![0u8; CHUNK];
    for path in &args.paths {
        let f = fs.open(path)?;
        let mut at = 0u64;
        loop {
            let n = f.read_at(&mut buf, at)?;
            if n == 0 {
                break;
            }
            match out.write_all(&buf[..n]) {
                // A reader that went away (`iopath cat ... | head`) is the end, not an error.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return fs.unmount(),
                other => other.map_err(stdout_error)?,
            }
            at += n as u64;
        }
    }
    out.flush().map_err(stdout_error)?;
    drop(out);
    fs.unmount()
}

/// One side of a copy: this machine's file system or the image's.
#[derive(Debug, Clone)]
enum Loc {
    Host(PathBuf),
    Image(String),
}

impl Loc {
    fn parse(text: &str) -> Loc {
        match text.strip_prefix("::") {
            Some("") => Loc::Image("/".into()),
            Some(path) => Loc::Image(path.into()),
            None => Loc::Host(PathBuf::from(text)),
        }
    }

    fn child(&self, name: &[u8]) -> Loc {
        match self {
            Loc::Host(p) => Loc::Host(p.join(std::ffi::OsStr::from_bytes(name))),
            Loc::Image(p) => Loc::Image(join(p, &lossy(name))),
        }
    }

    /// Its last name (what a copy into a directory is called there).
    fn file_name(&self) -> Option<Vec<u8>> {
        match self {
            Loc::Host(p) => p.file_name().map(|n| n.as_bytes().to_vec()),
            Loc::Image(p) => {
                let name = p.trim_end_matches('/').rsplit('/').next()?;
                (!name.is_empty() && name != "." && name != "..").then(|| name.as_bytes().to_vec())
            }
        }
    }

    fn show(&self) -> String {
        match self {
            Loc::Host(p) => p.display().to_string(),
            Loc::Image(p) => format!("::{p}"),
        }
    }
}

fn host_error(what: &str, path: &Path, source: std::io::Error) -> Error {
    Error::Os { context: format!("cannot {what} {}", path.display()), source }
}

/// What `loc` is (file or directory) and its permission bits; `None` if nothing is there.
fn kind_of(fs: &FileSystem, loc: &Loc) -> Result<Option<(Kind, u32)>> {
    use std::os::unix::fs::PermissionsExt;
    match loc {
        Loc::Host(p) => match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => Ok(Some((Kind::Dir, m.permissions().mode() & 0o7777))),
            Ok(m) if std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()) => {
                Ok(Some((Kind::Fifo, m.permissions().mode() & 0o7777)))
            }
            Ok(m) => Ok(Some((Kind::File, m.permissions().mode() & 0o7777))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(host_error("look at", p, e)),
        },
        Loc::Image(p) => match fs.metadata(p) {
            Ok(m) => Ok(Some((m.kind, m.mode & 0o7777))),
            Err(Error::File { errno: libc::ENOENT, .. }) => Ok(None),
            Err(e) => Err(e),
        },
    }
}

fn list(fs: &FileSystem, loc: &Loc) -> Result<Vec<Vec<u8>>> {
    match loc {
        Loc::Host(p) => {
            let entries = std::fs::read_dir(p).map_err(|e| host_error("list", p, e))?;
            let mut names = Vec::new();
            for entry in entries {
                names.push(entry.map_err(|e| host_error("list", p, e))?.file_name().as_bytes().to_vec());
            }
            names.sort();
            Ok(names)
        }
        Loc::Image(p) => Ok(fs.read_dir(p)?.into_iter().map(|e| e.name).collect()),
    }
}

fn make_dir(fs: &FileSystem, loc: &Loc, mode: u32) -> Result<()> {
    match loc {
        Loc::Host(p) => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(mode).create(p).map_err(|e| host_error("make directory", p, e))
        }
        Loc::Image(p) => fs.mkdir(p, mode),
    }
}

/// Makes a named pipe at `loc` with permission bits `mode`.
fn make_fifo(fs: &FileSystem, loc: &Loc, mode: u32) -> Result<()> {
    match loc {
        Loc::Host(p) => {
            let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|_| Error::spec("destination", loc.show(), "a path holds no NUL byte"))?;
            // SAFETY: a NUL-terminated path.
            match unsafe { libc::mkfifo(c.as_ptr(), mode as libc::mode_t) } {
                0 => Ok(()),
                _ => Err(host_error("make a FIFO", p, std::io::Error::last_os_error())),
            }
        }
        Loc::Image(p) => fs.mkfifo(p, mode),
    }
}

/// Reads into a buffer from an offset, as `pread`.
type ReadAt = dyn FnMut(&mut [u8], u64) -> Result<usize>;

/// Copies one file's bytes, `CHUNK` at a time, and its permission bits.
fn copy_file(fs: &FileSystem, from: &Loc, to: &Loc, mode: u32) -> Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut source: Box<ReadAt> = match from {
        Loc::Host(p) => {
            let mut file = std::fs::File::open(p).map_err(|e| host_error("open", p, e))?;
            let p = p.clone();
            Box::new(move |buf, _| file.read(buf).map_err(|e| host_error("read", &p, e)))
        }
        Loc::Image(p) => {
            let file = fs.open(p)?;
            Box::new(move |buf, at| file.read_at(buf, at))
        }
    };
    let mut at = 0u64;
    match to {
        Loc::Host(p) => {
            use std::os::unix::fs::OpenOptionsExt;
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(mode)
                .open(p)
                .map_err(|e| host_error("create", p, e))?;
            loop {
                let n = source(&mut buf, at)?;
                if n == 0 {
                    break;
                }
                file.write_all(&buf[..n]).map_err(|e| host_error("write", p, e))?;
                at += n as u64;
            }
        }
        Loc::Image(p) => {
            let file = match fs.create_with_mode(p, mode) {
                Err(Error::File { errno: libc::EEXIST, .. }) => {
                    let file = fs.open(p)?;
                    file.truncate(0)?;
                    file.set_mode(mode)?;
                    file
                }
                other => other?,
            };
            loop {
                let n = source(&mut buf, at)?;
                if n == 0 {
                    break;
                }
                file.write_at(&buf[..n], at)?;
                at += n as u64;
            }
        }
    }
    Ok(())
}

/// The target of the symbolic link `loc` names, if it names one.
fn link_target(fs: &FileSystem, loc: &Loc) -> Result<Option<Vec<u8>>> {
    match loc {
        Loc::Host(p) => match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(p).map_err(|e| host_error("read the link", p, e))?;
                Ok(Some(target.into_os_string().into_vec()))
            }
            _ => Ok(None),
        },
        Loc::Image(p) => match fs.symlink_metadata(p) {
            Ok(m) if m.kind == Kind::Symlink => fs.read_link(p).map(Some),
            _ => Ok(None),
        },
    }
}

/// Makes a symbolic link at `loc` to `target`.
fn make_link(fs: &FileSystem, loc: &Loc, target: &[u8]) -> Result<()> {
    match loc {
        Loc::Host(p) => std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), p)
            .map_err(|e| host_error("make a link", p, e)),
        Loc::Image(p) => fs.symlink(target, p),
    }
}

fn copy(fs: &FileSystem, from: &Loc, to: &Loc, recursive: bool) -> Result<()> {
    // Recursive copies keep links as links (as `cp -r`); a single file is copied through one.
    if recursive && let Some(target) = link_target(fs, from)? {
        return make_link(fs, to, &target);
    }
    let Some((kind, mode)) = kind_of(fs, from)? else {
        return Err(Error::spec("source", from.show(), "no such file or directory"));
    };
    if kind == Kind::File {
        return copy_file(fs, from, to, mode);
    }
    if kind == Kind::Fifo {
        // As `cp -r`: a named pipe is made anew (it holds no bytes to copy).
        return make_fifo(fs, to, mode);
    }
    if !recursive {
        return Err(Error::spec("source", from.show(), "it is a directory; copy it with -r"));
    }
    match kind_of(fs, to)? {
        None => make_dir(fs, to, mode)?,
        Some((Kind::Dir, _)) => {}
        Some((Kind::File | Kind::Symlink | Kind::Fifo, _)) => {
            return Err(Error::spec("destination", to.show(), "it is a file; a directory cannot be copied over it"));
        }
    }
    for name in list(fs, from)? {
        copy(fs, &from.child(&name), &to.child(&name), recursive)?;
    }
    Ok(())
}

/// Runs `iopath cp`.
pub fn run_cp(args: CpArgs) -> Result<()> {
    let (dest, sources) = args.paths.split_last().expect("clap requires two paths");
    let locs: Vec<Loc> = sources.iter().map(|s| Loc::parse(s)).collect();
    let dest = Loc::parse(dest);
    if matches!(dest, Loc::Host(_)) && locs.iter().all(|l| matches!(l, Loc::Host(_))) {
        return Err(Error::spec(
            "paths",
            args.paths.join(" "),
            "no path is inside the file system; write those with a leading '::' (::/dir/file)",
        ));
    }
    let fs = mount(&args.device)?;
    let into_dir = matches!(kind_of(&fs, &dest)?, Some((Kind::Dir, _)));
    if locs.len() > 1 && !into_dir {
        return Err(Error::spec("destination", dest.show(), "copying several sources needs an existing directory"));
    }
    for from in &locs {
        let to = if into_dir {
            let Some(name) = from.file_name() else {
                return Err(Error::spec(
                    "source",
                    from.show(),
                    "name a file or directory to copy, not '/', '.' or '..'",
                ));
            };
            dest.child(&name)
        } else {
            dest.clone()
        };
        copy(&fs, from, &to, args.recursive)?;
    }
    fs.unmount()
}

fn remove_tree(fs: &FileSystem, path: &str) -> Result<()> {
    for entry in fs.read_dir(path)? {
        let child = join(path, &lossy(&entry.name));
        match entry.kind {
            Kind::Dir => remove_tree(fs, &child)?,
            Kind::File | Kind::Symlink | Kind::Fifo => fs.unlink(&child)?,
        }
    }
    fs.rmdir(path)
}

/// Runs `iopath rm`.
pub fn run_rm(args: RmArgs) -> Result<()> {
    let fs = mount(&args.device)?;
    for path in &args.paths {
        match fs.symlink_metadata(path) {
            Err(Error::File { errno: libc::ENOENT, .. }) if args.force => {}
            Err(e) => return Err(e),
            Ok(m) if m.kind != Kind::Dir => fs.unlink(path)?,
            Ok(_) if args.recursive => remove_tree(&fs, path)?,
            Ok(_) => return Err(Error::spec("path", path.clone(), "it is a directory; remove it with -r")),
        }
    }
    fs.unmount()
}

/// Runs `iopath mkdir`.
pub fn run_mkdir(args: MkdirArgs) -> Result<()> {
    let fs = mount(&args.device)?;
    for path in &args.paths {
        if !args.parents {
            fs.mkdir(path, 0o755)?;
            continue;
        }
        let mut at = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            at = join(&at, part);
            match fs.mkdir(&at, 0o755) {
                Err(Error::File { errno: libc::EEXIST, .. }) if fs.metadata(&at)?.kind == Kind::Dir => {}
                other => other?,
            }
        }
    }
    fs.unmount()
}

/// Runs `iopath df`.
pub fn run_df(args: DfArgs) -> Result<()> {
    let fs = mount(&args.device)?;
    let sb = *fs.superblock();
    let data = sb.blocks - sb.data_start;
    let free = fs.free_blocks()?;
    let used = data - free.min(data);
    // As df's "Avail": what files' data may still take (the rest is kept for block maps).
    let available = free.saturating_sub(fs.reserved_blocks());
    let inodes = sb.inodes();
    let names = fs.names() as u64;
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>5} {:>8} {:>8} {:>8}",
        "", "size", "used", "avail", "use%", "inodes", "used", "free"
    );
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>4}% {:>8} {:>8} {:>8}",
        "data",
        format_size(data * 4096),
        format_size(used * 4096),
        format_size(available * 4096),
        (used * 100).div_ceil(data.max(1)),
        inodes,
        names,
        inodes - names.min(inodes)
    );
    println!(
        "{} ({} blocks of 4 KiB) in all: {} of metadata (inode table, bitmap, a {} journal); \
         {} of the free space kept for files' block maps",
        format_size(sb.blocks * 4096),
        sb.blocks,
        format_size(sb.data_start * 4096),
        format_size(sb.journal_blocks * 4096),
        format_size((free - available) * 4096)
    );
    fs.unmount()
}

fn report_json(r: &Report) -> serde_json::Value {
    serde_json::json!({
        "clean": r.is_clean(),
        "version": r.version,
        "replayed": r.replayed,
        "files": r.files,
        "dirs": r.dirs,
        "links": r.links,
        "hard_links": r.hard_links,
        "orphans": r.orphans,
        "inodes": r.inodes,
        "blocks": r.blocks,
        "data_blocks": r.data_blocks,
        "owned_blocks": r.owned_blocks,
        "free_blocks": r.free_blocks,
        "leaked_blocks": r.leaked_blocks,
        "problems": r.problems,
    })
}

/// Runs `iopath fsck`.
pub fn run_fsck(args: FsckArgs) -> Result<()> {
    let (engine, lock) = open_existing(&args.device)?;
    // What a killed process left in the shared-memory log is applied first, as a mount would.
    let log = lock.as_ref().and_then(|l| l.existing_shm_log());
    let r = check::check_with(engine, log.as_ref())?;
    if !r.is_clean()
        && let Some(lock) = &lock
    {
        // A mount trusts a table its carried cache vouches for (it does not check
        // it again); this device is not what the cache vouched for.
        lock.set_carry_aside()?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report_json(&r)).expect("a JSON value prints"));
    } else {
        println!("{}: iopath file system, format version {}", args.device, r.version);
        if r.replayed > 0 {
            println!("  replayed {} journal transaction(s) left by an unclean stop", r.replayed);
        }
        println!(
            "  {} file(s), {} directory(ies), {} symbolic link(s), {} hard link(s), {} of {} inodes in use",
            r.files,
            r.dirs,
            r.links,
            r.hard_links,
            r.files + r.dirs + r.links + r.hard_links,
            r.inodes
        );
        println!(
            "  {} data blocks: {} owned by files, {} free, {} marked in use but owned by nothing",
            r.data_blocks, r.owned_blocks, r.free_blocks, r.leaked_blocks
        );
        if r.orphans > 0 {
            println!("  {} file(s) unlinked while open before an unclean stop: the next mount frees them", r.orphans);
        }
        for p in &r.problems {
            println!("  PROBLEM: {p}");
        }
        println!("{}", if r.is_clean() { "clean" } else { "NOT CLEAN" });
    }
    if r.is_clean() {
        Ok(())
    } else {
        Err(iopath::fs::format::corrupt(format!(
            "{} problem(s) found on {}; iopath fsck repairs nothing: copy out what reads correctly (iopath cp -r) \
             and make the file system again",
            r.problems.len(),
            args.device
        )))
    }
}
