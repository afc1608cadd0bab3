//! The file layer: operations, errors, remounts, concurrency, and crash
//! consistency under power cuts at every step of a workload.

use iopath::device::emu::EmuDevice;
use iopath::device::spec::Backend;
use iopath::device::{Device, DeviceSpec};
use iopath::fs::shm_log::ShmLog;
use iopath::fs::{FileSystem, FormatOptions, FsyncPath, MountOptions, NamespaceCommit, ReadPath, check};
use iopath::{Engine, Error, PathConfig};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

fn emu(spec: &str) -> Arc<EmuDevice> {
    let Backend::Emu(config) = DeviceSpec::parse(spec, None).unwrap().backend else { panic!("{spec} is not emu") };
    Arc::new(EmuDevice::open(&config).unwrap())
}

fn engine(dev: &Arc<EmuDevice>, path: &str) -> Arc<Engine> {
    let dev: Arc<dyn Device> = dev.clone();
    Arc::new(Engine::with_device(dev, PathConfig::preset(path).unwrap()).unwrap())
}

fn mount(dev: &Arc<EmuDevice>) -> FileSystem {
    FileSystem::mount(engine(dev, "sync-path")).unwrap().0
}

/// A formatted emulated device, mounted with the `journaled` fsync path.
fn fresh_journaled(spec: &str, options: FormatOptions) -> (Arc<EmuDevice>, FileSystem) {
    let dev = emu(spec);
    FileSystem::format(engine(&dev, "sync-path"), options).unwrap();
    let journaled = MountOptions { fsync_path: FsyncPath::Journaled, ..MountOptions::default() };
    let (fs, _) = FileSystem::mount_with(engine(&dev, "sync-path"), journaled).unwrap();
    (dev, fs)
}

/// Cuts the power under `fs` (whose files the caller has let go), powers the
/// device on again and mounts it: what recovery makes of it.
fn cut_and_remount(dev: &Arc<EmuDevice>, fs: FileSystem) -> FileSystem {
    assert!(dev.power_cut());
    drop(fs);
    dev.power_on();
    mount(dev)
}

/// Files `a` and `b`, written block by block in turn (`blocks` each, block `i` of
/// `a` holding `bytes(i)`, of `b` `bytes(1000 + i)`): each ends up with an extent
/// per block, more than an inode holds, so overflow extent blocks are used.
fn interleaved_pair(fs: &FileSystem, blocks: u64) -> (iopath::fs::File, iopath::fs::File) {
    let (a, b) = (fs.create("a").unwrap(), fs.create("b").unwrap());
    for i in 0..blocks {
        a.write_at(&bytes(i, 4096), i * 4096).unwrap();
        b.write_at(&bytes(1000 + i, 4096), i * 4096).unwrap();
    }
    (a, b)
}

fn fresh(spec: &str, options: FormatOptions) -> (Arc<EmuDevice>, FileSystem) {
    let dev = emu(spec);
    FileSystem::format(engine(&dev, "sync-path"), options).unwrap();
    let fs = mount(&dev);
    (dev, fs)
}

fn errno(e: Error) -> i32 {
    e.errno().unwrap_or_else(|| panic!("no errno in {e}"))
}

fn read_all(fs: &FileSystem, name: &str) -> Vec<u8> {
    let f = fs.open(name).unwrap();
    let mut buf = vec![0u8; f.len() as usize];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), buf.len());
    buf
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u8(1..)).collect()
}

#[test]
fn files_are_written_read_renamed_and_removed() {
    let (_dev, fs) = fresh("emu:null,size=32m", FormatOptions::default());
    let f = fs.create("a").unwrap();
    assert!(f.is_empty());
    let data = bytes(1, 10_000);
    f.write_at(&data, 100).unwrap();
    assert_eq!(f.len(), 10_100);
    let mut back = vec![0xffu8; 10_100];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), 10_100);
    assert!(back[..100].iter().all(|&b| b == 0), "the gap before the write reads as zeros");
    assert_eq!(&back[100..], &data[..]);
    // Short read at the end, nothing past it.
    let mut tail = vec![0u8; 50];
    assert_eq!(f.read_at(&mut tail, 10_080).unwrap(), 20);
    assert_eq!(f.read_at(&mut tail, 20_000).unwrap(), 0);
    // Overwrite in the middle, unaligned.
    f.write_at(b"hello", 4094).unwrap();
    let mut five = [0u8; 5];
    f.read_at(&mut five, 4094).unwrap();
    assert_eq!(&five, b"hello");
    assert_eq!(f.append(b"end").unwrap(), 10_100);
    assert_eq!(f.len(), 10_103);
    // Shrink, then grow: the cut-off bytes read as zeros.
    f.truncate(5000).unwrap();
    f.truncate(9000).unwrap();
    let mut grown = vec![1u8; 4000];
    f.read_at(&mut grown, 5000).unwrap();
    assert!(grown.iter().all(|&b| b == 0));
    f.fsync().unwrap();

    fs.create("b").unwrap().write_at(b"bee", 0).unwrap();
    fs.rename("a", "c").unwrap();
    assert_eq!(f.name(), "c");
    let names: Vec<_> = fs.list().into_iter().map(|e| (e.name, e.size)).collect();
    assert_eq!(names, vec![("b".to_string(), 3), ("c".to_string(), 9000)]);
    // Rename over an existing file replaces it; its open handle keeps the old
    // file, unnamed, until it is closed (POSIX), and the name now holds `c`.
    let b = fs.open("b").unwrap();
    fs.rename("c", "b").unwrap();
    assert_eq!(b.read_at(&mut five, 0).unwrap(), 3);
    assert_eq!(&five[..3], b"bee");
    assert_eq!(b.metadata().nlink, 0);
    assert!(b.name().ends_with("(deleted)"), "{}", b.name());
    assert_eq!(f.name(), "b");
    assert_eq!(fs.list().len(), 1);
    let free_with_orphan = fs.free_blocks().unwrap();
    drop(b);
    fs.sync().unwrap();
    assert!(fs.free_blocks().unwrap() > free_with_orphan, "the last close frees the replaced file's block");
    fs.unlink("b").unwrap();
    assert!(fs.list().is_empty());
    // Still open: the unlinked file reads and writes until its last close.
    f.write_at(b"x", 0).unwrap();
    f.read_at(&mut five, 0).unwrap();
    assert_eq!(five[0], b'x');
    assert_eq!(errno(fs.open("b").unwrap_err()), libc::ENOENT);
}

#[test]
fn wrong_requests_get_errors_that_name_the_problem() {
    let (_dev, fs) = fresh("emu:null,size=8m", FormatOptions { inodes: Some(8), journal_blocks: Some(32) });
    assert_eq!(errno(fs.open("missing").unwrap_err()), libc::ENOENT);
    assert_eq!(errno(fs.unlink("missing").unwrap_err()), libc::ENOENT);
    assert_eq!(errno(fs.rename("missing", "x").unwrap_err()), libc::ENOENT);
    fs.create("x").unwrap();
    let e = fs.create("x").unwrap_err();
    assert!(e.to_string().contains("exists"), "{e}");
    assert_eq!(errno(e), libc::EEXIST);
    for (bad, want) in
        [("", libc::ENOENT), ("a/b", libc::ENOENT), ("x/y", libc::ENOTDIR), (&"n".repeat(300), libc::ENAMETOOLONG)]
    {
        assert_eq!(errno(fs.create(bad).unwrap_err()), want, "{bad:?}");
    }
    for i in 0..7 {
        fs.create(format!("f{i}")).unwrap();
    }
    let e = fs.create("one-too-many").unwrap_err();
    assert!(e.to_string().contains("--inodes"), "{e}");
    // Fill the device: the write that does not fit fails whole and gives its blocks back.
    let f = fs.open("x").unwrap();
    let before = fs.free_blocks().unwrap();
    let e = f.write_at(&vec![7u8; 16 << 20], 0).unwrap_err();
    assert_eq!(errno(e), libc::ENOSPC);
    assert_eq!(f.len(), 0);
    fs.sync().unwrap();
    assert_eq!(fs.free_blocks().unwrap(), before, "the failed write's blocks are free again after the commit");
    // All but the blocks kept for files' block maps (16 on a small device).
    let fits = (before as usize - 16 - 4) * 4096;
    f.write_at(&vec![7u8; fits], 0).unwrap();
    assert_eq!(f.len(), fits as u64);
}

#[test]
fn a_device_without_a_file_system_or_with_a_damaged_one_is_refused() {
    let dev = emu("emu:null,size=8m");
    let e = FileSystem::mount(engine(&dev, "sync-path")).err().unwrap();
    assert!(e.to_string().contains("iopath mkfs"), "{e}");
    FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
    // Damage the superblock's layout (a bit flip the checksum catches).
    let eng = engine(&dev, "sync-path");
    let mut block = iopath::IoBuf::new(4096);
    eng.read_at(&mut block, 0).unwrap();
    block[40] ^= 0x10;
    eng.write_at(&block, 0).unwrap();
    let e = FileSystem::mount(engine(&dev, "sync-path")).err().unwrap();
    assert!(e.to_string().contains("checksum"), "{e}");
    // Too small a device for any layout.
    let tiny = emu("emu:null,size=64k");
    let e = FileSystem::format(engine(&tiny, "sync-path"), FormatOptions::default()).unwrap_err();
    assert!(e.to_string().contains("too small"), "{e}");
}

#[test]
fn a_damaged_inode_is_reported_not_trusted() {
    let (dev, fs) = fresh("emu:null,size=8m", FormatOptions::default());
    fs.create("victim").unwrap().write_at(b"data", 0).unwrap();
    fs.unmount().unwrap();
    let eng = engine(&dev, "sync-path");
    let sb_start = 2 * 4096; // inode table starts at block 2
    let mut block = iopath::IoBuf::new(4096);
    eng.read_at(&mut block, sb_start).unwrap();
    block[70] ^= 1; // inside the first inode's name
    eng.write_at(&block, sb_start).unwrap();
    let e = FileSystem::mount(engine(&dev, "sync-path")).err().unwrap();
    assert!(e.to_string().contains("inode 0 is damaged"), "{e}");
}

#[test]
fn everything_survives_a_remount_including_fragmented_files() {
    let (dev, fs) = fresh("emu:null,size=64m", FormatOptions::default());
    // Two files written block by block in turn: each ends up with hundreds of extents,
    // far more than the inode holds, so the overflow blocks are exercised.
    let (a, b) = interleaved_pair(&fs, 600);
    // Free every other block of b and shrink a: extent maps shrink and overflow blocks go.
    b.truncate(300 * 4096).unwrap();
    a.truncate(123_456).unwrap();
    fs.unmount().unwrap();
    let fs = mount(&dev);
    let a = read_all(&fs, "a");
    assert_eq!(a.len(), 123_456);
    for (i, chunk) in a.chunks(4096).enumerate() {
        assert_eq!(chunk, &bytes(i as u64, 4096)[..chunk.len()], "a block {i}");
    }
    let b = read_all(&fs, "b");
    assert_eq!(b.len(), 300 * 4096);
    for (i, chunk) in b.chunks(4096).enumerate() {
        assert_eq!(chunk, &bytes(1000 + i as u64, 4096)[..], "b block {i}");
    }
    fs.unlink("a").unwrap();
    fs.unlink("b").unwrap();
    fs.sync().unwrap();
    let free = fs.free_blocks().unwrap();
    drop(fs);
    let fs = mount(&dev);
    assert_eq!(fs.free_blocks().unwrap(), free);
    assert!(fs.list().is_empty());
}

/// Small files give back the blocks their appends took ahead when they are
/// closed, leaving holes of a few blocks between them; a later mount starts
/// its search among those holes. A file written in small appends after that
/// (`tar c`'s 10 KiB records) must still get long pieces, and a file larger
/// than one writeback batch must reach the device whole.
#[test]
fn a_streaming_append_gets_long_pieces_among_the_holes_small_files_left() {
    let (dev, fs) = fresh("emu:null,size=128m", FormatOptions::default());
    for i in 0..300 {
        fs.create(format!("small{i}")).unwrap().write_at(&bytes(i, 5000), 0).unwrap();
    }
    fs.unmount().unwrap();
    // A cache large enough, and no write-behind, so that nothing is written
    // before the sync, which writes the file back in batches.
    let options = MountOptions { cache_bytes: 256 << 20, write_behind: false, ..MountOptions::default() };
    let fs = FileSystem::mount_with(engine(&dev, "sync-path"), options).unwrap().0;
    let before = fs.stats().device_writes;
    let big = fs.create("big").unwrap();
    let data = bytes(7, 20 << 20); // 5120 blocks: more than a writeback batch
    for (i, chunk) in data.chunks(10240).enumerate() {
        big.write_at(chunk, i as u64 * 10240).unwrap();
    }
    assert_eq!(fs.stats().dirty_pages, 5120, "nothing written back yet");
    fs.sync().unwrap();
    let writes = fs.stats().device_writes - before;
    // In pieces of up to 1 MiB: about 30 writes with the journal's. Filling the
    // holes (7 blocks each) it took 314.
    assert!(writes < 100, "{writes} device writes for a 20 MiB file");
    assert_eq!(fs.stats().dirty_pages, 0);
    drop(big);
    fs.unmount().unwrap();
    let fs = mount(&dev);
    assert_eq!(read_all(&fs, "big"), data);
    for i in 0..300 {
        assert_eq!(read_all(&fs, &format!("small{i}")), bytes(i, 5000), "small{i}");
    }
    drop(fs);
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

/// Writes `data` into `f` from offset 0 in `chunk`-byte writes, as `tar`
/// writes its archive.
fn stream_into(f: &iopath::fs::File, data: &[u8], chunk: usize) {
    for (i, piece) in data.chunks(chunk).enumerate() {
        f.write_at(piece, (i * chunk) as u64).unwrap();
    }
}

/// [`stream_into`] from `offset`, 10 KiB at a time.
fn stream_into_at(f: &iopath::fs::File, data: &[u8], offset: u64) {
    for (i, piece) in data.chunks(10240).enumerate() {
        f.write_at(piece, offset + (i * 10240) as u64).unwrap();
    }
}

#[test]
fn a_long_stream_is_written_behind_its_writer_while_readers_see_every_byte() {
    // A device with latency: jobs stay in flight while the writer and the readers go on;
    // a cache of 16 MiB, which the readers' misses keep full: clean pages are evicted.
    let dev = emu("emu:optane,size=160m");
    FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
    let fs = mount_with(&dev, "sync-path", MountOptions { cache_bytes: 16 << 20, ..MountOptions::default() });
    let data = Arc::new(bytes(11, 40 << 20));
    let f = fs.create("archive").unwrap();
    let written = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    std::thread::scope(|s| {
        for reader in 0..2u64 {
            let (f, data, written, done) = (f.clone(), Arc::clone(&data), Arc::clone(&written), Arc::clone(&done));
            s.spawn(move || {
                let mut rng = fastrand::Rng::with_seed(reader);
                let mut buf = vec![0u8; 64 << 10];
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::Acquire) || reads < 100 {
                    let upto = written.load(std::sync::atomic::Ordering::Acquire);
                    if upto == 0 {
                        std::thread::yield_now();
                        continue;
                    }
                    // Anywhere below what the writer has written: dropped, in flight or dirty.
                    let at = rng.u64(0..upto);
                    let len = (buf.len() as u64).min(upto - at) as usize;
                    assert_eq!(f.read_at(&mut buf[..len], at).unwrap(), len);
                    assert!(buf[..len] == data[at as usize..at as usize + len], "bytes {at}+{len} differ");
                    reads += 1;
                }
            });
        }
        for (i, piece) in data.chunks(10240).enumerate() {
            f.write_at(piece, (i * 10240) as u64).unwrap();
            written.store(((i * 10240) + piece.len()) as u64, std::sync::atomic::Ordering::Release);
        }
        done.store(true, std::sync::atomic::Ordering::Release);
    });
    let stats = fs.stats();
    // Alone, 8,192 or more of the 10,240 pages go behind the writer. Beside a loaded
    // machine (the rest of this binary in parallel) the flusher gets too little CPU, its
    // two jobs of the file stay in flight, and the dirty budget writes the stream back
    // itself instead (7,175 pages behind in 2 of 5 such runs, on this test's own build
    // before read-around too): what is asserted is that write-behind carried a good part.
    assert!(stats.written_behind >= 4096, "{} pages written behind the writer", stats.written_behind);
    assert!(stats.cache.dropped_behind > 0, "no page left the cache behind the stream");
    assert!(stats.dirty_pages < 2048, "{} pages still dirty", stats.dirty_pages);
    assert_eq!(read_all(&fs, "archive"), *data);
    f.fsync().unwrap();
    drop(f);
    let fs = remounted_holding(&dev, fs, &[("archive", &data)]);
    assert_clean(&dev, fs);
}

/// Sixteen threads each stream a file of their own at once through a
/// 64 MiB cache (192 MiB written: the dirty budget writes files back and
/// clean pages are evicted meanwhile), with write-behind on or off. Odd
/// sizes and odd write sizes: most blocks are written by two writes, the
/// first part of one dirtying a page the budget may write back and the
/// cache evict before the second comes (a page evicted between a writer's
/// lookup and its write lost its bytes: `PageCache::holds`).
fn sixteen_threads_stream_their_own_files(write_behind: bool) {
    let dev = emu("emu:optane,size=320m");
    FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
    let fs = mount_with(&dev, "sync-path", MountOptions { write_behind, ..MountOptions::default() });
    let expected: Vec<(String, Vec<u8>)> =
        (0..16u64).map(|t| (format!("s{t}"), bytes(100 + t, (12 << 20) + 777 * t as usize))).collect();
    std::thread::scope(|s| {
        for (t, (name, data)) in expected.iter().enumerate() {
            let fs = &fs;
            s.spawn(move || {
                let f = fs.create(name).unwrap();
                stream_into(&f, data, 8192 + 1000 * t);
                if t % 4 == 0 {
                    f.fsync().unwrap();
                }
            });
        }
    });
    assert_eq!(fs.stats().written_behind > 0, write_behind);
    let files: Vec<(&str, &[u8])> = expected.iter().map(|(n, b)| (n.as_str(), &b[..])).collect();
    for (name, bytes) in &files {
        let got = read_all(&fs, name);
        let differs = got.iter().zip(bytes.iter()).position(|(a, b)| a != b);
        assert!(got == *bytes, "{name}: {} bytes against {}, first difference at {differs:?}", got.len(), bytes.len());
    }
    let fs = remounted_holding(&dev, fs, &files);
    assert_clean(&dev, fs);
}

#[test]
fn sixteen_threads_streaming_their_own_files_at_once_lose_nothing() {
    sixteen_threads_stream_their_own_files(true);
    sixteen_threads_stream_their_own_files(false);
}

/// Unmounts `fs`, mounts the device again, and checks that each of
/// `files` holds its bytes there.
fn remounted_holding(dev: &Arc<EmuDevice>, fs: FileSystem, files: &[(&str, &[u8])]) -> FileSystem {
    fs.unmount().unwrap();
    let fs = mount(dev);
    for (name, bytes) in files {
        assert!(read_all(&fs, name) == *bytes, "{name} differs after a remount");
    }
    fs
}

/// Lets `fs` go and checks the image with fsck.
fn assert_clean(dev: &Arc<EmuDevice>, fs: FileSystem) {
    drop(fs);
    assert!(check::check(engine(dev, "sync-path")).unwrap().is_clean());
}

#[test]
fn pages_written_again_while_their_stream_is_in_flight_keep_the_last_bytes() {
    let (dev, fs) = fresh("emu:optane,size=96m", FormatOptions::default());
    let f = fs.create("log").unwrap();
    let mut model = bytes(21, 24 << 20);
    let mut rng = fastrand::Rng::with_seed(5);
    let chunk = 16 << 10;
    for (i, piece) in model.clone().chunks(chunk).enumerate() {
        let end = (i * chunk + piece.len()) as u64;
        f.write_at(piece, end - piece.len() as u64).unwrap();
        if i % 64 == 63 {
            // Just behind the writer (a job in flight, likely), and far behind it (dropped).
            for from in [end.saturating_sub(6 << 20), 0] {
                let at = rng.u64(from..end - 10_000);
                let new = bytes(rng.u64(..), 10_000);
                f.write_at(&new, at).unwrap();
                model[at as usize..at as usize + new.len()].copy_from_slice(&new);
            }
        }
    }
    assert!(fs.stats().written_behind > 0);
    assert_eq!(read_all(&fs, "log"), model);
    drop(f);
    let fs = remounted_holding(&dev, fs, &[("log", &model)]);
    assert_clean(&dev, fs);
}

#[test]
fn truncate_and_unlink_wait_for_the_stream_in_flight_and_freed_blocks_stay_the_new_owners() {
    let (dev, fs) = fresh("emu:optane,size=64m", FormatOptions::default());
    // Cut short while its jobs are likely in flight; the blocks it frees are
    // taken by `c` once a commit (`c`'s fsync) lets them go, which a late
    // write of `a`'s would overwrite.
    let a = fs.create("a").unwrap();
    let mut a_model = bytes(31, 12 << 20);
    stream_into(&a, &a_model, 10240);
    a.truncate((6 << 20) + 123).unwrap();
    a_model.truncate((6 << 20) + 123);
    let c = fs.create("c").unwrap();
    let mut c_model = Vec::new();
    for i in 0..8 {
        let piece = bytes(40 + i, 512 << 10);
        c.write_at(&piece, c_model.len() as u64).unwrap();
        c_model.extend_from_slice(&piece);
        c.fsync().unwrap();
    }
    let tail = bytes(32, 3 << 20);
    a.write_at(&tail, a_model.len() as u64).unwrap();
    a_model.extend_from_slice(&tail);
    // Unlinked while open, its jobs in flight: its blocks go at the last close.
    let b = fs.create("b").unwrap();
    stream_into(&b, &bytes(33, 16 << 20), 10240);
    fs.unlink("b").unwrap();
    drop(b);
    c.fsync().unwrap();
    let more = bytes(34, 12 << 20);
    stream_into_at(&c, &more, c_model.len() as u64);
    c_model.extend_from_slice(&more);
    drop((a, c));
    fs.sync().unwrap();
    assert_eq!(read_all(&fs, "a"), a_model);
    assert_eq!(read_all(&fs, "c"), c_model);
    let fs = remounted_holding(&dev, fs, &[("a", &a_model), ("c", &c_model)]);
    assert_eq!(errno(fs.open("b").unwrap_err()), libc::ENOENT);
    assert_clean(&dev, fs);
}

#[test]
fn a_write_behind_job_that_fails_leaves_its_pages_for_the_fsync_to_report() {
    let (dev, fs) = fresh("emu:null,size=64m,wcache=1", FormatOptions::default());
    let f = fs.create("stream").unwrap();
    f.fsync().unwrap();
    let data = bytes(41, 12 << 20);
    stream_into(&f, &data[..3 << 20], 10240);
    // The device dies before the first job's write: every write from here fails.
    assert!(dev.cut_after(0));
    for (i, piece) in data[3 << 20..].chunks(10240).enumerate() {
        f.write_at(piece, (3 << 20) + (i * 10240) as u64).unwrap();
    }
    // Nothing was lost in memory: the pages of the failed jobs are there to read...
    assert_eq!(read_all(&fs, "stream"), data);
    // ...and the fsync says the data did not reach the device.
    assert!(f.fsync().is_err(), "an fsync after a failed write-behind job succeeded");
    drop((f, fs));
    dev.power_on();
    let fs = mount(&dev);
    // What was never made durable is not there; the file system is whole.
    assert!(fs.open("stream").unwrap().len() <= data.len() as u64);
    drop(fs);
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

#[test]
fn a_file_is_found_by_its_inode_after_a_rename_and_never_in_a_reused_slot() {
    let (dev, fs) = fresh("emu:null,size=16m", FormatOptions::default());
    let f = fs.create("log").unwrap();
    f.append(b"first").unwrap();
    let stat = f.metadata();
    assert_ne!(stat.generation, 0, "a new file has a generation");
    drop(f);
    fs.mkdir("old", 0o755).unwrap();
    fs.rename("log", "old/log.1").unwrap();
    // Across a remount, as a process that let the file system go finds it again.
    fs.unmount().unwrap();
    let fs = mount(&dev);
    let again = fs.open_ino(stat.ino, stat.generation, false).unwrap();
    again.append(b" second").unwrap();
    assert_eq!(read_all(&fs, "old/log.1"), b"first second");
    assert_eq!(errno(fs.open_ino(stat.ino, stat.generation + 1, false).unwrap_err()), libc::ENOENT);
    drop(again);
    // Deleted, then its slot taken by another file: not found.
    fs.unlink("old/log.1").unwrap();
    assert_eq!(errno(fs.open_ino(stat.ino, stat.generation, false).unwrap_err()), libc::ENOENT);
    let other = fs.create("other").unwrap();
    assert_eq!(other.metadata().ino, stat.ino, "the slot is used again");
    assert_eq!(errno(fs.open_ino(stat.ino, stat.generation, false).unwrap_err()), libc::ENOENT);
    // Directories and the root are not files.
    let dir = fs.metadata("old").unwrap();
    assert_eq!(errno(fs.open_ino(dir.ino, dir.generation, false).unwrap_err()), libc::ENOENT);
    assert_eq!(errno(fs.open_ino(1, 0, false).unwrap_err()), libc::ENOENT);
    assert_eq!(errno(fs.open_ino(u64::MAX, 0, false).unwrap_err()), libc::ENOENT);
}

/// A file found again by its inode number while another thread creates
/// and unlinks it, over and over: each takes the file's lock before the
/// metadata's. `open_ino` took the metadata's first and then waited for the
/// file's, which an unlink held while it waited for the metadata's: the
/// interposer's lender, reading a standard input's file into memory, and
/// the program unlinking that file waited for each other for ever.
#[test]
fn finding_a_file_by_its_inode_while_it_is_unlinked_never_deadlocks() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_dev, fs) = fresh("emu:null,size=16m", FormatOptions::default());
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let current = Mutex::new(None::<(u64, u64)>);
        let stop = AtomicBool::new(false);
        let found = std::thread::scope(|s| {
            let finder = s.spawn(|| {
                let mut found = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let Some((ino, generation)) = *current.lock().unwrap() else { continue };
                    found += u64::from(fs.open_ino(ino, generation, false).is_ok());
                }
                found
            });
            for _ in 0..3000 {
                let f = fs.create("f").unwrap();
                f.append(b"x").unwrap();
                let stat = f.metadata();
                *current.lock().unwrap() = Some((stat.ino, stat.generation));
                fs.unlink("f").unwrap();
                drop(f);
            }
            stop.store(true, Ordering::Release);
            finder.join().unwrap()
        });
        let _ = done.send(found);
    });
    // (A deadlock never ends: waited for far longer than the seconds this takes.)
    let found = finished.recv_timeout(std::time::Duration::from_secs(300));
    assert!(found.is_ok(), "the finder and the unlinker wait for each other");
}

#[test]
fn symbolic_links_lead_where_they_say_survive_a_remount_and_a_power_cut() {
    use iopath::fs::{Kind, Resolved};
    let (dev, fs) = fresh("emu:null,size=16m,wcache=1,cut=drop", FormatOptions::default());
    fs.mkdir("d", 0o755).unwrap();
    fs.create("d/f").unwrap().write_at(b"through the link", 0).unwrap();
    fs.symlink("d", "to-d").unwrap();
    fs.symlink("f", "d/to-f").unwrap();
    fs.symlink("../to-d/f", "d/up").unwrap();
    fs.symlink("/etc/hostname", "abs").unwrap();
    fs.symlink("../../x", "d/above").unwrap();
    fs.symlink("loop", "loop").unwrap();
    fs.symlink("missing", "dangling").unwrap();

    // Through links, inside: opened, listed, stat'ed as their target.
    assert_eq!(read_all(&fs, "to-d/f"), b"through the link");
    assert_eq!(read_all(&fs, "d/to-f"), b"through the link");
    assert_eq!(read_all(&fs, "to-d/up"), b"through the link");
    assert_eq!(fs.metadata("to-d").unwrap().kind, Kind::Dir);
    assert_eq!(fs.read_dir("to-d").unwrap().len(), 4);
    let link = fs.symlink_metadata("to-d").unwrap();
    assert_eq!((link.kind, link.mode, link.size, link.nlink), (Kind::Symlink, libc::S_IFLNK | 0o777, 1, 1));
    assert_eq!(fs.read_link("d/up").unwrap(), b"../to-d/f");
    assert_eq!(errno(fs.read_link("d/f").unwrap_err()), libc::EINVAL);
    let kinds: Vec<_> = fs.read_dir("/").unwrap().into_iter().map(|e| (e.name, e.kind)).collect();
    assert!(kinds.contains(&(b"to-d".to_vec(), Kind::Symlink)), "{kinds:?}");

    // Out of the file system: said, for the interposer to route; refused by the library.
    assert_eq!(fs.resolve("abs", true).unwrap(), Some(Resolved::Absolute(b"/etc/hostname".to_vec())));
    assert_eq!(fs.resolve("to-d/above/y", true).unwrap(), Some(Resolved::Above(b"../x/y".to_vec())));
    assert_eq!(fs.resolve("to-d/to-f", true).unwrap(), Some(Resolved::Inside(b"/d/f".to_vec())));
    assert_eq!(fs.resolve("to-d/to-f", false).unwrap(), Some(Resolved::Inside(b"/d/to-f".to_vec())));
    assert_eq!(fs.resolve("d/to-f", false).unwrap(), None, "no link on the way to follow");
    assert_eq!(fs.resolve("d/missing/x", true).unwrap(), None, "the next call says what is missing");
    assert_eq!(errno(fs.open("abs").unwrap_err()), libc::EXDEV);
    assert_eq!(errno(fs.open("loop").unwrap_err()), libc::ELOOP);
    assert_eq!(errno(fs.open("dangling").unwrap_err()), libc::ENOENT);
    assert_eq!(errno(fs.symlink("x", "to-d").unwrap_err()), libc::EEXIST);
    assert_eq!(errno(fs.symlink("", "e").unwrap_err()), libc::ENOENT);
    assert_eq!(errno(fs.symlink("y".repeat(200), "long").unwrap_err()), libc::ENAMETOOLONG);
    // A link is removed and renamed as itself, never its target.
    assert_eq!(errno(fs.rmdir("to-d").unwrap_err()), libc::ENOTDIR);
    fs.rename("d/to-f", "d/to-f2").unwrap();
    fs.unlink("dangling").unwrap();
    assert_eq!(read_all(&fs, "d/to-f2"), b"through the link");

    let after: BTreeMap<String, Vec<u8>> = tree(&fs);
    fs.unmount().unwrap();
    let fs = mount(&dev);
    assert_eq!(tree(&fs), after, "a remount keeps every link");
    assert!(after.contains_key("to-d ->") && !after.contains_key("dangling ->"), "{after:?}");
    // A link made and not synced: a power cut keeps it whole or not at all.
    fs.symlink("d/f", "late").unwrap();
    fs.sync().unwrap();
    fs.symlink("d/f", "later").unwrap();
    let fs = cut_and_remount(&dev, fs);
    assert_eq!(fs.read_link("late").unwrap(), b"d/f");
    match fs.read_link("later") {
        Ok(t) => assert_eq!(t, b"d/f"),
        Err(e) => assert_eq!(errno(e), libc::ENOENT),
    }
    drop(fs);
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

/// A named pipe (`mkfifo`) is a name and an inode: `stat` and `read_dir`
/// report a FIFO with its mode, it takes hard links, moves and goes as a
/// file does and survives a remount; its bytes are the kernel's (the
/// interposer opens a kernel pipe for it), so opening it here is ENXIO.
#[test]
fn a_fifo_is_a_name_and_an_inode_that_opens_nowhere_here() {
    use iopath::fs::Kind;
    let (dev, fs) = fresh("emu:null,size=16m", FormatOptions::default());
    fs.mkdir("d", 0o755).unwrap();
    fs.mkfifo("d/p", 0o640).unwrap();
    assert_eq!(errno(fs.mkfifo("d/p", 0o640).unwrap_err()), libc::EEXIST);
    let m = fs.metadata("d/p").unwrap();
    assert_eq!((m.kind, m.mode, m.size, m.blocks, m.nlink), (Kind::Fifo, libc::S_IFIFO | 0o640, 0, 0, 1));
    assert_eq!(fs.read_dir("d").unwrap()[0].kind, Kind::Fifo);
    let e = fs.open("d/p").unwrap_err();
    assert_eq!(errno(e), libc::ENXIO);
    fs.hard_link("d/p", "q").unwrap();
    fs.rename("d/p", "d/r").unwrap();
    fs.unmount().unwrap();
    let fs = mount(&dev);
    assert_eq!(fs.metadata("q").unwrap().kind, Kind::Fifo);
    assert_eq!(fs.metadata("d/r").unwrap().nlink, 2);
    assert_eq!(fs.read_dir("/").unwrap().into_iter().find(|e| e.name == b"q").unwrap().kind, Kind::Fifo);
    fs.unlink("q").unwrap();
    fs.unlink("d/r").unwrap();
    assert!(fs.read_dir("d").unwrap().is_empty());
    fs.unmount().unwrap();
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

/// A mount builds a file's in-memory node only when something first uses
/// the file. Every change to a file's names, made as the first call after a
/// remount (so on a file whose node is not built yet), counts its names as
/// if the node had been there all along, and a listing sees every file.
#[test]
fn the_read_ahead_thread_starts_with_the_first_stream_and_not_before() {
    let (dev, fs) = fresh("emu:null,size=64m", FormatOptions::default());
    let data: Vec<u8> = (0..4 << 20).map(|k: usize| (k * 7 + k / 4096) as u8).collect();
    fs.create("big").unwrap().write_at(&data, 0).unwrap();
    fs.create("small").unwrap().write_at(b"a few bytes", 0).unwrap();
    fs.unmount().unwrap();
    let fs = mount(&dev);
    let mut some = [0u8; 11];
    assert_eq!(fs.open("small").unwrap().read_at(&mut some, 0).unwrap(), 11);
    assert!(fs.metadata("big").is_ok());
    assert_eq!(fs.stats().readahead_threads, 0, "nothing was read ahead: {:?}", fs.stats());
    let f = fs.open("big").unwrap();
    let mut back = vec![0u8; data.len()];
    for (i, piece) in back.chunks_mut(64 << 10).enumerate() {
        assert_eq!(f.read_at(piece, (i * (64 << 10)) as u64).unwrap(), piece.len());
    }
    assert!(back == data);
    let stats = fs.stats();
    assert!(stats.readahead_posts > 0 && stats.readahead_threads == 1, "{stats:?}");
    drop(f);
    fs.unmount().unwrap();
}

#[test]
fn names_change_the_same_on_files_no_call_has_used_since_the_mount() {
    let (dev, fs) = fresh("emu:null,size=16m", FormatOptions::default());
    fs.mkdir("d", 0o755).unwrap();
    for (name, body) in [("d/f", "eff"), ("g", "gee"), ("h", "aitch"), ("k", "kay")] {
        fs.create(name).unwrap().write_at(body.as_bytes(), 0).unwrap();
    }
    fs.hard_link("d/f", "f2").unwrap();
    fs.hard_link("g", "g2").unwrap();
    fs.unmount().unwrap();
    let first = |step: &dyn Fn(&FileSystem)| {
        let fs = mount(&dev);
        step(&fs);
        fs.unmount().unwrap();
        mount(&dev)
    };
    // A third name for a file with two.
    let fs = first(&|fs| fs.hard_link("f2", "d/f3").unwrap());
    assert_eq!(fs.metadata("d/f").unwrap().nlink, 3);
    drop(fs);
    // An alias removed, then the file's own name while an alias remains.
    let fs = first(&|fs| fs.unlink("d/f3").unwrap());
    assert_eq!(fs.metadata("f2").unwrap().nlink, 2);
    drop(fs);
    let fs = first(&|fs| fs.unlink("g").unwrap());
    assert_eq!((fs.metadata("g2").unwrap().nlink, read_all(&fs, "g2")), (1, b"gee".to_vec()));
    drop(fs);
    // A rename of a file, and a rename over a file with another name.
    let fs = first(&|fs| fs.rename("h", "d/h").unwrap());
    assert_eq!(read_all(&fs, "d/h"), b"aitch");
    drop(fs);
    let fs = first(&|fs| fs.rename("k", "f2").unwrap());
    assert_eq!((fs.metadata("d/f").unwrap().nlink, read_all(&fs, "f2")), (1, b"kay".to_vec()));
    drop(fs);
    // A listing, first: every file with its size.
    let fs = mount(&dev);
    let listed: Vec<(String, u64)> = fs.list().into_iter().map(|e| (e.name, e.size)).collect();
    let want = [("d/f", 3), ("d/h", 5), ("f2", 3), ("g2", 3)];
    assert_eq!(listed, want.map(|(n, s)| (n.to_string(), s)).to_vec());
    fs.unmount().unwrap();
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

/// A hard link is another name of one file: one inode number, `nlink`
/// counting the names, data written through either seen through both. The
/// file outlives any of its names but the last, keeps its inode number when
/// its first name goes, and all of it survives a remount and a power cut.
#[test]
fn hard_links_name_one_file_until_the_last_name_goes_across_remounts_and_power_cuts() {
    use iopath::fs::Kind;
    let (dev, fs) = fresh("emu:null,size=16m,wcache=1,cut=drop", FormatOptions::default());
    fs.mkdir("d", 0o755).unwrap();
    fs.mkdir("e", 0o755).unwrap();
    fs.create("d/f").unwrap().write_at(b"one file", 0).unwrap();
    fs.hard_link("d/f", "e/g").unwrap();
    fs.hard_link("e/g", "h").unwrap();
    let (f, g) = (fs.metadata("d/f").unwrap(), fs.metadata("e/g").unwrap());
    assert_eq!((f.ino, f.nlink, g.nlink), (g.ino, 3, 3));
    fs.open("h").unwrap().write_at(b"ONE", 0).unwrap();
    assert_eq!(read_all(&fs, "d/f"), b"ONE file");
    let ino = |fs: &FileSystem, dir: &str, name: &[u8]| {
        fs.read_dir(dir).unwrap().into_iter().find(|e| e.name == name).map(|e| (e.ino, e.kind))
    };
    assert_eq!(ino(&fs, "e", b"g"), Some((f.ino, Kind::File)));
    // A link to a symbolic link is one too; never to a directory; never over a name.
    fs.symlink("d/f", "sym").unwrap();
    fs.hard_link("sym", "sym2").unwrap();
    assert_eq!(fs.read_link("sym2").unwrap(), b"d/f");
    assert_eq!(fs.symlink_metadata("sym2").unwrap().nlink, 2);
    assert_eq!(errno(fs.hard_link("d", "d2").unwrap_err()), libc::EPERM);
    assert_eq!(errno(fs.hard_link("d/f", "h").unwrap_err()), libc::EEXIST);
    assert_eq!(errno(fs.hard_link("nothing", "x").unwrap_err()), libc::ENOENT);
    assert_eq!(errno(fs.hard_link("d/f", "new/").unwrap_err()), libc::ENOENT);
    assert_eq!(errno(fs.hard_link("d/f", "missing/x").unwrap_err()), libc::ENOENT);
    // A directory holding a link is not empty; a rename onto another name of the same file does nothing.
    assert_eq!(errno(fs.rmdir("e").unwrap_err()), libc::ENOTEMPTY);
    fs.rename("h", "d/f").unwrap();
    assert_eq!(fs.metadata("h").unwrap().nlink, 3, "rename between two names of one file does nothing");

    // The first name goes: the file keeps its inode number under the others.
    let open = fs.open("h").unwrap();
    fs.unlink("d/f").unwrap();
    assert_eq!(fs.metadata("e/g").unwrap().ino, f.ino);
    assert_eq!(fs.metadata("h").unwrap().nlink, 2);
    assert_eq!(open.metadata().nlink, 2);
    // A name renamed, then another replaced by a rename: the names move, the file stays.
    fs.rename("e/g", "d/g").unwrap();
    fs.create("other").unwrap().write_at(b"other", 0).unwrap();
    fs.rename("other", "h").unwrap();
    assert_eq!((read_all(&fs, "h"), fs.metadata("d/g").unwrap().nlink), (b"other".to_vec(), 1));
    assert_eq!(read_all(&fs, "d/g"), b"ONE file");
    fs.hard_link("d/g", "e/back").unwrap();

    let after = tree(&fs);
    drop(open);
    fs.unmount().unwrap();
    let fs = mount(&dev);
    assert_eq!(tree(&fs), after, "a remount keeps every name");
    assert_eq!(fs.metadata("e/back").unwrap().nlink, 2);
    assert_eq!(fs.metadata("e/back").unwrap().ino, f.ino);
    // Its last name goes while open: an orphan, freed at the last close.
    let open = fs.open("d/g").unwrap();
    fs.unlink("d/g").unwrap();
    fs.unlink("e/back").unwrap();
    assert_eq!(open.metadata().nlink, 0);
    let mut buf = [0u8; 8];
    assert_eq!(open.read_at(&mut buf, 0).unwrap(), 8);
    drop(open);
    // Links made and not synced: a power cut keeps each whole or not at all.
    fs.create("p").unwrap().write_at(b"p", 0).unwrap();
    fs.hard_link("p", "q").unwrap();
    fs.sync().unwrap();
    fs.hard_link("p", "r").unwrap();
    fs.unlink("p").unwrap();
    let fs = cut_and_remount(&dev, fs);
    let (q, r) = (fs.metadata("q").unwrap(), fs.metadata("r"));
    match (r, fs.metadata("p")) {
        (Ok(r), Err(_)) => assert_eq!((q.nlink, r.nlink, r.ino), (2, 2, q.ino)),
        (Err(_), Ok(p)) => assert_eq!((q.nlink, p.nlink, p.ino), (2, 2, q.ino)),
        other => panic!("a power cut kept part of the changes: {other:?}"),
    }
    drop(fs);
    let report = check::check(engine(&dev, "sync-path")).unwrap();
    assert!(report.is_clean() && report.hard_links >= 1, "{report:?}");
}

/// Small files written one after another lie one after another (each gives
/// the rest of its append's preallocation back at close, and the next one
/// starts there), and a writeback of many files sends runs that cross from
/// one file to the next: a few device commands for many files.
#[test]
fn small_files_written_in_turn_lie_together_and_go_back_in_a_few_commands() {
    let (dev, fs) = fresh("emu:null,size=64m", FormatOptions::default());
    fs.mkdir("d", 0o755).unwrap();
    for i in 0..200 {
        fs.create(format!("d/f{i}")).unwrap().write_at(&bytes(i, 9000), 0).unwrap();
    }
    assert_eq!(fs.stats().dirty_pages, 600, "nothing written back yet");
    let before = fs.stats().device_writes;
    fs.sync().unwrap();
    let writes = fs.stats().device_writes - before;
    // 600 blocks in a row, in commands of up to 128 blocks, and the journal's few;
    // a command per file (200) with a hole of preallocation between every two.
    assert!(writes < 20, "{writes} device writes for 200 small files");
    fs.unmount().unwrap();
    let fs = mount(&dev);
    for i in 0..200 {
        assert_eq!(read_all(&fs, &format!("d/f{i}")), bytes(i, 9000), "f{i}");
    }
    drop(fs);
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

/// SQLite's commit in its default mode (`journal_mode=DELETE`,
/// `synchronous=FULL`): a rollback journal is created and synced, the
/// database written and synced, and the journal deleted: the commit point,
/// which nothing syncs.
fn delete_mode_commit(fs: &FileSystem, value: &[u8]) {
    let journal = fs.create("db-journal").unwrap();
    journal.write_at(b"old pages", 0).unwrap();
    journal.fsync().unwrap();
    let db = fs.open("db").unwrap();
    db.write_at(value, 0).unwrap();
    db.fsync().unwrap();
    drop(journal);
    fs.unlink("db-journal").unwrap();
}

/// fsync of a directory makes every namespace change so far durable. When
/// a file's fsync since has done that (SQLite fsyncs its directory right
/// after the journal file it created), it writes nothing; when the running
/// transaction holds a change, it commits it.
#[test]
fn a_directory_fsync_writes_only_what_is_not_durable_yet() {
    let (dev, fs) = fresh("emu:null,size=16m,wcache=1,cut=drop", FormatOptions::default());
    let j = fs.create("j").unwrap(); // in the journal, not flushed
    let flushes = fs.stats().device_flushes;
    fs.sync_namespace().unwrap();
    assert!(fs.stats().device_flushes > flushes, "the create is made durable");
    let k = fs.create("k").unwrap();
    k.write_at(b"data", 0).unwrap();
    k.fsync().unwrap(); // commits durably, the create of k with it
    let before = fs.stats();
    fs.sync_namespace().unwrap();
    let after = fs.stats();
    assert_eq!((after.device_flushes, after.device_writes), (before.device_flushes, before.device_writes));
    assert_eq!(after.shared_commits, before.shared_commits + 1);
    fs.rename("k", "k2").unwrap(); // in the running transaction
    fs.sync_namespace().unwrap();
    assert!(fs.stats().device_flushes > after.device_flushes, "the rename is made durable");
    drop((j, k));
    let fs = cut_and_remount(&dev, fs);
    assert!(fs.open("j").is_ok(), "the first create survives the power cut");
    assert_eq!(read_all(&fs, "k2"), b"data");
    assert!(fs.open("k").is_err());
}

/// fsync of a file with nothing pending flushes the device's cache (its
/// data may be there), unless no write was sent since a flush that covered
/// every write: then there is nothing to flush, and none is sent. A power
/// cut right after such an fsync loses nothing it vouched for.
#[test]
fn an_fsync_with_nothing_new_to_flush_sends_no_flush_and_loses_nothing() {
    let (dev, fs) = fresh("emu:null,size=16m,wcache=1,cut=drop", FormatOptions::default());
    let files: Vec<_> = (0..16).map(|i| fs.create(format!("f{i}")).unwrap()).collect();
    for (i, f) in files.iter().enumerate() {
        f.write_at(&bytes(i as u64, 4096), 0).unwrap();
        f.fsync().unwrap();
    }
    // As `sysbench fileio --file-fsync-freq=1`: write one file, then fsync them all.
    for round in 0..8u64 {
        let before = fs.stats();
        let i = (round * 5 % 16) as usize;
        files[i].write_at(&bytes(100 + round, 4096), 0).unwrap();
        for f in &files {
            f.fsync().unwrap();
        }
        let after = fs.stats();
        assert_eq!(after.device_flushes_skipped - before.device_flushes_skipped, 15, "{}", after.summary());
        assert!(after.device_flushes - before.device_flushes <= 2, "{}", after.summary());
    }
    // A write sent since the last flush: the next fsync of even a clean file flushes.
    files[0].write_at(b"direct?", 8192).unwrap();
    fs.sync_namespace().unwrap_or(());
    let before = fs.stats().device_flushes;
    files[1].fsync().unwrap();
    files[0].fsync().unwrap();
    assert!(fs.stats().device_flushes > before);
    drop(files);
    let fs = cut_and_remount(&dev, fs);
    for i in 0..16u64 {
        let last = (0..8u64).filter(|r| (r * 5 % 16) == i).max().map_or(i, |r| 100 + r);
        assert_eq!(read_all(&fs, &format!("f{i}"))[..4096], bytes(last, 4096)[..], "f{i}");
    }
    assert_eq!(&read_all(&fs, "f0")[8192..], b"direct?");
}

/// fdatasync of pages that only overwrite a file's written blocks (its size
/// and block map committed, none of the blocks journaled) writes them with
/// forced unit access and commits nothing, as the kernel's file systems do
/// for a database's log rewritten in place; a power cut at any device
/// command loses no page an fdatasync returned for. A block whose image is
/// in the journal (the `journaled` path put it there) takes the commit path,
/// so replay cannot put that older image back over the new data.
#[test]
fn an_fdatasync_of_overwrites_commits_nothing_and_a_power_cut_loses_none_of_it() {
    const PAGES: u64 = 8;
    let page = |op: u64| bytes(500 + op, 4096);
    let ops = 24u64;
    // A run without a cut counts the commands and checks the counters.
    let setup = |fs: &FileSystem| {
        let f = fs.create("log").unwrap();
        for i in 0..PAGES {
            f.write_at(&bytes(i, 4096), i * 4096).unwrap();
        }
        f.fsync().unwrap();
        f
    };
    let (dev, fs) = fresh("emu:null,size=16m,wcache=1,cut=drop", FormatOptions::default());
    let f = setup(&fs);
    let (before, start) = (fs.stats(), dev.commands_since_power_on());
    for op in 0..ops {
        f.write_at(&page(op), (op % PAGES) * 4096).unwrap();
        f.fdatasync().unwrap();
    }
    let after = fs.stats();
    let total = dev.commands_since_power_on() - start;
    assert_eq!(after.overwrite_syncs - before.overwrite_syncs, ops, "{}", after.summary());
    assert_eq!(after.journal.commits, before.journal.commits, "{}", after.summary());
    drop(f);
    drop(fs);
    for cut_at in 0..=total {
        let (dev, fs) = fresh("emu:null,size=16m,wcache=1,cut=drop", FormatOptions::default());
        let f = setup(&fs);
        dev.cut_after(cut_at);
        // The last op whose fdatasync returned, per page.
        let mut acknowledged: Vec<Option<u64>> = vec![None; PAGES as usize];
        for op in 0..ops {
            let done = f.write_at(&page(op), (op % PAGES) * 4096).and_then(|_| f.fdatasync());
            if done.is_err() || !dev.powered() {
                break;
            }
            acknowledged[(op % PAGES) as usize] = Some(op);
        }
        drop(f);
        let fs = cut_and_remount(&dev, fs);
        let got = read_all(&fs, "log");
        for (i, last) in acknowledged.iter().enumerate() {
            let have = &got[i * 4096..(i + 1) * 4096];
            // The acknowledged op's page, or a later op's on the same page (written, maybe not synced).
            let first = last.map_or(0, |op| op);
            let fine = last.is_none() && have == &bytes(i as u64, 4096)[..]
                || (first..ops).filter(|op| op % PAGES == i as u64).any(|op| have == &page(op)[..]);
            assert!(fine, "cut at {cut_at}: page {i} lost its fdatasync'd data (last acknowledged {last:?})");
        }
        fs.unmount().unwrap();
    }
    // On the journaled path the first fsync puts the block's image in the journal: the
    // fdatasync after an overwrite of it commits (and the commit checkpoints first).
    let (dev, fs) = fresh_journaled("emu:null,size=16m,wcache=1,cut=drop", FormatOptions::default());
    let f = fs.create("j").unwrap();
    f.write_at(&bytes(1, 4096), 0).unwrap();
    f.fsync().unwrap();
    f.write_at(&bytes(2, 4096), 0).unwrap();
    f.fsync().unwrap();
    let before = fs.stats();
    f.write_at(&bytes(3, 4096), 0).unwrap();
    f.fdatasync().unwrap();
    assert_eq!(fs.stats().overwrite_syncs, before.overwrite_syncs, "a journaled block is not overwritten in place");
    drop(f);
    let fs = cut_and_remount(&dev, fs);
    assert_eq!(read_all(&fs, "j"), bytes(3, 4096));
}

#[test]
fn a_killed_process_keeps_its_namespace_changes_unless_told_to_defer_them() {
    for (commit, kept) in [(NamespaceCommit::Written, true), (NamespaceCommit::Deferred, false)] {
        let dev = emu("emu:null,size=16m,wcache=1");
        FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
        let options = MountOptions { namespace_commit: commit, ..MountOptions::default() };
        let (fs, _) = FileSystem::mount_with(engine(&dev, "sync-path"), options).unwrap();
        fs.create("db").unwrap().fsync().unwrap();
        delete_mode_commit(&fs, b"committed");
        fs.mkdir("dir", 0o755).unwrap();
        fs.create("dir/made").unwrap();
        fs.rename("dir/made", "dir/renamed").unwrap();
        // The process dies: nothing more is written, but what it wrote stays.
        std::mem::forget(fs);
        let (fs, mounted) = FileSystem::mount(engine(&dev, "sync-path")).unwrap();
        assert_eq!(read_all(&fs, "db"), b"committed");
        assert_eq!(!fs.exists("db-journal"), kept, "{commit:?}: the journal's delete, SQLite's commit point");
        assert_eq!(fs.exists("dir/renamed"), kept, "{commit:?}");
        assert!(!fs.exists("dir/made"));
        assert!(mounted.replayed > 0, "{commit:?}: the journal was never checkpointed");
        fs.unmount().unwrap();
        assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
    }
    // A power cut may lose what was only written, never what was synced.
    let dev = emu("emu:null,size=16m,wcache=1,cut=drop");
    FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
    let fs = mount(&dev);
    fs.create("db").unwrap().fsync().unwrap();
    delete_mode_commit(&fs, b"committed");
    fs.mkdir("dir", 0o755).unwrap();
    let fs = cut_and_remount(&dev, fs);
    assert_eq!(read_all(&fs, "db"), b"committed");
    assert!(!fs.exists("dir"), "written, never flushed: the cut dropped it");
    fs.unmount().unwrap();
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

/// A shared-memory log (`iopath::fs::shm_log`) at `path`, as a mount lock's holder opens it.
fn shm_log(path: &std::path::Path, bytes: u64) -> ShmLog {
    ShmLog::open(path, std::path::Path::new("/dev/null"), bytes).unwrap()
}

#[test]
fn a_killed_process_keeps_its_logged_namespace_changes_and_a_stale_log_is_never_applied() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let dev = emu("emu:null,size=16m,wcache=1");
    FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
    let beside = |log| FileSystem::mount_beside(engine(&dev, "sync-path"), MountOptions::default(), None, log).unwrap();
    let (fs, _) = beside(Some(shm_log(&path, 1 << 20)));
    fs.create("db").unwrap().fsync().unwrap();
    delete_mode_commit(&fs, b"committed");
    let before = fs.stats();
    fs.mkdir("dir", 0o755).unwrap();
    fs.create("dir/made").unwrap();
    fs.rename("dir/made", "dir/renamed").unwrap();
    let after = fs.stats();
    assert_eq!(after.device_writes, before.device_writes, "namespace changes stay in the log");
    assert_eq!(after.journal.logged, before.journal.logged + 3);
    // The process dies: the device has none of the last changes, the log has them all.
    std::mem::forget(fs);
    let (fs, mounted) = beside(Some(shm_log(&path, 1 << 20)));
    assert!(mounted.from_log >= 3, "{mounted:?}");
    assert_eq!(read_all(&fs, "db"), b"committed");
    assert!(!fs.exists("db-journal"), "the journal's delete, SQLite's commit point, came back from the log");
    assert!(fs.exists("dir/renamed") && !fs.exists("dir/made"));
    fs.unmount().unwrap();
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
    // A clean unmount leaves nothing in the log to apply.
    let (fs, mounted) = beside(Some(shm_log(&path, 1 << 20)));
    assert_eq!((mounted.replayed, mounted.from_log), (0, 0));
    fs.mkdir("lost", 0o755).unwrap();
    std::mem::forget(fs);
    // A mount without the log (as after a reboot) moves the device past it ...
    let (fs, _) = beside(None);
    assert!(!fs.exists("lost"));
    fs.mkdir("newer", 0o755).unwrap();
    fs.unmount().unwrap();
    // ... and the log, which would put "lost" back over "newer"'s table, is never applied.
    let (fs, mounted) = beside(Some(shm_log(&path, 1 << 20)));
    assert_eq!(mounted.from_log, 0);
    assert!(!fs.exists("lost") && fs.exists("newer"));
    fs.unmount().unwrap();
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

#[test]
fn a_full_log_goes_to_the_journal_in_one_transaction_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let dev = emu("emu:null,size=16m,wcache=1");
    FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
    // Room for about ten creates.
    let mount = || {
        FileSystem::mount_beside(
            engine(&dev, "sync-path"),
            MountOptions::default(),
            None,
            Some(shm_log(&path, 128 << 10)),
        )
        .unwrap()
    };
    let (fs, _) = mount();
    fs.mkdir("d", 0o755).unwrap();
    for i in 0..100 {
        fs.create(format!("d/f{i}")).unwrap();
        if i % 3 == 0 {
            fs.rename(format!("d/f{i}"), format!("d/r{i}")).unwrap();
        }
        if i % 7 == 6 {
            fs.unlink(format!("d/f{}", i - 1)).ok(); // absent where renamed
        }
    }
    let stats = fs.stats();
    assert!(stats.journal.logged > 100, "{:?}", stats.journal);
    assert!(
        (5..30).contains(&stats.journal.commits),
        "each commit takes a full log's worth of changes: {:?}",
        stats.journal
    );
    let names = |fs: &FileSystem| {
        let mut n: Vec<Vec<u8>> = fs.read_dir("d").unwrap().into_iter().map(|e| e.name).collect();
        n.sort();
        n
    };
    let want = names(&fs);
    assert!(want.len() > 80, "{}", want.len());
    std::mem::forget(fs);
    let (fs, mounted) = mount();
    assert!(mounted.replayed > 0 && mounted.from_log > 0, "{mounted:?}");
    assert_eq!(names(&fs), want);
    fs.unmount().unwrap();
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

#[test]
fn syncing_the_namespace_keeps_names_through_a_power_cut_and_writes_back_no_data() {
    let (dev, fs) = fresh("emu:null,size=16m,wcache=1,cut=drop", FormatOptions::default());
    let busy = fs.create("busy").unwrap();
    busy.fsync().unwrap();
    busy.write_at(&bytes(1, 8192), 0).unwrap();
    fs.mkdir("dir", 0o755).unwrap();
    fs.create("dir/new").unwrap();
    fs.rename("busy", "dir/busy").unwrap();
    let before = fs.stats().cache.writebacks;
    fs.sync_namespace().unwrap();
    assert_eq!(fs.stats().cache.writebacks, before, "a directory's fsync writes back no file's data");
    drop(busy);
    let fs = cut_and_remount(&dev, fs);
    assert!(fs.exists("dir/new") && fs.exists("dir/busy") && !fs.exists("busy"));
    // The unsynced data is gone, and the file does not claim it: it is empty.
    assert_eq!(read_all(&fs, "dir/busy"), b"");
    fs.unmount().unwrap();
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

/// An fdatasync of overwrites lets the file's lock go while its data is on
/// the device: another thread's write to the file goes on meanwhile (a
/// database writes its next commits into its log while the last are being
/// synced), and the next fdatasync writes it.
#[test]
fn a_write_goes_on_while_an_fdatasync_of_the_file_is_on_the_device() {
    const SPIKE_MS: u64 = 250;
    let dir = tempfile::tempdir().unwrap();
    let plain = format!("emu:null,size=16m,file={}", dir.path().join("emu.img").display());
    FileSystem::format(spec_engine(&plain), FormatOptions::default()).unwrap();
    let fs = mount_spec(&plain, MountOptions::default());
    fs.create("log").unwrap().write_at(&bytes(1, 8 * 4096), 0).unwrap();
    fs.sync().unwrap();
    fs.unmount().unwrap();
    // Every device command now takes 250 ms.
    let fs = mount_spec(&format!("{plain},spike_rate=1,spike={SPIKE_MS}ms"), MountOptions::default());
    let f = Arc::new(fs.open("log").unwrap());
    f.write_at(&bytes(2, 4096), 0).unwrap(); // whole blocks: nothing to read first
    let before = fs.stats().overwrite_syncs;
    let syncing = {
        let f = Arc::clone(&f);
        std::thread::spawn(move || f.fdatasync())
    };
    while fs.stats().overwrite_syncs == before {
        std::thread::yield_now();
    }
    let t = std::time::Instant::now();
    f.write_at(&bytes(3, 4096), 4096).unwrap();
    let took = t.elapsed();
    syncing.join().unwrap().unwrap();
    assert!(
        took < std::time::Duration::from_millis(SPIKE_MS / 2),
        "the write waited {took:?} for the fdatasync's device time"
    );
    f.fdatasync().unwrap();
    drop(f);
    fs.unmount().unwrap();
    let fs = mount_spec(&plain, MountOptions::default());
    let mut back = vec![0u8; 3 * 4096];
    assert_eq!(fs.open("log").unwrap().read_at(&mut back, 0).unwrap(), back.len());
    assert!(back[..4096] == bytes(2, 4096)[..] && back[4096..8192] == bytes(3, 4096)[..], "both writes kept");
    assert!(back[8192..] == bytes(1, 8 * 4096)[8192..3 * 4096], "the block nobody wrote again");
}

/// Eight threads overwrite their own pages of one file and fdatasync after
/// each write, so that their syncs' durable writes are in flight while the
/// others write and take their pages: a power cut at any of several points
/// loses no page an fdatasync returned for, and no page reads as anything
/// but a version its thread wrote. The same with 512-byte records that
/// share one block (a log's appenders): a sync returns without a write of
/// its own once another thread's sync job covered its record.
#[test]
fn fdatasyncs_of_overwrites_from_many_threads_lose_nothing_at_a_power_cut() {
    for record in [4096, 512] {
        fdatasyncs_of_records_from_many_threads(record);
    }
}

fn fdatasyncs_of_records_from_many_threads(record: usize) {
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 60;
    let version = move |t: u64, v: u64| bytes(t * 1000 + v, record);
    let at = move |t: u64| t * record as u64;
    let (mut shared, mut cut_during) = (0, 0);
    // Cut points: a run makes at least one sync job per round (60 commands and
    // more); how many more depends on how often the syncs share their jobs.
    for cut_after in [5, 30, 90, 200, 400, u64::MAX] {
        let (dev, fs) = fresh("emu:dram-ssd,size=16m,wcache=1,cut=drop", FormatOptions::default());
        let f = fs.create("log").unwrap();
        for t in 0..THREADS {
            f.write_at(&version(t, 0), at(t)).unwrap();
        }
        f.fsync().unwrap();
        let f = Arc::new(f);
        let acked = Arc::new(Mutex::new(vec![0u64; THREADS as usize]));
        if cut_after != u64::MAX {
            dev.cut_after(cut_after);
        }
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (f, acked) = (Arc::clone(&f), Arc::clone(&acked));
                std::thread::spawn(move || {
                    for v in 1..=ROUNDS {
                        if f.write_at(&version(t, v), at(t)).and_then(|_| f.fdatasync()).is_err() {
                            return;
                        }
                        acked.lock().unwrap()[t as usize] = v;
                        // What any reader sees meanwhile: this thread's last version.
                        let mut back = vec![0u8; record];
                        f.read_at(&mut back, at(t)).unwrap();
                        assert!(back == version(t, v), "thread {t} reads back another version than {v}");
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let acked = acked.lock().unwrap().clone();
        shared += fs.stats().shared_commits;
        drop(f);
        let fs = if dev.powered() {
            // No cut during the run (none asked, or it made fewer commands): cut now.
            let fs = cut_and_remount(&dev, fs);
            assert!(acked.iter().all(|&v| v == ROUNDS), "every fdatasync returned: {acked:?}");
            fs
        } else {
            cut_during += 1;
            drop(fs);
            dev.power_on();
            mount(&dev)
        };
        let got = read_all(&fs, "log");
        for t in 0..THREADS {
            let have = &got[at(t) as usize..][..record];
            let fine = (acked[t as usize]..=ROUNDS).any(|v| have == &version(t, v)[..]);
            assert!(
                fine,
                "{record}-byte records, cut after {cut_after}: thread {t}'s lost its acknowledged version {}",
                acked[t as usize]
            );
        }
        fs.unmount().unwrap();
    }
    assert!(cut_during >= 2, "{record}-byte records: the power went off during {cut_during} runs only");
    // (Whether a sync found its record covered depends on timing: counted, not asserted.)
    eprintln!("{record}-byte records: {shared} syncs found their data synced by another thread's");
}

#[test]
fn sixteen_threads_of_reads_writes_and_fsyncs_lose_nothing() {
    for path in ["auto", "sync-yield", "sync-path", "stm"] {
        let dev = emu("emu:dram-ssd,size=64m,wcache=1");
        FileSystem::format(engine(&dev, path), FormatOptions::default()).unwrap();
        let (fs, _) = FileSystem::mount(engine(&dev, path)).unwrap();
        let threads: Vec<_> = (0..16u64)
            .map(|t| {
                let fs = fs.clone();
                std::thread::spawn(move || {
                    let mine = fs.create(format!("t{t}")).unwrap();
                    let shared = fs.open_or_create("shared").unwrap();
                    let mut rng = fastrand::Rng::with_seed(t);
                    let mut expect = Vec::new();
                    for round in 0..40u64 {
                        let data = bytes(t * 1000 + round, rng.usize(1..9000));
                        mine.append(&data).unwrap();
                        expect.extend_from_slice(&data);
                        // Each thread owns its own 4 KiB slot of the shared file.
                        shared.write_at(&bytes(t, 4096), t * 4096).unwrap();
                        if round % 4 == 0 {
                            mine.fsync().unwrap();
                        }
                        if round % 7 == 0 {
                            shared.fdatasync().unwrap();
                        }
                        let at = rng.usize(..expect.len());
                        let mut back = vec![0u8; (expect.len() - at).min(5000)];
                        assert_eq!(mine.read_at(&mut back, at as u64).unwrap(), back.len());
                        assert_eq!(back, expect[at..at + back.len()], "thread {t} round {round}");
                    }
                    expect
                })
            })
            .collect();
        let expected: Vec<Vec<u8>> = threads.into_iter().map(|t| t.join().unwrap()).collect();
        fs.sync().unwrap();
        // A power cut now loses nothing: all of it was synced.
        let fs = cut_and_remount(&dev, fs);
        for (t, want) in expected.iter().enumerate() {
            assert_eq!(&read_all(&fs, &format!("t{t}")), want, "{path}: file t{t}");
        }
        let shared = read_all(&fs, "shared");
        for t in 0..16u64 {
            assert_eq!(&shared[t as usize * 4096..][..4096], &bytes(t, 4096)[..], "{path}: shared slot {t}");
        }
    }
}

#[test]
fn fsyncs_of_many_threads_survive_a_power_cut_in_the_middle() {
    // Eight threads append and fsync their own files at once (so their fsyncs
    // meet at the journal and share commits); the power is cut while they run.
    // After recovery every file holds at least what its last successful fsync
    // covered, and nothing but the bytes its thread wrote, in order.
    let mut shared = 0;
    for (round, fsync_path, path) in [
        (0u64, FsyncPath::Aios, "sync-yield"),
        (1, FsyncPath::Conventional, "sync-yield"),
        (2, FsyncPath::Aios, "stm"),
        (3, FsyncPath::Conventional, "sync-path"),
        (4, FsyncPath::Journaled, "sync-yield"),
        (5, FsyncPath::Journaled, "stm"),
    ] {
        let dev = emu(&format!("emu:dram-ssd,size=64m,wcache=1,cut_seed={round}"));
        FileSystem::format(engine(&dev, path), FormatOptions::default()).unwrap();
        let options = MountOptions { fsync_path, ..MountOptions::default() };
        let fs = mount_with(&dev, path, options);
        const THREADS: u64 = 8;
        let durable: Arc<Vec<std::sync::atomic::AtomicU64>> =
            Arc::new((0..THREADS).map(|_| std::sync::atomic::AtomicU64::new(0)).collect());
        let stream = |t: u64| bytes(round * 100 + t, 512 * 1024);
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (fs, durable) = (fs.clone(), Arc::clone(&durable));
                std::thread::spawn(move || {
                    let data = bytes(round * 100 + t, 512 * 1024);
                    let mut rng = fastrand::Rng::with_seed(t);
                    let Ok(f) = fs.create(format!("t{t}")) else { return };
                    let mut written = 0;
                    while written < data.len() {
                        let n = rng.usize(1..6000).min(data.len() - written);
                        if f.append(&data[written..written + n]).is_err() {
                            return;
                        }
                        written += n;
                        if f.fsync().is_err() {
                            return;
                        }
                        durable[t as usize].store(written as u64, std::sync::atomic::Ordering::Release);
                    }
                })
            })
            .collect();
        // Cut once every thread has made something durable (or after a while).
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while durable.iter().any(|d| d.load(std::sync::atomic::Ordering::Acquire) < 20_000)
            && std::time::Instant::now() < give_up
        {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(dev.power_cut());
        for t in threads {
            t.join().unwrap();
        }
        shared += fs.stats().shared_commits;
        drop(fs);
        dev.power_on();
        let fs = mount(&dev);
        for t in 0..THREADS {
            let synced = durable[t as usize].load(std::sync::atomic::Ordering::Acquire) as usize;
            let got = if synced == 0 && fs.open(format!("t{t}")).is_err() {
                Vec::new()
            } else {
                read_all(&fs, &format!("t{t}"))
            };
            let want = stream(t);
            assert!(got.len() >= synced, "{fsync_path:?}/{path}: t{t} has {} bytes, {synced} were synced", got.len());
            assert!(got[..] == want[..got.len()], "{fsync_path:?}/{path}: t{t} holds bytes it never wrote");
        }
    }
    // Not asserted (it depends on timing): how often fsyncs shared a commit.
    eprintln!("fsyncs that found their transaction committed by another thread: {shared}");
}

/// One step of the crash workload.
#[derive(Debug, Clone)]
enum Step {
    Create(String),
    Append(String, Vec<u8>),
    Truncate(String, u64),
    /// A file or a directory (with everything below it).
    Rename(String, String),
    Unlink(String),
    Mkdir(String),
    Rmdir(String),
    Fsync(String),
    Sync,
}

/// Path -> (file identity, contents): identities follow files through
/// renames. A directory is its path with a trailing `/`, identity 0, no
/// contents.
type State = BTreeMap<String, (u32, Vec<u8>)>;

fn is_dir_key(key: &str) -> bool {
    key.ends_with('/')
}

/// Whether `path`'s directory exists in `state` (the root always does).
fn parent_exists(state: &State, path: &str) -> bool {
    path.rsplit_once('/').is_none_or(|(dir, _)| state.contains_key(&format!("{dir}/")))
}

/// A random workload over a handful of names in nested directories, valid
/// at every step, and the state after each step.
fn workload(seed: u64, steps: usize) -> (Vec<Step>, Vec<State>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let file_names = ["a", "b", "tmp", "d/c", "d/s/x", "e/c"];
    let dir_names = ["d", "d/s", "e"];
    let mut state = State::new();
    let mut out = Vec::new();
    let mut states = vec![state.clone()];
    let mut ids = 0;
    while out.len() < steps {
        let files: Vec<String> = state.keys().filter(|k| !is_dir_key(k)).cloned().collect();
        let dirs: Vec<String> =
            state.keys().filter(|k| is_dir_key(k)).map(|k| k.trim_end_matches('/').into()).collect();
        let pick = |rng: &mut fastrand::Rng, from: &[String]| from[rng.usize(..from.len())].clone();
        let free = |name: &&str| {
            parent_exists(&state, name) && !state.contains_key(*name) && !state.contains_key(&format!("{name}/"))
        };
        let creatable: Vec<&str> = file_names.iter().copied().filter(free).collect();
        let makable: Vec<&str> = dir_names.iter().copied().filter(free).collect();
        let empty_dirs: Vec<String> = dirs
            .iter()
            .filter(|d| !state.keys().any(|k| k.starts_with(&format!("{d}/")) && **k != format!("{d}/")))
            .cloned()
            .collect();
        let step = match rng.u8(..13) {
            0 | 1 if !creatable.is_empty() => Step::Create(creatable[rng.usize(..creatable.len())].to_string()),
            2..=4 if !files.is_empty() => {
                Step::Append(pick(&mut rng, &files), bytes(rng.u64(..), rng.usize(1..3 * 4096 + 100)))
            }
            5 if !files.is_empty() => {
                let name = pick(&mut rng, &files);
                let len = state[&name].1.len() as u64;
                Step::Truncate(name, if rng.bool() { len / 2 } else { len + rng.u64(1..6000) })
            }
            6 if !files.is_empty() => {
                let to = file_names[rng.usize(..file_names.len())];
                if !parent_exists(&state, to) || state.contains_key(&format!("{to}/")) {
                    continue;
                }
                Step::Rename(pick(&mut rng, &files), to.to_string())
            }
            7 if files.len() > 2 => Step::Unlink(pick(&mut rng, &files)),
            8 if !files.is_empty() => Step::Fsync(pick(&mut rng, &files)),
            9 => Step::Sync,
            10 if !makable.is_empty() => Step::Mkdir(makable[rng.usize(..makable.len())].to_string()),
            11 if !empty_dirs.is_empty() => Step::Rmdir(pick(&mut rng, &empty_dirs)),
            12 if !dirs.is_empty() => {
                // A directory to a free name or over an empty directory, never below itself.
                let from = pick(&mut rng, &dirs);
                let to = dir_names[rng.usize(..dir_names.len())];
                let over_empty = empty_dirs.iter().any(|d| d == to);
                if to == from
                    || to.starts_with(&format!("{from}/"))
                    || !parent_exists(&state, to)
                    || state.contains_key(to)
                    || (state.contains_key(&format!("{to}/")) && !over_empty)
                {
                    continue;
                }
                Step::Rename(from, to.to_string())
            }
            _ => continue,
        };
        match &step {
            Step::Create(n) => {
                ids += 1;
                state.insert(n.clone(), (ids, Vec::new()));
            }
            Step::Append(n, d) => state.get_mut(n).unwrap().1.extend_from_slice(d),
            Step::Truncate(n, len) => state.get_mut(n).unwrap().1.resize(*len as usize, 0),
            Step::Rename(from, to) if state.contains_key(from) => {
                let d = state.remove(from).unwrap();
                state.insert(to.clone(), d);
            }
            Step::Rename(from, to) => {
                state.remove(&format!("{to}/"));
                let prefix = format!("{from}/");
                let moved: Vec<String> = state.keys().filter(|k| k.starts_with(&prefix)).cloned().collect();
                for key in moved {
                    let value = state.remove(&key).unwrap();
                    state.insert(format!("{to}/{}", &key[prefix.len()..]), value);
                }
            }
            Step::Unlink(n) => {
                state.remove(n);
            }
            Step::Mkdir(d) => {
                state.insert(format!("{d}/"), (0, Vec::new()));
            }
            Step::Rmdir(d) => {
                state.remove(&format!("{d}/"));
            }
            Step::Fsync(_) | Step::Sync => {}
        }
        out.push(step);
        states.push(state.clone());
    }
    (out, states)
}

fn run_step(fs: &FileSystem, step: &Step, direct: bool) -> iopath::Result<()> {
    let open = |n: &str| if direct { fs.open_direct(n) } else { fs.open(n) };
    match step {
        Step::Create(n) => fs.create(n).map(drop),
        Step::Append(n, d) => open(n)?.append(d).map(drop),
        Step::Truncate(n, len) => open(n)?.truncate(*len),
        Step::Rename(from, to) => fs.rename(from, to),
        Step::Unlink(n) => fs.unlink(n),
        Step::Mkdir(d) => fs.mkdir(d, 0o755),
        Step::Rmdir(d) => fs.rmdir(d),
        Step::Fsync(n) => open(n)?.fsync(),
        Step::Sync => fs.sync(),
    }
}

/// Whether `step` changes what `name` holds.
fn touches(step: &Step, name: &str) -> bool {
    let under = |dir: &str| name == dir || name.starts_with(&format!("{dir}/"));
    match step {
        Step::Create(n) | Step::Append(n, _) | Step::Truncate(n, _) | Step::Unlink(n) => n == name,
        Step::Rename(a, b) => under(a) || under(b),
        Step::Mkdir(_) | Step::Rmdir(_) | Step::Fsync(_) | Step::Sync => false,
    }
}

/// Everything in the file system: files by path with their contents,
/// directories by path with a trailing `/` (as [`State`] keys them).
fn tree(fs: &FileSystem) -> BTreeMap<String, Vec<u8>> {
    fn walk(fs: &FileSystem, dir: &str, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in fs.read_dir(if dir.is_empty() { "/" } else { dir }).unwrap() {
            let path = format!("{dir}{}", String::from_utf8(entry.name).unwrap());
            if entry.kind == iopath::fs::Kind::Dir {
                out.insert(format!("{path}/"), Vec::new());
                walk(fs, &format!("{path}/"), out);
            } else if entry.kind == iopath::fs::Kind::Symlink {
                out.insert(format!("{path} ->"), fs.read_link(&path).unwrap());
            } else {
                out.insert(path.clone(), read_all(fs, &path));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(fs, "", &mut out);
    out
}

/// Checks a recovered file system against the workload's states `synced..=reached`:
///
/// - the namespace (which file each name holds) is exactly the one after one
///   of these steps: create, rename and unlink are atomic and never undone
///   past the last `sync`;
/// - each file's size is one that file had after one of these steps (a
///   file's data and size may lag the namespace: what was written through
///   the cache becomes durable with that file's fsync, not another's);
/// - every byte of every file is one that file held at that position after
///   one of these steps, or zero: no stale block, no other file's data.
fn check_recovered(
    got: &BTreeMap<String, Vec<u8>>,
    states: &[State],
    synced: usize,
    reached: usize,
) -> Result<(), String> {
    let window = &states[synced..=reached];
    let got_names: Vec<&String> = got.keys().collect();
    let mut why = "the names match no state".to_string();
    // Several steps may have the same names (with different files behind them): any may be it.
    for candidate in window.iter().filter(|s| s.keys().collect::<Vec<_>>() == got_names) {
        match check_files(got, candidate, window) {
            Ok(()) => return Ok(()),
            Err(e) => why = e,
        }
    }
    Err(why)
}

/// The files of `got`, taken to be those `names` holds, against their histories in `window`.
fn check_files(got: &BTreeMap<String, Vec<u8>>, names: &State, window: &[State]) -> Result<(), String> {
    for (name, (id, _)) in names {
        let data = &got[name];
        let history: Vec<&Vec<u8>> =
            window.iter().flat_map(|s| s.values().filter(|(i, _)| i == id).map(|(_, d)| d)).collect();
        if !history.iter().any(|h| h.len() == data.len()) {
            let sizes: Vec<usize> = history.iter().map(|h| h.len()).collect();
            return Err(format!("'{name}' has {} bytes, a size that file never had (it had {sizes:?})", data.len()));
        }
        for (i, &b) in data.iter().enumerate() {
            if b != 0 && !history.iter().any(|h| h.get(i) == Some(&b)) {
                return Err(format!("'{name}' byte {i} is {b}, which that file never held there"));
            }
        }
    }
    Ok(())
}

/// Cuts the power before every device command of the workload in turn and
/// checks each recovery with [`check_recovered`]; every file whose `fsync`
/// completed (and that nothing touched afterwards) must be exactly as it was then.
fn crash_at_every_step(seed: u64, cut: &str, mount_options: MountOptions, direct: bool) {
    crash_at_every_step_logged(seed, cut, mount_options, direct, false)
}

/// [`crash_at_every_step`], with a shared-memory log of namespace changes
/// (small: the journal takes it every few changes) if `logged`; a power cut
/// loses the log as it loses `/dev/shm`.
fn crash_at_every_step_logged(seed: u64, cut: &str, mount_options: MountOptions, direct: bool, logged: bool) {
    let logs = tempfile::tempdir().unwrap();
    let mount_options_for = |dev: &Arc<EmuDevice>, n: u64| {
        let log = logged.then(|| shm_log(&logs.path().join(format!("log-{n}")), 64 << 10));
        FileSystem::mount_beside(engine(dev, "sync-path"), mount_options, None, log).unwrap().0
    };
    let only: Option<u64> = std::env::var("CUT_AT").ok().map(|v| v.parse().unwrap());
    let (steps, states) = workload(seed, 70);
    let spec = format!("emu:null,size=16m,wcache=1,cut={cut},cut_seed={seed}");
    let options = FormatOptions { inodes: Some(16), journal_blocks: Some(24) };
    // A run without a cut counts the commands.
    let dev = emu(&spec);
    let eng = engine(&dev, "sync-path");
    eng.write_at(&vec![0xeeu8; 1 << 20], 0).unwrap();
    eng.flush().unwrap();
    FileSystem::format(eng, options).unwrap();
    let fs = mount_options_for(&dev, u64::MAX);
    let start = dev.commands_since_power_on();
    for s in &steps {
        run_step(&fs, s, direct).unwrap();
    }
    drop(fs);
    let total = dev.commands_since_power_on() - start;
    let mut replays = 0;
    for cut_at in 0..total {
        if only.is_some_and(|o| o != cut_at) {
            continue;
        }
        let dev = emu(&spec);
        // Old contents no file ever holds: a block that shows up unwritten is caught.
        let eng = engine(&dev, "sync-path");
        let stale = vec![0xeeu8; 1 << 20];
        for mib in 0..16 {
            eng.write_at(&stale, mib << 20).unwrap();
        }
        eng.flush().unwrap();
        FileSystem::format(eng, options).unwrap();
        let fs = mount_options_for(&dev, cut_at);
        dev.cut_after(cut_at);
        let mut synced = 0; // state index durable as a whole
        let mut fsynced: BTreeMap<String, usize> = BTreeMap::new();
        let mut reached = steps.len();
        for (i, s) in steps.iter().enumerate() {
            match run_step(&fs, s, direct) {
                Ok(()) => match s {
                    Step::Sync => synced = i + 1,
                    Step::Fsync(n) => {
                        fsynced.insert(n.clone(), i + 1);
                    }
                    _ => {}
                },
                Err(_) => {
                    reached = i + 1;
                    break;
                }
            }
            if !dev.powered() {
                reached = i + 1;
                break;
            }
        }
        // Unmounting writes more (the commands after the workload's are cut points too).
        drop(fs);
        if dev.powered() {
            dev.power_cut();
        }
        dev.power_on();
        // fsck replays the journal as a mount would, and finds nothing wrong; the mount then
        // has nothing left to replay.
        let report = check::check(engine(&dev, "sync-path"))
            .unwrap_or_else(|e| panic!("seed {seed} cut {cut} at command {cut_at}: fsck failed: {e}"));
        assert!(report.is_clean(), "seed {seed} cut {cut} at command {cut_at}: fsck: {:?}", report.problems);
        replays += report.replayed;
        let (fs, mounted) = FileSystem::mount(engine(&dev, "sync-path"))
            .unwrap_or_else(|e| panic!("seed {seed} cut {cut} at command {cut_at}: mount failed: {e}"));
        assert_eq!(mounted.replayed, 0);
        let got = tree(&fs);
        if let Err(why) = check_recovered(&got, &states, synced, reached) {
            let summary =
                |s: &State| s.iter().map(|(k, (id, v))| format!("{k}#{id}:{}", v.len())).collect::<Vec<_>>().join(" ");
            let history: Vec<String> = (synced..=reached)
                .map(|k| {
                    let step = if k == 0 { "start".to_string() } else { format!("{:?}", steps[k - 1]) };
                    format!("  after {k} {}: {}", step.chars().take(40).collect::<String>(), summary(&states[k]))
                })
                .collect();
            let got_summary: Vec<String> = got.iter().map(|(k, v)| format!("{k}:{}", v.len())).collect();
            panic!(
                "seed {seed} cut {cut} at command {cut_at}: {why}; recovered {}; steps {synced} to {reached}:\n{}",
                got_summary.join(" "),
                history.join("\n")
            );
        }
        for (name, at) in fsynced {
            let touched_later = steps[at..reached].iter().any(|s| touches(s, &name));
            if !touched_later {
                let want = states[at].get(&name).map(|(_, d)| d);
                assert_eq!(got.get(&name), want, "seed {seed} cut {cut} at {cut_at}: fsync'd '{name}'");
            }
        }
        fs.unmount().unwrap();
        let report = check::check(engine(&dev, "sync-path")).unwrap();
        assert!(report.is_clean(), "seed {seed} cut {cut} at {cut_at}: fsck after remount: {:?}", report.problems);
    }
    assert!(replays > 0, "some cut must have left a transaction to replay");
}

#[test]
fn power_cuts_at_every_step_leave_a_consistent_file_system_torn() {
    for seed in 1..=3 {
        crash_at_every_step(seed, "tear", MountOptions::default(), false);
    }
}

#[test]
fn power_cuts_at_every_step_leave_a_consistent_file_system_dropped() {
    crash_at_every_step(4, "drop", MountOptions::default(), false);
}

#[test]
fn power_cuts_at_every_step_with_namespace_changes_in_a_shared_memory_log() {
    crash_at_every_step_logged(11, "tear", MountOptions::default(), false, true);
    crash_at_every_step_logged(12, "drop", MountOptions::default(), false, true);
}

#[test]
fn power_cuts_on_the_conventional_paths_and_on_direct_files() {
    let conventional = MountOptions {
        read_path: ReadPath::Conventional,
        fsync_path: FsyncPath::Conventional,
        ..MountOptions::default()
    };
    crash_at_every_step(5, "tear", conventional, false);
    crash_at_every_step(6, "tear", MountOptions::default(), true);
    crash_at_every_step(7, "tear", conventional, true);
}

#[test]
fn power_cuts_at_every_step_on_the_journaled_fsync_path() {
    let journaled = MountOptions { fsync_path: FsyncPath::Journaled, ..MountOptions::default() };
    crash_at_every_step(8, "tear", journaled, false);
    crash_at_every_step(9, "drop", journaled, false);
    crash_at_every_step(10, "tear", journaled, true);
}

/// On the `journaled` path a block's data image stays in the journal until a
/// checkpoint; data written over that block in place later (a write too large
/// to journal, a direct write, a page written back before the fsync) must not
/// be put back to the older image by replay, nor may it when the block was
/// freed and another file reused it.
#[test]
fn journaled_images_never_overwrite_newer_data_at_replay() {
    let options = FormatOptions { inodes: Some(16), journal_blocks: Some(256) };
    type Overwrite = fn(&FileSystem, &[u8]);
    let overwrites: [(&str, Overwrite); 3] = [
        ("a write too large to journal", |fs, new| {
            let f = fs.open("f").unwrap();
            f.write_at(new, 0).unwrap();
            f.fsync().unwrap();
        }),
        ("a direct write and fdatasync", |fs, new| {
            let f = fs.open_direct("f").unwrap();
            f.write_at(&new[..4096], 0).unwrap();
            f.fdatasync().unwrap();
        }),
        ("a write back by sync, then fsync", |fs, new| {
            let f = fs.open("f").unwrap();
            f.write_at(&new[..4096], 0).unwrap();
            fs.sync().unwrap();
            f.fsync().unwrap();
        }),
    ];
    for (what, overwrite) in overwrites {
        for cut in ["drop", "tear"] {
            let (dev, fs) = fresh_journaled(&format!("emu:null,size=16m,wcache=1,cut={cut}"), options);
            let old = bytes(1, 4096);
            let f = fs.create("f").unwrap();
            f.write_at(&old, 0).unwrap();
            f.fsync().unwrap(); // block 0's image is in the journal now
            drop(f);
            let new = bytes(2, 24 * 4096); // more blocks than one fsync journals
            overwrite(&fs, &new);
            let fs = cut_and_remount(&dev, fs);
            let got = read_all(&fs, "f");
            assert!(got[..4096] == new[..4096], "{what}, cut={cut}: replay put the older image back");
        }
    }

    // A freed block reused by another file, written in place: `b` fills the
    // device, so the allocator, wrapping around, hands it `a`'s old blocks.
    let (dev, fs) = fresh_journaled("emu:null,size=16m,wcache=1,cut=drop", options);
    let a = fs.create("a").unwrap();
    a.write_at(&bytes(3, 8 * 4096), 0).unwrap();
    a.fsync().unwrap();
    drop(a); // gives back what was taken ahead for appends
    let a = fs.open("a").unwrap();
    a.truncate(0).unwrap();
    a.fsync().unwrap();
    let b = fs.create("b").unwrap();
    let room = fs.free_blocks().unwrap() - 64; // room for metadata
    let want = bytes(4, room as usize * 4096);
    b.write_at(&want, 0).unwrap();
    b.fsync().unwrap();
    drop((a, b));
    let fs = cut_and_remount(&dev, fs);
    assert!(read_all(&fs, "b") == want, "a freed block's old image was replayed into another file");
    assert!(read_all(&fs, "a").is_empty());
}

#[test]
fn a_failed_commit_stops_changes_until_a_remount_recovers() {
    let dev = emu("emu:null,size=8m,wcache=1");
    FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
    let fs = mount(&dev);
    let f = fs.create("kept").unwrap();
    f.append(b"durable").unwrap();
    f.fsync().unwrap();
    f.append(b" lost").unwrap();
    dev.cut_after(1); // the commit's first write goes, then the device dies
    assert!(f.fsync().is_err());
    let e = fs.create("new").unwrap_err();
    assert_eq!(errno(e), libc::EROFS);
    drop((f, fs));
    dev.power_on();
    let fs = mount(&dev);
    assert_eq!(read_all(&fs, "kept"), b"durable");
}

fn mount_with(dev: &Arc<EmuDevice>, path: &str, options: MountOptions) -> FileSystem {
    FileSystem::mount_with(engine(dev, path), options).unwrap().0
}

/// A file of `blocks` 4 KiB blocks, block i filled by `bytes(i)`, written and on the device.
fn laid_out(fs: &FileSystem, name: &str, blocks: u64) {
    let f = fs.create(name).unwrap();
    for i in 0..blocks {
        f.write_at(&bytes(i, 4096), i * 4096).unwrap();
    }
    f.fsync().unwrap();
}

#[test]
fn threads_missing_the_same_page_at_once_end_with_one_page_and_correct_data() {
    for read_path in [ReadPath::Aios, ReadPath::Conventional] {
        let dev = emu("emu:optane,size=64m");
        FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
        let options = MountOptions { read_path, readahead_bytes: 0, ..MountOptions::default() };
        let fs = mount_with(&dev, "sync-path", options);
        laid_out(&fs, "f", 256);
        fs.unmount().unwrap();
        let fs = mount_with(&dev, "stm", options);
        let f = fs.open("f").unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (f, barrier) = (f.clone(), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    for block in 0..256u64 {
                        barrier.wait(); // all eight miss block `block` together
                        let mut buf = vec![0u8; 4096];
                        assert_eq!(f.read_at(&mut buf, block * 4096).unwrap(), 4096);
                        assert_eq!(buf, bytes(block, 4096), "{read_path:?} block {block}");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let stats = fs.stats().cache;
        assert_eq!(stats.resident, 256, "{read_path:?}: one page per block: {stats:?}");
        assert_eq!(stats.hits + stats.misses, 8 * 256);
        if read_path == ReadPath::Conventional {
            assert_eq!(stats.duplicates, 0, "the conventional path indexes before it reads");
        }
    }
}

#[test]
fn readers_never_see_a_torn_page_while_writers_rewrite_and_the_cache_evicts() {
    // Writers rewrite whole blocks, each filled with one byte (its generation);
    // readers read spans across blocks through hits (copied under the index's
    // lock), misses and loads, with a cache of 64 pages for 256 so evictions
    // run under them: every block's part of a read is one generation's.
    let dev = emu("emu:dram-ssd,size=64m");
    FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
    let options = MountOptions { cache_bytes: 64 * 4096, ..MountOptions::default() };
    let fs = mount_with(&dev, "sync-yield", options);
    let f = fs.create("f").unwrap();
    for block in 0..256u64 {
        f.write_at(&[1u8; 4096], block * 4096).unwrap();
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (f, stop) = (f.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(w);
                for round in 0..3000u64 {
                    let block = rng.u64(..256);
                    f.write_at(&[2 + ((round + w) % 200) as u8; 4096], block * 4096).unwrap();
                    if round % 500 == 0 {
                        f.fdatasync().unwrap();
                    }
                }
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            })
        })
        .collect();
    let readers: Vec<_> = (0..4u64)
        .map(|r| {
            let (f, stop) = (f.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(100 + r);
                let mut reads = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads < 2000 {
                    let at = rng.u64(..256 * 4096 - 12288);
                    let mut buf = vec![0u8; rng.usize(1..12288)];
                    assert_eq!(f.read_at(&mut buf, at).unwrap(), buf.len());
                    let mut pos = at;
                    let mut i = 0;
                    while i < buf.len() {
                        let in_block = (4096 - pos % 4096) as usize;
                        let part = &buf[i..(i + in_block).min(buf.len())];
                        assert!(part[0] >= 1 && part.iter().all(|&b| b == part[0]), "reader {r}: torn block at {pos}");
                        i += part.len();
                        pos += part.len() as u64;
                    }
                    reads += 1;
                }
            })
        })
        .collect();
    for t in writers.into_iter().chain(readers) {
        t.join().unwrap();
    }
    let stats = fs.stats().cache;
    assert!(stats.evictions > 0 && stats.hits > 0, "the cache both hit and evicted: {stats:?}");
    fs.unmount().unwrap();
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

#[test]
fn read_ahead_follows_streams_and_stays_off_for_random_reads() {
    let dev = emu("emu:null,size=256m");
    FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
    let fs = mount(&dev);
    laid_out(&fs, "big", 8192); // 32 MiB
    fs.unmount().unwrap();

    // Random 4 KiB reads in the file: no read-ahead at all.
    let fs = mount(&dev);
    let f = fs.open("big").unwrap();
    let mut rng = fastrand::Rng::with_seed(9);
    let mut buf = vec![0u8; 4096];
    for _ in 0..3000 {
        let block = rng.u64(..8192);
        f.read_at(&mut buf, block * 4096).unwrap();
        assert_eq!(buf, bytes(block, 4096));
    }
    assert_eq!(fs.stats().cache.readahead_pages, 0, "{:?}", fs.stats().cache);
    drop((f, fs));

    // Two interleaved sequential readers: read-ahead serves their pages. Each read waits
    // for the read-ahead posted so far, so what is counted does not depend on how fast
    // the read-ahead thread runs beside the test (under a loaded machine it fell behind).
    let fs = mount(&dev);
    let f = fs.open("big").unwrap();
    for i in 0..2000u64 {
        for base in [0u64, 4096] {
            f.read_at(&mut buf, (base + i) * 4096).unwrap();
            assert_eq!(buf, bytes(base + i, 4096), "block {}", base + i);
            fs.wait_for_readahead();
        }
    }
    let c = fs.stats().cache;
    assert!(c.readahead_pages > 3900, "{c:?}");
    // Each stream misses until read-ahead confirms it (its first few reads), then never.
    assert!(c.misses <= 16, "read-ahead should turn every later read into a hit: {c:?}");
}

/// Random reads on a mount whose cache has room read around their misses,
/// out to the 64 KiB cluster: fewer misses, every byte right. Once the cache is
/// full they read only what they miss; a mount that turns it off never does.
#[test]
fn random_reads_read_around_their_misses_only_while_the_cache_has_room() {
    let dev = emu("emu:null,size=256m");
    FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
    let fs = mount(&dev);
    laid_out(&fs, "big", 8192); // 32 MiB
    fs.unmount().unwrap();
    let random_reads = |options: MountOptions| {
        let fs = mount_with(&dev, "sync-path", options);
        let f = fs.open("big").unwrap();
        let mut rng = fastrand::Rng::with_seed(5);
        let mut buf = vec![0u8; 4096];
        for _ in 0..3000 {
            let block = rng.u64(..8192);
            f.read_at(&mut buf, block * 4096).unwrap();
            assert_eq!(buf, bytes(block, 4096), "block {block}");
        }
        fs.stats().cache
    };
    // Room for the whole file (the default 64 MiB cache).
    let room = random_reads(MountOptions::default());
    assert_eq!(room.readahead_pages, 0, "no stream: {room:?}");
    assert!(room.read_around_pages > 3000, "{room:?}");
    assert!(room.read_around_used > 0, "{room:?}");
    // 3,000 reads of 8,192 blocks touch ~2,550 of them; 512 clusters hold them all.
    assert!(room.misses <= 512 + 16, "a miss per cluster at most: {room:?}");
    // A 1 MiB cache: read-around fills it and then stops.
    let full = random_reads(MountOptions { cache_bytes: 1 << 20, ..MountOptions::default() });
    assert!(full.read_around_pages <= 256, "never more than the cache had room for: {full:?}");
    assert!(full.misses > 2000, "{full:?}");
    // Turned off.
    let off = random_reads(MountOptions { read_around_bytes: 0, ..MountOptions::default() });
    assert_eq!(off.read_around_pages, 0, "{off:?}");
    assert!(off.misses > 2000, "{off:?}");
}

/// A read whose cluster takes in a block the device fails to read gets its
/// own bytes: the error is left to a read of that block, which reports it.
#[test]
fn a_device_error_around_a_miss_is_left_to_the_read_of_that_block() {
    let dir = tempfile::tempdir().unwrap();
    // The file's blocks come first on a fresh file system, a few blocks in at most:
    // data blocks 44 and 45 are blocks 33-45 of the file, inside the cluster of block 32.
    let (plain, faulty) = faulty_twin_at(dir.path(), "16m", 44, 2);
    let fs = mount_spec(&plain, MountOptions::default());
    laid_out(&fs, "f", 64);
    fs.unmount().unwrap();
    let fs = mount_spec(&faulty, MountOptions { readahead_bytes: 0, ..MountOptions::default() });
    let f = fs.open("f").unwrap();
    let mut buf = vec![0u8; 4096];
    f.read_at(&mut buf, 32 * 4096).unwrap();
    assert_eq!(buf, bytes(32, 4096));
    let mut failed = 0;
    for block in 33..48 {
        match f.read_at(&mut buf, block * 4096) {
            Ok(n) => {
                assert_eq!(n, 4096);
                assert_eq!(buf, bytes(block, 4096), "block {block}");
            }
            Err(e) => {
                assert!(e.to_string().contains("device error on read"), "{e}");
                failed += 1;
            }
        }
    }
    assert_eq!(failed, 2, "the two bad blocks, and only they, fail");
}

#[test]
fn the_cache_stays_within_its_bound_while_files_are_read_and_written() {
    let dev = emu("emu:null,size=128m");
    FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
    let options = MountOptions { cache_bytes: 1 << 20, ..MountOptions::default() };
    let fs = mount_with(&dev, "sync-path", options);
    laid_out(&fs, "f", 4096); // 16 MiB through a 1 MiB cache
    let f = fs.open("f").unwrap();
    let mut buf = vec![0u8; 4096];
    for block in (0..4096u64).rev() {
        f.read_at(&mut buf, block * 4096).unwrap();
        assert_eq!(buf, bytes(block, 4096));
    }
    let c = fs.stats().cache;
    assert!(c.resident <= 256 + 8, "{c:?}");
    assert!(c.evictions > 3000, "{c:?}");
}

#[test]
fn direct_and_cached_handles_of_one_file_see_each_others_writes() {
    let (_dev, fs) = fresh("emu:null,size=32m", FormatOptions::default());
    let cached = fs.create("f").unwrap();
    let direct = fs.open_direct("f").unwrap();
    assert!(direct.is_direct() && !cached.is_direct());
    cached.write_at(&bytes(1, 10_000), 0).unwrap(); // dirty in the cache only
    let mut buf = vec![0u8; 10_000];
    assert_eq!(direct.read_at(&mut buf, 0).unwrap(), 10_000);
    assert_eq!(buf, bytes(1, 10_000), "a direct read sees what the cache held dirty");
    direct.write_at(&bytes(2, 5000), 3000).unwrap();
    let mut buf = vec![0u8; 10_000];
    cached.read_at(&mut buf, 0).unwrap();
    let mut want = bytes(1, 10_000);
    want[3000..8000].copy_from_slice(&bytes(2, 5000));
    assert_eq!(buf, want, "a cached read after a direct write is not stale");
}

/// A direct write of whole sectors (512-byte multiples, as InnoDB's redo
/// log writes) inside a block goes to the device as it is, where it was
/// read and written back whole before (a device read before every such
/// write); other partial writes still read the block first. What the file
/// holds is the same either way, past its end included: bytes a sector
/// write leaves past the new end read as zeros once the file grows there,
/// and a write that starts past the end reads its block first (the gap is
/// zeros).
#[test]
fn a_direct_write_of_whole_sectors_inside_a_block_reads_nothing_first() {
    let (dev, fs) = fresh("emu:null,size=32m", FormatOptions::default());
    let direct = fs.create("f").unwrap();
    drop(direct);
    let direct = fs.open_direct("f").unwrap();
    let mut want = bytes(1, 3 * 4096);
    direct.write_at(&want, 0).unwrap();
    direct.fsync().unwrap();
    let reads = |fs: &FileSystem| fs.stats().device_reads;
    let before = reads(&fs);
    for (at, len, seed) in [(4096 + 512, 1536, 2), (0, 512, 3), (2 * 4096 - 512, 1024, 4)] {
        let data = bytes(seed, len);
        direct.write_at(&data, at).unwrap();
        want[at as usize..at as usize + len].copy_from_slice(&data);
    }
    assert_eq!(reads(&fs), before, "sector writes read nothing");
    let mut got = vec![0u8; want.len()];
    assert_eq!(direct.read_at(&mut got, 0).unwrap(), want.len());
    assert_eq!(got, want);
    // Not on sectors: the block is read first.
    direct.write_at(b"odd", 700).unwrap();
    want[700..703].copy_from_slice(b"odd");
    assert!(reads(&fs) > before, "a write not on sectors reads its block");
    // Shorter, then a sector write across the end: the device's stale bytes past
    // the new end never show, and read as zeros when the file grows over them.
    direct.truncate(10_000).unwrap();
    want.truncate(10_000);
    let tail = bytes(5, 1024);
    direct.write_at(&tail, 9728).unwrap();
    want.truncate(9728);
    want.extend_from_slice(&tail);
    assert_eq!(direct.len(), 10_752);
    // A sector write past the end, leaving a gap in the same block: the gap is zeros.
    let past = bytes(6, 512);
    direct.write_at(&past, 11_264).unwrap();
    want.resize(11_264, 0);
    want.extend_from_slice(&past);
    direct.truncate(3 * 4096).unwrap();
    want.resize(3 * 4096, 0);
    direct.fsync().unwrap();
    drop(direct);
    assert_eq!(read_all(&fs, "f"), want);
    drop(fs);
    let fs = mount(&dev);
    assert_eq!(read_all(&fs, "f"), want, "after a remount");
}

/// Direct overwrites of one file run together under its shared lock, while
/// other threads read it through the page cache: a thread that has written
/// its blocks reads them back through a cached handle and finds what it
/// wrote, never a page a concurrent load read from the device before the
/// write (such a load makes the overwrite forget the cached pages). Every
/// byte is checked at the end and after a remount. The same over blocks
/// preallocated and never written (their first writes are marked written
/// after, while readers cache their zeros).
#[test]
fn direct_overwrites_from_many_threads_beside_cached_readers_lose_nothing() {
    for preallocated in [false, true] {
        direct_overwrites_beside_cached_readers(preallocated);
    }
}

fn direct_overwrites_beside_cached_readers(preallocated: bool) {
    let (dev, fs) = fresh("emu:null,size=64m", FormatOptions::default());
    const WRITERS: u64 = 4;
    const BLOCKS_EACH: u64 = 16;
    const ROUNDS: u64 = 60;
    let blocks = WRITERS * BLOCKS_EACH;
    drop(fs.create("f").unwrap());
    let first = fs.open_direct("f").unwrap();
    first.write_at(&vec![0u8; (blocks * 4096) as usize], 0).unwrap();
    // The blocks written: the file's first ones, or the ones mapped ahead of them
    // (unwritten), brought inside the size.
    let base = if preallocated {
        first.truncate(2 * blocks * 4096).unwrap();
        blocks
    } else {
        0
    };
    // Block b of writer w (blocks interleaved: neighbours belong to others), round r.
    let pattern = |w: u64, r: u64, len: usize| bytes(w * 1_000_000 + r, len);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let cached = fs.open("f").unwrap();
                let mut buf = vec![0u8; 8192];
                let mut n = 0u64;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    n = n.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    cached.read_at(&mut buf, (base + (n >> 33) % (blocks - 1)) * 4096).unwrap();
                }
            });
        }
        let writers: Vec<_> = (0..WRITERS)
            .map(|w| {
                let fs = &fs;
                s.spawn(move || {
                    let direct = fs.open_direct("f").unwrap();
                    let cached = fs.open("f").unwrap();
                    for r in 0..ROUNDS {
                        for i in 0..BLOCKS_EACH {
                            let at = (base + i * WRITERS + w) * 4096;
                            // Whole blocks, and whole sectors inside one.
                            let (at, len) = if r % 3 == 2 { (at + 1024, 2048) } else { (at, 4096) };
                            let data = pattern(w, r * BLOCKS_EACH + i, len);
                            direct.write_at(&data, at).unwrap();
                            let mut back = vec![0u8; len];
                            cached.read_at(&mut back, at).unwrap();
                            assert_eq!(back, data, "writer {w} round {r} block {i}: a cached read after the write");
                        }
                    }
                })
            })
            .collect();
        // The readers stop when the writers are done, or when one of them failed.
        let results: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        for r in results {
            if let Err(panic) = r {
                std::panic::resume_unwind(panic);
            }
        }
    });
    // What each block must hold: its last whole write, with its last sector write over it.
    let mut want = vec![0u8; ((base + blocks) * 4096) as usize];
    for w in 0..WRITERS {
        for i in 0..BLOCKS_EACH {
            let at = ((base + i * WRITERS + w) * 4096) as usize;
            let last_whole = (0..ROUNDS).rev().find(|r| r % 3 != 2).unwrap();
            want[at..at + 4096].copy_from_slice(&pattern(w, last_whole * BLOCKS_EACH + i, 4096));
            if let Some(r) = (last_whole..ROUNDS).find(|r| r % 3 == 2) {
                want[at + 1024..at + 3072].copy_from_slice(&pattern(w, r * BLOCKS_EACH + i, 2048));
            }
        }
    }
    first.fsync().unwrap();
    drop(first);
    assert_eq!(read_all(&fs, "f"), want, "preallocated: {preallocated}");
    drop(fs);
    let fs = mount(&dev);
    assert_eq!(read_all(&fs, "f"), want, "preallocated: {preallocated}, after a remount");
}

/// A direct overwrite notes its time under the file's shared lock, without
/// storing the inode: `stat` shows it at once, an unmount, a `sync` and an
/// `fsync` store it, an `fdatasync` need not (as Linux's), and a time set
/// after it replaces it.
#[test]
fn the_time_of_the_last_direct_overwrite_is_what_a_remount_finds() {
    let (dev, fs) = fresh("emu:optane,size=64m,wcache=1", FormatOptions::default());
    drop(fs.create("f").unwrap());
    let direct = fs.open_direct("f").unwrap();
    direct.write_at(&bytes(1, 8192), 0).unwrap(); // allocates: not an overwrite
    direct.fsync().unwrap();
    drop(direct);
    let mtime = |fs: &FileSystem| fs.metadata("f").unwrap().mtime_ns;
    // A time in the past, committed: the next direct write's time moves, whatever the clock's tick.
    let past = |fs: &FileSystem| {
        fs.set_mtime("f", 1_000_000_000).unwrap();
        fs.sync().unwrap();
    };
    let overwrite = |fs: &FileSystem, v: u64| {
        past(fs);
        fs.open_direct("f").unwrap().write_at(&bytes(v, 4096), 4096 * (v % 2)).unwrap();
        let t = mtime(fs);
        assert!(t > 1_000_000_000, "stat shows the write's time at once: {t}");
        t
    };
    let first = overwrite(&fs, 2);
    fs.unmount().unwrap();
    let fs = mount(&dev);
    assert_eq!(mtime(&fs), first, "after an unmount");
    let second = overwrite(&fs, 3);
    fs.sync().unwrap();
    let fs = cut_and_remount(&dev, fs);
    assert_eq!(mtime(&fs), second, "after a sync and a power cut");
    let third = overwrite(&fs, 4);
    fs.open("f").unwrap().fsync().unwrap();
    let fs = cut_and_remount(&dev, fs);
    assert_eq!(mtime(&fs), third, "after an fsync and a power cut");
    let fourth = overwrite(&fs, 5);
    fs.open("f").unwrap().fdatasync().unwrap();
    let fs = cut_and_remount(&dev, fs);
    assert!([1_000_000_000, fourth].contains(&mtime(&fs)), "after an fdatasync and a power cut");
    assert_eq!(read_all(&fs, "f")[4096..], bytes(5, 4096)[..], "the data fdatasync made durable");
    // A time set after a direct write replaces the write's.
    overwrite(&fs, 6);
    fs.set_mtime("f", 7_000_000_000).unwrap();
    assert_eq!(mtime(&fs), 7_000_000_000);
    fs.unmount().unwrap();
    let fs = mount(&dev);
    assert_eq!(mtime(&fs), 7_000_000_000, "the time set last, after an unmount");
    assert_eq!(read_all(&fs, "f"), [bytes(6, 4096), bytes(5, 4096)].concat());
}

/// Direct writes of whole blocks into preallocated (unwritten) blocks of a
/// file inside its size go under the file's shared lock, many at once, and
/// the blocks are marked written after: every byte reads back, at once,
/// after a power cut once fsync returned, and after a remount; the rest of
/// the range still reads as zeros. A part of such a block takes the
/// exclusive path, where nothing else writes beside it.
#[test]
fn direct_writes_into_preallocated_blocks_go_together_and_keep_every_byte() {
    const THREADS: u64 = 4;
    const BLOCKS: u64 = 64;
    let (dev, fs) = fresh("emu:optane,size=64m,wcache=1", FormatOptions::default());
    drop(fs.create("space").unwrap());
    let direct = Arc::new(fs.open_direct("space").unwrap());
    // Growing the allocation at the end maps as much again past it, unwritten;
    // a truncate up brings those blocks inside the size (InnoDB's extension).
    direct.write_at(&bytes(1, (BLOCKS * 4096) as usize), 0).unwrap();
    direct.fsync().unwrap();
    direct.truncate(2 * BLOCKS * 4096).unwrap();
    let before = fs.stats();
    // Every other block of the preallocated half, from four threads at once.
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let direct = Arc::clone(&direct);
            s.spawn(move || {
                for i in (t..BLOCKS / 2).step_by(THREADS as usize) {
                    let block = BLOCKS + 2 * i;
                    direct.write_at(&bytes(block, 4096), block * 4096).unwrap();
                }
            });
        }
    });
    let after = fs.stats();
    assert_eq!(after.direct_shared - before.direct_shared, BLOCKS / 2, "{after:?}");
    assert_eq!(after.direct_exclusive, before.direct_exclusive, "{after:?}");
    // Block BLOCKS + 1 holds `part` at its start (or nothing yet).
    let check = |fs: &FileSystem, part: &[u8]| {
        let all = read_all(fs, "space");
        assert_eq!(all.len() as u64, 2 * BLOCKS * 4096);
        for block in BLOCKS..2 * BLOCKS {
            let got = &all[(block * 4096) as usize..((block + 1) * 4096) as usize];
            let mut want = if block % 2 == 0 { bytes(block, 4096) } else { vec![0u8; 4096] };
            if block == BLOCKS + 1 {
                want[..part.len()].copy_from_slice(part);
            }
            assert!(got == &want[..], "block {block}");
        }
    };
    check(&fs, &[]);
    let mut one = vec![0u8; 4096];
    direct.read_at(&mut one, BLOCKS * 4096).unwrap();
    assert_eq!(one, bytes(BLOCKS, 4096), "a direct read of a block written so");
    // A part of an unwritten block: the exclusive path.
    let part = bytes(7, 512);
    direct.write_at(&part, (BLOCKS + 1) * 4096).unwrap();
    assert_eq!(fs.stats().direct_exclusive, after.direct_exclusive + 1);
    direct.fsync().unwrap();
    drop(direct);
    let fs = cut_and_remount(&dev, fs);
    check(&fs, &part);
    fs.unmount().unwrap();
    check(&mount(&dev), &part);
}

/// An engine on a 64 MiB file in `dir` over io_uring, formatted (O_DIRECT
/// alignment is real there, unlike on the emulated device).
fn formatted_uring_engine(dir: &std::path::Path) -> Arc<Engine> {
    let spec = format!("uring:{},size=64m", dir.join("fs.img").display());
    let eng = spec_engine(&spec);
    FileSystem::format(Arc::clone(&eng), FormatOptions::default()).unwrap();
    eng
}

/// Direct files move whole aligned blocks straight between the device and the
/// caller's memory (zero copy) and bounce anything else; both, and the copying
/// path kept for comparison, read back exactly what was written, on io_uring
/// where O_DIRECT alignment is real.
#[test]
fn direct_transfers_with_and_without_a_copy_agree() {
    let dir = tempfile::tempdir().unwrap();
    let eng = formatted_uring_engine(dir.path());
    for direct_copy in [false, true] {
        let (fs, _) =
            FileSystem::mount_with(Arc::clone(&eng), MountOptions { direct_copy, ..MountOptions::default() }).unwrap();
        let f = fs.open_or_create("f").unwrap();
        let d = fs.open_direct("f").unwrap();
        // Whole aligned blocks from aligned memory (zero copy unless direct_copy).
        let mut aligned = iopath::IoBuf::new(64 * 1024);
        aligned.copy_from_slice(&bytes(u64::from(direct_copy), 64 * 1024));
        d.write_at(&aligned, 8192).unwrap();
        // A partial block from unaligned memory (always bounced).
        let odd = bytes(9, 5000);
        d.write_at(&odd[1..], 100_001).unwrap();
        let mut want = vec![0u8; 8192];
        want.extend_from_slice(&aligned);
        want.resize(100_001, 0);
        want.extend_from_slice(&odd[1..]);
        let mut back = iopath::IoBuf::new(want.len().next_multiple_of(4096));
        assert_eq!(d.read_at(&mut back, 0).unwrap(), want.len());
        assert_eq!(&back[..want.len()], &want[..], "direct read, direct_copy={direct_copy}");
        let mut cached = vec![0u8; want.len()];
        f.read_at(&mut cached, 0).unwrap();
        assert_eq!(cached, want, "cached read, direct_copy={direct_copy}");
        // An unaligned destination for whole blocks is bounced too.
        let mut unaligned = vec![0u8; 64 * 1024 + 1];
        d.read_at(&mut unaligned[1..], 8192).unwrap();
        assert_eq!(&unaligned[1..], &aligned[..]);
        drop((f, d));
        fs.unmount().unwrap();
    }
}

/// On io_uring a request is not sent until the batch is: a batch deeper than its
/// queue (read-ahead windows of 256 pages, writeback of hundreds of runs) must send
/// before it waits for room (it hung forever before).
#[test]
fn batches_deeper_than_the_queue_complete_on_io_uring() {
    let dir = tempfile::tempdir().unwrap();
    let eng = formatted_uring_engine(dir.path());
    let (fs, _) = FileSystem::mount(Arc::clone(&eng)).unwrap();
    let f = fs.create("f").unwrap();
    // 600 dirty pages, every other block: 300 runs written back in one batch.
    for i in 0..600u64 {
        f.write_at(&bytes(i, 4096), i * 2 * 4096).unwrap();
    }
    f.fsync().unwrap();
    drop((f, fs));
    within(std::time::Duration::from_secs(60), move || {
        let (fs, _) = FileSystem::mount(eng).unwrap();
        let f = fs.open("f").unwrap();
        let mut buf = vec![0u8; 4096];
        for i in 0..1200u64 {
            f.read_at(&mut buf, i * 4096).unwrap();
            if i % 2 == 0 {
                assert_eq!(buf, bytes(i / 2, 4096), "block {i}");
            }
        }
        assert!(fs.stats().cache.readahead_pages > 64, "{:?}", fs.stats().cache);
    });
}

fn within(limit: std::time::Duration, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    match rx.recv_timeout(limit) {
        Ok(()) => t.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => t.join().unwrap(),
        Err(_) => panic!("did not finish within {limit:?}"),
    }
}

/// A file system on a file-backed emulated device, and the same file reopened with
/// a fault on the first `bad` data blocks (segments there fail with EIO).
fn faulty_twin(dir: &std::path::Path, bad: u64) -> (String, String) {
    faulty_twin_at(dir, "16m", 0, bad)
}

/// [`faulty_twin`] of `size`, the fault on `bad` data blocks from data block `first`.
fn faulty_twin_at(dir: &std::path::Path, size: &str, first: u64, bad: u64) -> (String, String) {
    let plain = format!("emu:null,size={size},file={}", dir.join("emu.img").display());
    let eng = spec_engine(&plain);
    FileSystem::format(Arc::clone(&eng), FormatOptions::default()).unwrap();
    let (fs, _) = FileSystem::mount(eng).unwrap();
    let start = (fs.superblock().data_start + first) * 4096;
    fs.unmount().unwrap();
    let faulty = format!("{plain},fail_range={start}-{}", start + bad * 4096);
    (plain, faulty)
}

/// A sync writes a file larger than one writeback batch (16 MiB) in several;
/// when a later one fails, the earlier ones stay written, the failed one's
/// pages are dirty again, nothing is lost from the cache, and the next sync
/// tries them again.
#[test]
fn a_device_error_in_a_later_writeback_batch_keeps_its_pages_dirty() {
    let dir = tempfile::tempdir().unwrap();
    // The file's blocks come first on a fresh file system: blocks 4500.. are in the second batch.
    let (_plain, faulty) = faulty_twin_at(dir.path(), "64m", 4500, 4);
    let options = MountOptions { cache_bytes: 256 << 20, ..MountOptions::default() };
    let fs = mount_spec(&faulty, options);
    let big = fs.create("big").unwrap();
    let data = bytes(3, 5120 * 4096);
    big.write_at(&data, 0).unwrap();
    let e = fs.sync().unwrap_err();
    assert!(e.to_string().contains("device error on write"), "{e}");
    let dirty = fs.stats().dirty_pages;
    assert!((1..=1024).contains(&dirty), "the first batch's 4096 pages are written, the second's dirty: {dirty}");
    let mut back = vec![0u8; data.len()];
    assert_eq!(big.read_at(&mut back, 0).unwrap(), back.len());
    assert!(back == data, "the cache still holds every byte");
    assert!(fs.sync().is_err(), "the failed pages are tried again");
    assert_eq!(fs.stats().dirty_pages, dirty);
}

/// A writeback marks its pages clean as it copies them; if the write then
/// fails they are dirty again. Meanwhile they were clean and could be
/// evicted: a restored page must be back in the cache, where readers look,
/// or a read finds the device's older bytes and a later write of part of the
/// block starts from them. Here every command takes 20 ms and another
/// thread reads 16 MiB of holes (pages made without the device) through a
/// 1 MiB cache while the failing write is in flight.
#[test]
fn pages_of_a_failed_writeback_evicted_meanwhile_are_found_again() {
    let dir = tempfile::tempdir().unwrap();
    // The file's blocks come first on a fresh file system: data blocks 0-71 hold its 64.
    let (plain, faulty) = faulty_twin_at(dir.path(), "64m", 0, 72);
    let fs = mount_spec(&plain, MountOptions::default());
    laid_out(&fs, "a", 64);
    fs.create("holes").unwrap().truncate(16 << 20).unwrap();
    fs.sync().unwrap();
    fs.unmount().unwrap();
    let slow = format!("{faulty},fail_op=write,spike_rate=1,spike=20ms");
    let fs = mount_spec(&slow, MountOptions { cache_bytes: 1 << 20, write_behind: false, ..MountOptions::default() });
    let f = fs.open("a").unwrap();
    let new: Vec<u8> = (0..64).flat_map(|i| bytes(100 + i, 4096)).collect();
    f.write_at(&new, 0).unwrap();
    let holes = fs.open("holes").unwrap();
    let reader = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(5));
        let mut buf = vec![0u8; 64 << 10];
        for at in (0..16u64 << 20).step_by(buf.len()) {
            holes.read_at(&mut buf, at).unwrap();
        }
    });
    let e = f.fsync().unwrap_err();
    assert!(e.to_string().contains("device error on write"), "{e}");
    reader.join().unwrap();
    assert!(fs.stats().cache.evictions > 256, "the reader went through the cache: {:?}", fs.stats().cache);
    let mut back = vec![0u8; new.len()];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), back.len());
    for (i, (got, want)) in back.chunks(4096).zip(new.chunks(4096)).enumerate() {
        assert!(got == want, "block {i} reads back other bytes than were written");
    }
}

fn mount_spec(spec: &str, options: MountOptions) -> FileSystem {
    FileSystem::mount_with(spec_engine(spec), options).unwrap().0
}

/// An engine on the device `spec` names (the plain synchronous path).
fn spec_engine(spec: &str) -> Arc<Engine> {
    let device = DeviceSpec::parse(spec, None).unwrap().open().unwrap();
    Arc::new(Engine::with_device(device, PathConfig::preset("sync-path").unwrap()).unwrap())
}

#[test]
fn a_device_error_during_writeback_is_reported_and_loses_nothing_that_was_synced() {
    for fsync_path in [FsyncPath::Conventional, FsyncPath::Aios, FsyncPath::Journaled] {
        let dir = tempfile::tempdir().unwrap();
        let (plain, faulty) = faulty_twin(dir.path(), 8);
        let options = MountOptions { fsync_path, ..MountOptions::default() };
        let fs = mount_spec(&faulty, options);
        let victim = fs.create("victim").unwrap(); // its blocks come first: in the failing range
        let other = fs.create("other").unwrap();
        fs.sync().unwrap();
        victim.write_at(&bytes(1, 32 * 1024), 0).unwrap();
        other.write_at(&bytes(2, 64 * 1024), 0).unwrap(); // past the failing range
        let e = victim.fsync().unwrap_err();
        assert!(e.to_string().contains("device error on write"), "{fsync_path:?}: {e}");
        let mut back = vec![0u8; 32 * 1024];
        assert_eq!(victim.read_at(&mut back, 0).unwrap(), back.len());
        assert_eq!(back, bytes(1, 32 * 1024), "{fsync_path:?}: the unwritten data is still in the cache");
        match fsync_path {
            FsyncPath::Conventional => {
                // Nothing was committed: the file system goes on; the victim can go.
                fs.unlink("victim").unwrap();
                other.fsync().unwrap();
                drop((victim, other));
                fs.unmount().unwrap();
                let fs = mount_spec(&plain, MountOptions::default());
                assert_eq!(read_all(&fs, "other"), bytes(2, 64 * 1024));
                assert!(!fs.exists("victim"));
            }
            FsyncPath::Aios | FsyncPath::Journaled => {
                // The transaction already said "written": changes stop until a remount.
                assert_eq!(errno(fs.create("more").unwrap_err()), libc::EROFS);
                drop((victim, other, fs));
                let fs = mount_spec(&plain, MountOptions::default());
                let victim = read_all(&fs, "victim");
                if fsync_path == FsyncPath::Aios {
                    assert!(victim.is_empty(), "as of the last sync");
                } else {
                    // The transaction carried the data's images and was written whole (only
                    // the home writes failed): replay may apply it, and then the data is exact.
                    assert!(victim.is_empty() || victim == bytes(1, 32 * 1024), "the victim is torn");
                }
                assert_eq!(fs.open("other").unwrap().len(), 0);
            }
        }
    }
}

#[test]
fn a_device_error_on_read_is_reported_every_time_and_caches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, faulty) = faulty_twin(dir.path(), 4);
    let fs = mount_spec(&plain, MountOptions::default());
    laid_out(&fs, "f", 16); // blocks 0-3 land in the range that fails below
    fs.unmount().unwrap();
    for read_path in [ReadPath::Conventional, ReadPath::Aios] {
        let fs = mount_spec(&faulty, MountOptions { read_path, readahead_bytes: 0, ..MountOptions::default() });
        let f = fs.open("f").unwrap();
        let mut buf = vec![0u8; 4096];
        for _ in 0..2 {
            let e = f.read_at(&mut buf, 4096).unwrap_err();
            assert!(e.to_string().contains("device error on read"), "{read_path:?}: {e}");
        }
        assert_eq!(f.read_at(&mut buf, 8 * 4096).unwrap(), 4096);
        assert_eq!(buf, bytes(8, 4096));
        assert_eq!(fs.stats().cache.resident, 1, "{read_path:?}: only the good page is cached");
    }
}

#[test]
fn a_device_error_inside_a_read_ahead_window_fails_those_pages_only() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, _) = faulty_twin(dir.path(), 0);
    let fs = mount_spec(&plain, MountOptions::default());
    laid_out(&fs, "f", 512);
    let start = fs.superblock().data_start * 4096;
    fs.unmount().unwrap();
    // Four data blocks deep inside the file fail: read-ahead windows reach them.
    let faulty = format!("{plain},fail_range={}-{}", start + 200 * 4096, start + 204 * 4096);
    let mut buf = vec![0u8; 4096];
    // Which file blocks fail, read one by one with no read-ahead.
    let fs = mount_spec(&faulty, MountOptions { readahead_bytes: 0, ..MountOptions::default() });
    let f = fs.open("f").unwrap();
    let bad: Vec<u64> = (0..512).filter(|&b| f.read_at(&mut buf, b * 4096).is_err()).collect();
    assert!(!bad.is_empty() && bad[0] >= 32, "the failing blocks must lie past the first windows: {bad:?}");
    drop((f, fs));
    for read_path in [ReadPath::Conventional, ReadPath::Aios] {
        within(std::time::Duration::from_secs(60), {
            let (faulty, bad) = (faulty.clone(), bad.clone());
            move || {
                let fs = mount_spec(&faulty, MountOptions { read_path, ..MountOptions::default() });
                let f = fs.open("f").unwrap();
                let mut buf = vec![0u8; 4096];
                for round in 0..2 {
                    for b in 0..512u64 {
                        match f.read_at(&mut buf, b * 4096) {
                            Ok(n) => {
                                assert!(!bad.contains(&b), "{read_path:?} round {round}: block {b} should fail");
                                assert_eq!(n, 4096);
                                assert_eq!(buf, bytes(b, 4096), "{read_path:?} round {round}: block {b}");
                            }
                            Err(e) => {
                                assert!(bad.contains(&b), "{read_path:?} round {round}: block {b}: {e}");
                                assert!(e.to_string().contains("device error on read"), "{e}");
                            }
                        }
                    }
                }
                assert!(fs.stats().cache.readahead_pages > 64, "{:?}", fs.stats().cache);
            }
        });
    }
}

#[test]
fn each_sync_is_counted_once() {
    let (_dev, fs) = fresh("emu:null,size=8m", FormatOptions::default());
    let f = fs.create("f").unwrap();
    f.write_at(b"x", 0).unwrap();
    let s0 = fs.stats();
    f.fsync().unwrap(); // dirty: writeback and commit
    f.fsync().unwrap(); // nothing pending: a flush
    f.write_at(b"y", 0).unwrap();
    f.fdatasync().unwrap();
    fs.sync().unwrap(); // nothing pending for the file system either
    let direct = fs.open_direct("f").unwrap();
    direct.write_at(b"z", 0).unwrap(); // no dirty pages, but its metadata (mtime) is pending
    direct.fsync().unwrap();
    let s = fs.stats();
    assert_eq!(s.syncs - s0.syncs, 5, "{s:?}");
    assert_eq!(s.flush_only - s0.flush_only, 1, "{s:?}");
}

#[test]
fn appends_take_space_ahead_and_give_it_back_on_truncate_close_and_unlink() {
    let (dev, fs) = fresh("emu:null,size=64m", FormatOptions::default());
    let free_at_start = fs.free_blocks().unwrap();
    let f = fs.create("log").unwrap();
    let data = bytes(7, 4096);
    f.append(&data).unwrap();
    f.fsync().unwrap();
    let ahead = free_at_start - fs.free_blocks().unwrap();
    assert!(ahead > 1, "the first append took {ahead} block(s): nothing ahead");
    // The appends that follow use that space: each fsync journals one image (and its
    // commit), with no free-space bitmap block.
    let (before, free_before) = (fs.stats(), fs.free_blocks().unwrap());
    for _ in 0..4 {
        f.append(&data).unwrap();
        f.fsync().unwrap();
    }
    let after = fs.stats();
    assert_eq!(fs.free_blocks().unwrap(), free_before, "appends inside the space ahead allocate nothing");
    assert_eq!(after.journal.commits - before.journal.commits, 4);
    assert_eq!(after.journal.journal_blocks - before.journal.journal_blocks, 8, "image + commit per fsync");
    // Growing the size over the space ahead reads zeros there, never old bytes.
    f.truncate(5 * 4096 + 10_000).unwrap();
    let mut tail = vec![1u8; 10_000];
    f.read_at(&mut tail, 5 * 4096).unwrap();
    assert!(tail.iter().all(|&b| b == 0));
    // Shrinking gives the space back, as does closing the last handle, and unlink;
    // after a remount too.
    f.truncate(4096).unwrap();
    f.fsync().unwrap();
    assert_eq!(fs.free_blocks().unwrap(), free_at_start - 1);
    f.append(&data).unwrap();
    let second = fs.open("log").unwrap();
    drop(f);
    assert!(fs.free_blocks().unwrap() < free_at_start - 2, "another handle is open: the space stays");
    drop(second);
    fs.sync().unwrap();
    assert_eq!(fs.free_blocks().unwrap(), free_at_start - 2, "the last close gave the space back");
    assert_eq!(read_all(&fs, "log"), [&data[..], &data[..]].concat());
    fs.unlink("log").unwrap();
    fs.sync().unwrap();
    assert_eq!(fs.free_blocks().unwrap(), free_at_start);
    fs.unmount().unwrap();
    assert_eq!(mount(&dev).free_blocks().unwrap(), free_at_start);
    // Turned off, an append takes exactly its block.
    let options = MountOptions { append_prealloc_bytes: 0, ..MountOptions::default() };
    let (fs, _) = FileSystem::mount_with(engine(&dev, "sync-path"), options).unwrap();
    let f = fs.create("exact").unwrap();
    f.append(&data).unwrap();
    f.fsync().unwrap();
    assert_eq!(fs.free_blocks().unwrap(), free_at_start - 1);
}

/// An fsync too large to journal whose write changes no metadata (an
/// overwrite of written blocks) still writes its data before the flush.
#[test]
fn a_large_overwrite_on_the_journaled_path_is_written_and_survives_a_cut() {
    let (dev, fs) = fresh_journaled("emu:null,size=16m,wcache=1,cut=drop", FormatOptions::default());
    let f = fs.create("f").unwrap();
    f.write_at(&bytes(1, 40 * 4096), 0).unwrap();
    f.fsync().unwrap();
    let new = bytes(2, 40 * 4096);
    f.write_at(&new, 0).unwrap();
    f.fsync().unwrap();
    drop(f);
    let fs = cut_and_remount(&dev, fs);
    assert!(read_all(&fs, "f") == new, "the overwrite was lost");
}

/// On the smallest journal (16 blocks) a 16-block fsync does not fit as
/// images: it is written in place instead, and nothing fails.
#[test]
fn the_journaled_path_fits_its_transactions_to_a_small_journal() {
    let options = FormatOptions { inodes: Some(16), journal_blocks: Some(16) };
    let (dev, fs) = fresh_journaled("emu:null,size=16m,wcache=1,cut=drop", options);
    let f = fs.create("f").unwrap();
    let mut want = Vec::new();
    for i in 0..20u64 {
        let chunk = bytes(i, (1 + i as usize % 16) * 4096);
        f.append(&chunk).unwrap();
        want.extend_from_slice(&chunk);
        f.fsync().unwrap();
    }
    drop(f);
    let fs = cut_and_remount(&dev, fs);
    assert!(read_all(&fs, "f") == want, "a fsync'd append was lost");
}

#[test]
fn random_damage_to_the_metadata_is_an_error_or_a_working_file_system_never_a_panic() {
    // Files with overflow extent blocks, an interrupted workload whose journal holds
    // transactions to replay, then bytes overwritten at random in the metadata (or
    // anywhere, one time in eight): mounting, listing, reading every file, writing and
    // unmounting must each succeed or fail with an error. IOPATH_DAMAGE_ROUNDS=N runs
    // more rounds than the 1000 CI runs, IOPATH_DAMAGE_SEED=S other damage (best in a
    // debug build, whose assertions check the invariants damage must not break).
    let (dev, fs) = fresh("emu:null,size=8m,wcache=1,cut=drop", FormatOptions::default());
    let (a, b) = interleaved_pair(&fs, 200);
    a.fsync().unwrap();
    b.fsync().unwrap();
    fs.rename("b", "c").unwrap();
    let d = fs.create("d").unwrap();
    d.write_at(&bytes(7, 10_000), 0).unwrap();
    d.fsync().unwrap();
    let (metadata_blocks, inode_table) = {
        let sb = fs.superblock();
        (sb.data_start, sb.inode_start as usize * 4096..(sb.inode_start + sb.inode_blocks) as usize * 4096)
    };
    drop((a, b, d));
    let fs = cut_and_remount(&dev, fs);
    drop(fs);
    let eng = engine(&dev, "sync-path");
    let mut image = iopath::IoBuf::new(8 << 20);
    for (i, chunk) in image.chunks_mut(1 << 20).enumerate() {
        eng.read_at(chunk, (i << 20) as u64).unwrap();
    }
    let seed = std::env::var("IOPATH_DAMAGE_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(42);
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut mounted, mut refused) = (0, 0);
    let rounds: usize = std::env::var("IOPATH_DAMAGE_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    for round in 0..rounds {
        let mut damaged = iopath::IoBuf::new(image.len());
        damaged.copy_from_slice(&image);
        for _ in 0..rng.usize(1..9) {
            let at = match rng.u8(..8) {
                0 => rng.usize(..damaged.len()),
                // A field of an inode in use (the first slots): its header or its extents.
                1..=3 => {
                    let field = if rng.bool() { rng.usize(..64) } else { 320 + rng.usize(..96) };
                    inode_table.start + rng.usize(..4) * 512 + field
                }
                _ => rng.usize(..metadata_blocks as usize * 4096),
            };
            damaged[at] = rng.u8(..);
        }
        if round % 2 == 1 {
            // Damage that passes the checksum (the inodes' sectors sealed again): what
            // the checks behind it must catch.
            for sector in damaged[inode_table.clone()].chunks_mut(512).filter(|s| s.iter().any(|&b| b != 0)) {
                let sum = iopath::fs::format::crc(&sector[..508]);
                sector[508..].copy_from_slice(&sum.to_le_bytes());
            }
        }
        for (i, chunk) in damaged.chunks(1 << 20).enumerate() {
            eng.write_at(chunk, (i << 20) as u64).unwrap();
        }
        match FileSystem::mount(engine(&dev, "sync-path")) {
            Err(e) => {
                refused += 1;
                assert!(!e.to_string().is_empty(), "round {round}");
            }
            Ok((fs, _)) => {
                mounted += 1;
                for entry in fs.list() {
                    if let Ok(f) = fs.open(&entry.name) {
                        let mut buf = vec![0u8; f.len().min(4 << 20) as usize];
                        let _ = f.read_at(&mut buf, 0);
                        let _ = f.write_at(b"after", 0).and_then(|_| f.fsync());
                    }
                }
                let _ = fs.create("new").and_then(|f| f.write_at(b"x", 0).map(|_| f)).and_then(|f| f.fsync());
                let _ = fs.unmount();
            }
        }
    }
    eprintln!("{mounted} mounted, {refused} refused");
    assert!(mounted > 0 && refused > 0, "both outcomes occur: {mounted} mounted, {refused} refused");
}

#[test]
fn directories_nest_list_rename_and_refuse_what_posix_refuses() {
    use iopath::fs::{Kind, Rename};
    let (dev, fs) = fresh("emu:null,size=32m,wcache=1", FormatOptions::default());
    fs.mkdir("db", 0o750).unwrap();
    fs.mkdir("/db/wal/", 0o755).unwrap();
    fs.create("db/wal/000001.log").unwrap().write_at(b"log", 0).unwrap();
    fs.create("db/./CURRENT").unwrap().write_at(b"MANIFEST-1", 0).unwrap();
    let names = |p: &str| -> Vec<String> {
        fs.read_dir(p).unwrap().into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect()
    };
    assert_eq!(names("db"), ["CURRENT", "wal"]);
    assert_eq!(names("/"), ["db"]);
    let db = fs.metadata("db").unwrap();
    assert_eq!((db.kind, db.mode, db.nlink), (Kind::Dir, libc::S_IFDIR | 0o750, 3));
    let root = fs.metadata("/").unwrap();
    assert_eq!((root.ino, root.nlink), (iopath::fs::namespace::ROOT_INO, 3));
    let log = fs.metadata("db/wal/../wal/000001.log").unwrap();
    assert_eq!((log.kind, log.size, log.nlink, log.mode), (Kind::File, 3, 1, libc::S_IFREG | 0o644));
    assert!(log.blocks >= 8, "one 4 KiB block is eight 512-byte units: {}", log.blocks);

    // What POSIX refuses, with its errno.
    assert_eq!(errno(fs.mkdir("db", 0o755).unwrap_err()), libc::EEXIST);
    assert_eq!(errno(fs.mkdir("no/such", 0o755).unwrap_err()), libc::ENOENT);
    assert_eq!(errno(fs.mkdir("db/CURRENT/x", 0o755).unwrap_err()), libc::ENOTDIR);
    assert_eq!(errno(fs.rmdir("db").unwrap_err()), libc::ENOTEMPTY);
    assert_eq!(errno(fs.rmdir("db/CURRENT").unwrap_err()), libc::ENOTDIR);
    assert_eq!(errno(fs.rmdir("/").unwrap_err()), libc::EBUSY);
    assert_eq!(errno(fs.rmdir("db/wal/.").unwrap_err()), libc::EINVAL);
    assert_eq!(errno(fs.unlink("db").unwrap_err()), libc::EISDIR);
    assert_eq!(errno(fs.open("db").unwrap_err()), libc::EISDIR);
    assert_eq!(errno(fs.open("db/CURRENT/").unwrap_err()), libc::ENOTDIR);
    assert_eq!(errno(fs.read_dir("db/CURRENT").unwrap_err()), libc::ENOTDIR);
    assert_eq!(errno(fs.rename("db", "db/wal/inside").unwrap_err()), libc::EINVAL);
    assert_eq!(errno(fs.rename("db/CURRENT", "db/wal").unwrap_err()), libc::EISDIR);
    fs.mkdir("empty", 0o755).unwrap();
    assert_eq!(errno(fs.rename("empty", "db/CURRENT").unwrap_err()), libc::ENOTDIR);
    assert_eq!(errno(fs.rename("empty", "db").unwrap_err()), libc::ENOTEMPTY);
    assert_eq!(errno(fs.rename_with("db/CURRENT", "db/wal/000001.log", Rename::NoReplace).unwrap_err()), libc::EEXIST);
    assert_eq!(errno(fs.rename_with("db/CURRENT", "db/none", Rename::Exchange).unwrap_err()), libc::ENOENT);

    // Names: any byte but '/' and NUL, up to 255 of them.
    let odd = "sp ace\n\u{e9}\u{1F600}";
    fs.create(format!("db/{odd}")).unwrap();
    fs.create(format!("db/{}", "n".repeat(255))).unwrap();
    assert_eq!(errno(fs.create(format!("db/{}", "n".repeat(256))).unwrap_err()), libc::ENAMETOOLONG);
    fs.create([b'd', b'b', b'/', 0xff, 0xfe]).unwrap();
    assert!(fs.exists([b'd', b'b', b'/', 0xff, 0xfe]));
    fs.unlink([b'd', b'b', b'/', 0xff, 0xfe]).unwrap();

    // A directory moves with everything below it, across directories, in one rename.
    let log_handle = fs.open("db/wal/000001.log").unwrap();
    fs.mkdir("archive", 0o755).unwrap();
    fs.rename("db/wal", "archive/wal-1").unwrap();
    assert_eq!(log_handle.name(), "archive/wal-1/000001.log");
    assert_eq!(read_all(&fs, "archive/wal-1/000001.log"), b"log");
    assert_eq!(fs.metadata("db").unwrap().nlink, 2);
    // An empty directory may be replaced by a directory; an exchange swaps a file and a directory.
    fs.rename("archive/wal-1", "empty").unwrap();
    assert!(!fs.exists("archive/wal-1"));
    fs.rename_with("empty", "db/CURRENT", Rename::Exchange).unwrap();
    assert_eq!(fs.metadata("empty").unwrap().kind, Kind::File);
    assert_eq!(read_all(&fs, "empty"), b"MANIFEST-1");
    assert_eq!(read_all(&fs, "db/CURRENT/000001.log"), b"log");
    // An exchange never moves a directory below itself.
    assert_eq!(errno(fs.rename_with("db", "db/CURRENT/000001.log", Rename::Exchange).unwrap_err()), libc::EINVAL);

    // Modes and times.
    fs.set_mode("db/CURRENT", 0o700).unwrap();
    assert_eq!(fs.metadata("db/CURRENT").unwrap().mode, libc::S_IFDIR | 0o700);
    fs.set_mtime("empty", 1_000_000_000).unwrap();
    assert_eq!(fs.metadata("empty").unwrap().mtime_ns, 1_000_000_000);

    // All of it survives a remount, and a power cut after a sync.
    let before = tree(&fs);
    drop(log_handle);
    fs.unmount().unwrap();
    let fs = mount(&dev);
    assert_eq!(tree(&fs), before);
    assert_eq!(fs.metadata("db/CURRENT").unwrap().mode, libc::S_IFDIR | 0o700);
    assert_eq!(fs.metadata("empty").unwrap().mtime_ns, 1_000_000_000);
    fs.rmdir("archive").unwrap();
    fs.sync().unwrap();
    let fs = cut_and_remount(&dev, fs);
    assert!(!fs.exists("archive"));
    assert_eq!(tree(&fs).len(), before.len() - 1);
}

#[test]
fn a_file_unlinked_while_open_lives_until_its_last_close_and_a_crash_reclaims_it() {
    let (dev, fs) = fresh("emu:null,size=16m,wcache=1", FormatOptions::default());
    let empty = fs.free_blocks().unwrap();
    let f = fs.create("victim").unwrap();
    f.write_at(&bytes(7, 64 << 10), 0).unwrap();
    f.fsync().unwrap();
    let second = f.clone();
    fs.unlink("victim").unwrap();
    assert!(!fs.exists("victim"));
    fs.create("victim").unwrap(); // the name is free for a new file
    // Both handles still read and write the unlinked file.
    second.write_at(b"after", 0).unwrap();
    let mut five = [0u8; 5];
    f.read_at(&mut five, 0).unwrap();
    assert_eq!(&five, b"after");
    assert_eq!(f.metadata().nlink, 0);
    drop(second);
    fs.sync().unwrap();
    assert!(fs.free_blocks().unwrap() < empty - 8, "one handle still holds the data");
    // A crash before the last close: the next mount frees the orphan.
    assert!(dev.power_cut());
    drop(f);
    drop(fs);
    dev.power_on();
    let report = check::check(engine(&dev, "sync-path")).unwrap();
    assert!(report.is_clean() && report.orphans == 1, "fsck: an orphan is no damage: {report:?}");
    let (fs, mounted) = FileSystem::mount(engine(&dev, "sync-path")).unwrap();
    assert_eq!((mounted.orphans_reclaimed, mounted.files), (1, 1));
    assert_eq!(read_all(&fs, "victim"), b"");
    fs.sync().unwrap();
    assert_eq!(fs.free_blocks().unwrap(), empty, "an empty file holds no block");
    // A close without a crash frees it at once.
    let g = fs.open("victim").unwrap();
    g.write_at(&bytes(8, 64 << 10), 0).unwrap();
    fs.unlink("victim").unwrap();
    drop(g);
    fs.sync().unwrap();
    fs.unmount().unwrap();
    let (_fs, mounted) = FileSystem::mount(engine(&dev, "sync-path")).unwrap();
    assert_eq!((mounted.orphans_reclaimed, mounted.files), (0, 0));
}

#[test]
fn an_older_image_is_upgraded_at_mount_and_its_files_are_in_the_root() {
    use iopath::fs::format::{INODE_SIZE, Superblock, crc};
    let (dev, fs) = fresh("emu:null,size=16m", FormatOptions::default());
    fs.create("a").unwrap().write_at(b"alpha", 0).unwrap();
    fs.create("b").unwrap().write_at(&bytes(3, 9000), 0).unwrap();
    fs.unmount().unwrap();
    // Make it what version 2 wrote: the version in the superblock, zeros where v3 keeps
    // the parent, mode and change time.
    let eng = engine(&dev, "sync-path");
    let mut block = iopath::IoBuf::new(4096);
    eng.read_at(&mut block, 0).unwrap();
    let mut sb = Superblock::decode(&block, dev.size() / 4096).unwrap();
    sb.version = 2;
    eng.write_at(&iopath::IoBuf::from_slice(&sb.encode()[..]), 0).unwrap();
    let at = sb.inode_start * 4096;
    eng.read_at(&mut block, at).unwrap();
    for slot in 0..2 {
        let inode = &mut block[slot * INODE_SIZE..(slot + 1) * INODE_SIZE];
        inode[44..64].fill(0);
        let sum = crc(&inode[..508]);
        inode[508..].copy_from_slice(&sum.to_le_bytes());
    }
    eng.write_at(&block, at).unwrap();
    eng.flush().unwrap();
    drop(eng);

    let (fs, mounted) = FileSystem::mount(engine(&dev, "sync-path")).unwrap();
    assert_eq!((mounted.upgraded_from, mounted.files), (Some(2), 2));
    assert_eq!(fs.superblock().version, iopath::fs::format::VERSION);
    let over_the_files = fs.superblock().inodes().min(iopath::fs::format::INODE_MARK_STEP);
    assert_eq!(inode_mark_on(&dev), over_the_files, "the upgrade set the mark over the files");
    assert_eq!(read_all(&fs, "/a"), b"alpha");
    assert_eq!(read_all(&fs, "b"), bytes(3, 9000));
    assert_eq!(fs.metadata("a").unwrap().mode, libc::S_IFREG | 0o644);
    fs.mkdir("new", 0o755).unwrap();
    fs.rename("a", "new/a").unwrap();
    fs.unmount().unwrap();
    let (fs, mounted) = FileSystem::mount(engine(&dev, "sync-path")).unwrap();
    assert_eq!((mounted.upgraded_from, mounted.dirs), (None, 1));
    assert_eq!(read_all(&fs, "new/a"), b"alpha");
}

/// A namespace operation, for [`the_namespace_answers_as_ext4_does`].
#[derive(Debug, Clone)]
enum NsOp {
    Create(String),
    Mkdir(String),
    Rmdir(String),
    Unlink(String),
    Rename(String, String, iopath::fs::Rename),
    /// `symlink(target, path)`.
    Symlink(String, String),
    /// `link(existing, new)`: a hard link.
    Link(String, String),
    /// `stat`: the kind and link count it finds, or its errno.
    Stat(String),
    /// `lstat`.
    Lstat(String),
}

fn ns_path() -> impl proptest::strategy::Strategy<Value = String> {
    use proptest::prelude::*;
    let part = prop_oneof![8 => "[abc]", 1 => Just(".".to_string()), 1 => Just("..".to_string())];
    // Mostly a name last, sometimes what the parts end with (`.` or `..` too).
    let last = prop_oneof![6 => "[abc]", 1 => Just(String::new())];
    (proptest::collection::vec(part, 1..4), any::<bool>(), last).prop_map(|(mut parts, slash, last)| {
        // Never `..` above the start: the kernel's side would leave its directory.
        let mut depth = 0;
        for part in &mut parts {
            match part.as_str() {
                "." => {}
                ".." if depth == 0 => {
                    *part = "a".into();
                    depth += 1;
                }
                ".." => depth -= 1,
                _ => depth += 1,
            }
        }
        if !last.is_empty() {
            parts.push(last);
        }
        let mut path = parts.join("/");
        if slash {
            path.push('/');
        }
        path
    })
}

fn ns_op() -> impl proptest::strategy::Strategy<Value = NsOp> {
    use iopath::fs::Rename;
    use proptest::prelude::*;
    let how = prop_oneof![4 => Just(Rename::Replace), 1 => Just(Rename::NoReplace), 1 => Just(Rename::Exchange)];
    prop_oneof![
        3 => ns_path().prop_map(NsOp::Create),
        3 => ns_path().prop_map(NsOp::Mkdir),
        1 => ns_path().prop_map(NsOp::Rmdir),
        1 => ns_path().prop_map(NsOp::Unlink),
        3 => (ns_path(), ns_path(), how).prop_map(|(a, b, h)| NsOp::Rename(a, b, h)),
        // Targets lead down, so no `..` after a link climbs out (the kernel's side would leave its directory).
        2 => ("[abc](/[abc]){0,2}|a/\\.", ns_path()).prop_map(|(t, p)| NsOp::Symlink(t, p)),
        2 => (ns_path(), ns_path()).prop_map(|(a, b)| NsOp::Link(a, b)),
        2 => ns_path().prop_map(NsOp::Stat),
        1 => ns_path().prop_map(NsOp::Lstat),
    ]
}

/// What `stat` found: a letter for the kind.
fn kind_letter(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => b'd',
        libc::S_IFLNK => b'l',
        _ => b'f',
    }
}

/// The same operation on the kernel's file system under `root`: `Ok` (with
/// the kind and link count `stat` found) or its errno.
fn kernel_op(root: &std::path::Path, op: &NsOp) -> Result<(u8, u64), i32> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &str| CString::new(root.join(p).as_os_str().as_bytes()).unwrap();
    let check =
        |rc: libc::c_int| if rc < 0 { Err(std::io::Error::last_os_error().raw_os_error().unwrap()) } else { Ok(()) };
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    unsafe {
        match op {
            NsOp::Create(p) => {
                let fd = libc::open(c(p).as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644);
                check(fd)?;
                check(libc::close(fd)).map(|()| (0, 0))
            }
            NsOp::Mkdir(p) => check(libc::mkdir(c(p).as_ptr(), 0o755)).map(|()| (0, 0)),
            NsOp::Rmdir(p) => check(libc::rmdir(c(p).as_ptr())).map(|()| (0, 0)),
            NsOp::Unlink(p) => check(libc::unlink(c(p).as_ptr())).map(|()| (0, 0)),
            NsOp::Rename(a, b, how) => {
                let flags = match how {
                    iopath::fs::Rename::Replace => 0,
                    iopath::fs::Rename::NoReplace => libc::RENAME_NOREPLACE,
                    iopath::fs::Rename::Exchange => libc::RENAME_EXCHANGE,
                };
                check(libc::renameat2(libc::AT_FDCWD, c(a).as_ptr(), libc::AT_FDCWD, c(b).as_ptr(), flags))
                    .map(|()| (0, 0))
            }
            NsOp::Symlink(t, p) => {
                let t = CString::new(t.as_bytes()).unwrap();
                check(libc::symlink(t.as_ptr(), c(p).as_ptr())).map(|()| (0, 0))
            }
            NsOp::Link(a, b) => check(libc::link(c(a).as_ptr(), c(b).as_ptr())).map(|()| (0, 0)),
            NsOp::Stat(p) | NsOp::Lstat(p) => {
                let mut st: libc::stat = std::mem::zeroed();
                let rc = if matches!(op, NsOp::Stat(_)) {
                    libc::stat(c(p).as_ptr(), &mut st)
                } else {
                    libc::lstat(c(p).as_ptr(), &mut st)
                };
                check(rc).map(|()| (kind_letter(st.st_mode), st.st_nlink))
            }
        }
    }
}

fn iopath_op(fs: &FileSystem, op: &NsOp) -> Result<(u8, u64), i32> {
    let done = |r: iopath::Result<()>| r.map(|()| (0, 0));
    let r = match op {
        NsOp::Create(p) => fs.create(p).map(|_| (0, 0)),
        NsOp::Mkdir(p) => done(fs.mkdir(p, 0o755)),
        NsOp::Rmdir(p) => done(fs.rmdir(p)),
        NsOp::Unlink(p) => done(fs.unlink(p)),
        NsOp::Rename(a, b, how) => done(fs.rename_with(a, b, *how)),
        NsOp::Symlink(t, p) => done(fs.symlink(t, p)),
        NsOp::Link(a, b) => done(fs.hard_link(a, b)),
        NsOp::Stat(p) => fs.metadata(p).map(|m| (kind_letter(m.mode), m.nlink as u64)),
        NsOp::Lstat(p) => fs.symlink_metadata(p).map(|m| (kind_letter(m.mode), m.nlink as u64)),
    };
    r.map_err(errno)
}

/// The kernel's tree under `root`, keyed as [`tree`] keys it.
fn kernel_tree(root: &std::path::Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(dir: &std::path::Path, prefix: &str, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = format!("{prefix}{}", entry.file_name().to_str().unwrap());
            if entry.file_type().unwrap().is_dir() {
                out.insert(format!("{name}/"), Vec::new());
                walk(&entry.path(), &format!("{name}/"), out);
            } else if entry.file_type().unwrap().is_symlink() {
                use std::os::unix::ffi::OsStrExt;
                let target = std::fs::read_link(entry.path()).unwrap();
                out.insert(format!("{name} ->"), target.as_os_str().as_bytes().to_vec());
            } else {
                out.insert(name, std::fs::read(entry.path()).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, "", &mut out);
    out
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

    /// Random sequences of create, mkdir, rmdir, unlink, rename, symlink,
    /// link, stat and lstat (with dots, trailing slashes, renameat2's flags
    /// and paths through links), valid or not, give the
    /// same result and errno as the kernel's file system under a temporary
    /// directory, and leave the same tree.
    #[test]
    fn the_namespace_answers_as_ext4_does(ops in proptest::collection::vec(ns_op(), 1..40)) {
        let (_dev, fs) = fresh("emu:null,size=8m", FormatOptions::default());
        let dir = tempfile::tempdir().unwrap();
        for (i, op) in ops.iter().enumerate() {
            let (want, got) = (kernel_op(dir.path(), op), iopath_op(&fs, op));
            proptest::prop_assert_eq!(got, want, "step {} {:?}", i, op);
        }
        proptest::prop_assert_eq!(tree(&fs), kernel_tree(dir.path()));
    }
}

#[test]
fn threads_renaming_unlinking_and_reading_across_directories_never_deadlock_or_tear() {
    within(std::time::Duration::from_secs(120), || {
        let (dev, fs) = fresh("emu:null,size=32m", FormatOptions::default());
        let fs = Arc::new(fs);
        let files = ["x", "y", "d1/x", "d1/y", "d2/x", "d2/s/y"];
        let dirs = ["d1", "d2", "d2/s", "d3"];
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let fs = Arc::clone(&fs);
                std::thread::spawn(move || {
                    let mut rng = fastrand::Rng::with_seed(t);
                    let mut held = Vec::new();
                    for i in 0..400u64 {
                        let f = files[rng.usize(..files.len())];
                        let d = dirs[rng.usize(..dirs.len())];
                        match rng.u8(..10) {
                            0 => {
                                // Every file holds one tag, written whole before it gets its name.
                                let tmp = format!("tmp-{t}");
                                if let Ok(h) = fs.create(&tmp) {
                                    h.write_at(format!("tag {t:02} {i:04}").as_bytes(), 0).unwrap();
                                    let _ = fs.rename(&tmp, f);
                                    let _ = fs.unlink(&tmp);
                                }
                            }
                            1 => drop(fs.unlink(f)),
                            2 => drop(fs.rename(f, files[rng.usize(..files.len())])),
                            3 => drop(fs.mkdir(d, 0o755)),
                            4 => drop(fs.rmdir(d)),
                            5 => drop(fs.rename(d, dirs[rng.usize(..dirs.len())])),
                            9 => drop(fs.hard_link(f, files[rng.usize(..files.len())])),
                            6 => {
                                if let Ok(h) = fs.open(f) {
                                    held.push(h);
                                }
                            }
                            7 => {
                                // Open handles read their file's tag, renamed or unlinked since.
                                for h in held.drain(..) {
                                    let mut buf = [0u8; 16];
                                    let n = h.read_at(&mut buf, 0).unwrap();
                                    assert_eq!(n, 11, "a tag is 11 bytes: {:?}", &buf[..n]);
                                    assert!(buf.starts_with(b"tag "), "{:?}", &buf[..n]);
                                    let _ = h.metadata();
                                    let _ = h.name();
                                }
                            }
                            _ => {
                                let _ = fs.read_dir(d);
                                let _ = fs.metadata(f);
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let fs = Arc::into_inner(fs).unwrap();
        let before = tree(&fs);
        assert!(before.iter().filter(|(k, _)| !k.ends_with('/')).all(|(_, v)| v.starts_with(b"tag ")), "{before:?}");
        let free = fs.free_blocks().unwrap();
        fs.unmount().unwrap();
        let (fs, mounted) = FileSystem::mount(engine(&dev, "sync-path")).unwrap();
        assert_eq!(mounted.orphans_reclaimed, 0, "every orphan was freed at its last close");
        assert_eq!(tree(&fs), before);
        assert_eq!(fs.free_blocks().unwrap(), free);
        fs.unmount().unwrap();
        let report = check::check(engine(&dev, "sync-path")).unwrap();
        assert!(report.is_clean(), "{report:?}");
    });
}

#[test]
fn fsck_reports_every_problem_and_mount_refuses_the_first() {
    use iopath::fs::format::{INODE_SIZE, Inode};
    let (dev, fs) = fresh("emu:null,size=16m", FormatOptions::default());
    fs.create("a").unwrap().write_at(b"alpha", 0).unwrap();
    fs.mkdir("d", 0o755).unwrap();
    fs.create("d/x").unwrap().write_at(&bytes(1, 10_000), 0).unwrap();
    fs.create("b").unwrap();
    let sb = *fs.superblock();
    fs.unmount().unwrap();
    let clean = check::check(engine(&dev, "sync-path")).unwrap();
    assert!(clean.is_clean(), "{:?}", clean.problems);
    assert_eq!((clean.files, clean.dirs, clean.orphans, clean.leaked_blocks), (3, 1, 0, 0));

    // Two kinds of damage at once: 'd/x' moved to the root as a second 'a', and 'b''s checksum broken.
    let eng = engine(&dev, "sync-path");
    let at = sb.inode_start * 4096;
    let mut block = iopath::IoBuf::new(4096);
    eng.read_at(&mut block, at).unwrap();
    let no_overflow = |_| unreachable!("no overflow blocks");
    for slot in 0..8 {
        let raw = &mut block[slot * INODE_SIZE..(slot + 1) * INODE_SIZE];
        let Some(mut inode) = Inode::decode(raw, slot as u64, no_overflow, &sb).unwrap() else { continue };
        match &inode.name[..] {
            b"x" => {
                inode.name = b"a".to_vec();
                inode.parent = iopath::fs::format::ROOT;
                inode.encode(raw, &mut []);
            }
            b"b" => raw[100] ^= 1,
            _ => {}
        }
    }
    eng.write_at(&block, at).unwrap();
    eng.flush().unwrap();
    let report = check::check(engine(&dev, "sync-path")).unwrap();
    assert!(!report.is_clean());
    let all = report.problems.join("\n");
    assert!(all.contains("damaged: checksum") && all.contains("named 'a'"), "{all}");
    // 'b' no longer decodes, so its inode is not counted, and 'x''s blocks are still owned: no leak.
    assert_eq!((report.files, report.leaked_blocks), (2, 0), "{all}");
    let e = FileSystem::mount(engine(&dev, "sync-path")).err().unwrap().to_string();
    assert!(e.contains("iopath fsck"), "{e}");
}

/// The superblock's inode mark as the device holds it now.
fn inode_mark_on(dev: &Arc<EmuDevice>) -> u64 {
    let mut block = iopath::IoBuf::new(4096);
    engine(dev, "sync-path").read_at(&mut block, 0).unwrap();
    iopath::fs::format::Superblock::decode(&block, dev.size() / 4096).unwrap().inode_mark
}

#[test]
fn a_mount_reads_the_inode_table_only_up_to_a_mark_that_survives_a_power_cut() {
    use iopath::fs::format::{INODE_MARK_STEP, Superblock};
    // 16,384 slots: an 8 MiB table.
    let options = FormatOptions { inodes: Some(16_384), ..FormatOptions::default() };
    let (dev, fs) = fresh("emu:null,size=64m,wcache=1,cut=drop", options);
    assert_eq!(inode_mark_on(&dev), 0, "a new file system has no inode");
    for i in 0..510 {
        fs.create(format!("f{i}")).unwrap();
    }
    fs.unmount().unwrap();
    assert_eq!(inode_mark_on(&dev), INODE_MARK_STEP);
    // Slots 510 to 519: the mark rises in the transaction of the file that crosses it,
    // and only the journal holds it when the power goes.
    let fs = mount(&dev);
    for i in 510..520 {
        fs.create(format!("f{i}")).unwrap();
    }
    fs.sync_namespace().unwrap();
    assert_eq!(inode_mark_on(&dev), INODE_MARK_STEP, "the new mark is in the journal only");
    let fs = cut_and_remount(&dev, fs);
    assert!((0..520).all(|i| fs.exists(format!("f{i}"))), "a file beyond the mark on the device is lost");
    fs.unmount().unwrap();
    assert_eq!(inode_mark_on(&dev), 2 * INODE_MARK_STEP);
    // A mount reads 128 of the table's 2,048 blocks.
    let (fs, _) = FileSystem::mount(engine(&dev, "sync-path")).unwrap();
    let read = fs.stats().device_read_bytes;
    assert!(read < 2 << 20, "a mount read {read} bytes: more than the table up to the mark");
    fs.unmount().unwrap();
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
    // fsck reads the whole table: an inode beyond a mark set too low is found.
    let eng = engine(&dev, "sync-path");
    let mut block = iopath::IoBuf::new(4096);
    eng.read_at(&mut block, 0).unwrap();
    let sb = Superblock { inode_mark: INODE_MARK_STEP, ..Superblock::decode(&block, dev.size() / 4096).unwrap() };
    eng.write_at(&iopath::IoBuf::from_slice(&sb.encode()[..]), 0).unwrap();
    eng.flush().unwrap();
    let all = check::check(engine(&dev, "sync-path")).unwrap().problems.join("\n");
    assert!(all.contains("inode 512 ('f512') is in use beyond the superblock's inode mark 512"), "{all}");
}

#[test]
fn a_block_two_files_claim_is_found_and_named() {
    use iopath::fs::format::{INODE_SIZE, Inode};
    let (dev, fs) = fresh("emu:null,size=16m", FormatOptions::default());
    fs.create("a").unwrap().write_at(&bytes(2, 4096), 0).unwrap();
    fs.create("c").unwrap().write_at(&bytes(3, 4096), 0).unwrap();
    let sb = *fs.superblock();
    fs.unmount().unwrap();
    // 'a' made to map 'c''s block: 'a''s own block is then leaked, and 'c''s owned twice.
    let eng = engine(&dev, "sync-path");
    let at = sb.inode_start * 4096;
    let mut block = iopath::IoBuf::new(4096);
    eng.read_at(&mut block, at).unwrap();
    let no_overflow = |_| unreachable!("no overflow blocks");
    let decoded = |block: &iopath::IoBuf, slot: usize| {
        Inode::decode(&block[slot * INODE_SIZE..(slot + 1) * INODE_SIZE], slot as u64, no_overflow, &sb).unwrap()
    };
    let slot_of = |block: &iopath::IoBuf, name: &[u8]| {
        (0..8).find(|&s| decoded(block, s).is_some_and(|i| i.name == name)).unwrap()
    };
    let (a, c) = (slot_of(&block, b"a"), slot_of(&block, b"c"));
    let target = decoded(&block, c).unwrap().extents[0].physical;
    let mut inode = decoded(&block, a).unwrap();
    inode.extents[0].physical = target;
    inode.encode(&mut block[a * INODE_SIZE..(a + 1) * INODE_SIZE], &mut []);
    eng.write_at(&block, at).unwrap();
    eng.flush().unwrap();
    let report = check::check(engine(&dev, "sync-path")).unwrap();
    let all = report.problems.join("\n");
    let (first, second) = (a.min(c), a.max(c));
    assert!(all.contains(&format!("block {target} is owned by inodes {first} and {second}")), "{all}");
    assert_eq!(report.leaked_blocks, 1, "{all}");
    let e = FileSystem::mount(engine(&dev, "sync-path")).err().unwrap().to_string();
    assert!(e.contains("owned by inodes") && e.contains("iopath fsck"), "{e}");
}

/// Many small files written through the cache and never synced (`tar x`):
/// the dirty pages stay within half the cache (the oldest files are written
/// back, together, as a writer crosses the line), and every byte is there
/// after an unmount.
#[test]
fn many_small_files_never_synced_keep_the_dirty_pages_within_the_budget() {
    let (dev, _) = fresh("emu:null,size=64m", FormatOptions::default());
    let options = MountOptions { cache_bytes: 1 << 20, ..MountOptions::default() };
    let fs = mount_with(&dev, "sync-path", options);
    let budget = (1u64 << 20) / 4096 / 2;
    fs.mkdir("tree", 0o755).unwrap();
    let mut highest = 0;
    for i in 0..400u64 {
        let f = fs.create(format!("tree/f{i}")).unwrap();
        let len = 1000 + (i as usize * 977) % 12_000;
        f.write_at(&bytes(i, len), 0).unwrap();
        highest = highest.max(fs.stats().dirty_pages);
    }
    let stats = fs.stats();
    assert!(highest <= budget + 4, "{highest} dirty pages with a budget of {budget}");
    assert!(stats.cache.writebacks > 0 && stats.dirty_pages > 0, "{stats:?}");
    fs.unmount().unwrap();
    let fs = mount(&dev);
    for i in 0..400u64 {
        let len = 1000 + (i as usize * 977) % 12_000;
        assert_eq!(read_all(&fs, &format!("tree/f{i}")), bytes(i, len), "file {i}");
    }
    assert_eq!(fs.stats().dirty_pages, 0);
    fs.unmount().unwrap();
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

/// The budget's writeback takes other threads' files while they write,
/// fsync and sync theirs: every byte of every file is there afterwards and
/// the dirty count comes back to zero.
#[test]
fn writers_of_many_files_the_budget_and_syncs_together_lose_no_byte() {
    let (dev, _) = fresh("emu:null,size=128m", FormatOptions::default());
    let options = MountOptions { cache_bytes: 1 << 20, ..MountOptions::default() };
    let fs = mount_with(&dev, "sync-path", options);
    within(std::time::Duration::from_secs(120), {
        let fs = fs.clone();
        move || {
            let writers: Vec<_> = (0..4u64)
                .map(|t| {
                    let fs = fs.clone();
                    std::thread::spawn(move || {
                        let mut open = Vec::new();
                        for i in 0..150u64 {
                            let seed = t * 1000 + i;
                            let f = fs.create(format!("w{t}-{i}")).unwrap();
                            // Two writes, the second one later: files stay dirty across batches.
                            let data = bytes(seed, 2000 + (seed as usize * 131) % 20_000);
                            let half = data.len() / 2;
                            f.write_at(&data[..half], 0).unwrap();
                            open.push((f, data, half));
                            if open.len() > 3 {
                                let (f, data, half) = open.remove(0);
                                f.write_at(&data[half..], half as u64).unwrap();
                                if seed % 7 == 0 {
                                    f.fsync().unwrap();
                                }
                            }
                            if seed % 53 == 0 {
                                fs.sync().unwrap();
                            }
                        }
                        for (f, data, half) in open {
                            f.write_at(&data[half..], half as u64).unwrap();
                        }
                    })
                })
                .collect();
            for w in writers {
                w.join().unwrap();
            }
        }
    });
    fs.sync().unwrap();
    assert_eq!(fs.stats().dirty_pages, 0);
    for t in 0..4u64 {
        for i in 0..150u64 {
            let seed = t * 1000 + i;
            assert_eq!(read_all(&fs, &format!("w{t}-{i}")), bytes(seed, 2000 + (seed as usize * 131) % 20_000));
        }
    }
    fs.unmount().unwrap();
    let fs = mount(&dev);
    for t in 0..4u64 {
        for i in 0..150u64 {
            let seed = t * 1000 + i;
            assert_eq!(read_all(&fs, &format!("w{t}-{i}")), bytes(seed, 2000 + (seed as usize * 131) % 20_000));
        }
    }
    fs.unmount().unwrap();
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}

/// A device error on one file of a sync that writes many together: that
/// file keeps its pages dirty (and readable), the others are written, the
/// sync reports the error, and once the failing file is gone a sync succeeds.
#[test]
fn a_device_error_on_one_file_of_a_many_file_sync_keeps_that_one_dirty_and_writes_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, faulty) = faulty_twin(dir.path(), 8);
    let fs = mount_spec(&faulty, MountOptions::default());
    let victim = fs.create("victim").unwrap(); // its blocks come first: in the failing range
    let others: Vec<_> = (0..20u64).map(|i| fs.create(format!("other{i}")).unwrap()).collect();
    fs.sync().unwrap();
    victim.write_at(&bytes(1, 32 * 1024), 0).unwrap();
    for (i, f) in others.iter().enumerate() {
        f.write_at(&bytes(100 + i as u64, 10_000), 0).unwrap();
    }
    let e = fs.sync().unwrap_err();
    assert!(e.to_string().contains("device error on write"), "{e}");
    assert_eq!(fs.stats().dirty_pages, 8, "the victim's pages, dirty again");
    let mut back = vec![0u8; 32 * 1024];
    assert_eq!(victim.read_at(&mut back, 0).unwrap(), back.len());
    assert_eq!(back, bytes(1, 32 * 1024));
    drop(victim);
    fs.unlink("victim").unwrap();
    assert_eq!(fs.stats().dirty_pages, 0, "dropped with the file");
    fs.sync().unwrap();
    drop(others);
    fs.unmount().unwrap();
    let fs = mount_spec(&plain, MountOptions::default());
    for i in 0..20u64 {
        assert_eq!(read_all(&fs, &format!("other{i}")), bytes(100 + i, 10_000));
    }
    assert!(!fs.exists("victim"));
    fs.unmount().unwrap();
    assert!(check::check(spec_engine(&plain)).unwrap().is_clean());
}

/// A namespace change's journal write is sent and not waited for; when it
/// fails on the device, the next step that looks (another change, a sync)
/// reports the error and changes stop (EROFS) until a remount, which finds
/// a clean file system without the changes that never reached the journal.
#[test]
fn a_failed_journal_write_that_was_not_waited_for_stops_changes_and_loses_nothing_synced() {
    let dir = tempfile::tempdir().unwrap();
    let plain = format!("emu:null,size=16m,file={}", dir.path().join("emu.img").display());
    let eng = spec_engine(&plain);
    assert!(eng.commit_submits(), "a direct path on an emulated device sends at commit");
    FileSystem::format(Arc::clone(&eng), FormatOptions::default()).unwrap();
    let (fs, _) = FileSystem::mount(eng).unwrap();
    let kept = fs.create("kept").unwrap();
    kept.write_at(&bytes(7, 9000), 0).unwrap();
    kept.fsync().unwrap();
    drop(kept);
    let sb = *fs.superblock();
    fs.unmount().unwrap();
    let ring = (sb.journal_start * 4096, (sb.journal_start + sb.journal_blocks) * 4096);
    let faulty = format!("{plain},fail_range={}-{},fail_op=write", ring.0, ring.1);
    let fs = mount_spec(&faulty, MountOptions::default());
    let mut failed = None;
    for i in 0..20 {
        match fs.create(format!("lost{i}")) {
            Ok(_) => assert!(fs.stats().journal.sent > 0, "sent, not waited for"),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let failed = match failed {
        Some(e) => e,
        None => fs.sync().unwrap_err(), // the sync waits for them all
    };
    assert!(failed.to_string().contains("device error on write"), "{failed}");
    assert_eq!(errno(fs.create("more").unwrap_err()), libc::EROFS);
    assert!(fs.sync().is_err());
    drop(fs);
    let fs = mount_spec(&plain, MountOptions::default());
    assert_eq!(read_all(&fs, "kept"), bytes(7, 9000));
    assert!(!fs.exists("lost0"));
    fs.unmount().unwrap();
    assert!(check::check(spec_engine(&plain)).unwrap().is_clean());
}

/// A journal write the kernel gives back cancelled (the thread that sent it
/// exited before io_uring issued it) is sent again from the buffer the
/// journal still holds: here one in seven comes back ECANCELED at first,
/// and every change is there after a remount.
#[test]
fn journal_writes_given_back_cancelled_are_sent_again() {
    let dir = tempfile::tempdir().unwrap();
    let plain = format!("emu:null,size=16m,file={}", dir.path().join("emu.img").display());
    let eng = spec_engine(&plain);
    FileSystem::format(Arc::clone(&eng), FormatOptions::default()).unwrap();
    let (fs, _) = FileSystem::mount(eng).unwrap();
    let sb = *fs.superblock();
    fs.unmount().unwrap();
    let ring = (sb.journal_start * 4096, (sb.journal_start + sb.journal_blocks) * 4096);
    let faulty = format!(
        "{plain},fail_range={}-{},fail_op=write,fail_rate=0.15,errno={},seed=3",
        ring.0,
        ring.1,
        libc::ECANCELED
    );
    let eng = spec_engine(&faulty);
    let (fs, _) = FileSystem::mount(Arc::clone(&eng)).unwrap();
    for i in 0..60u64 {
        let f = fs.create(format!("f{i}")).unwrap();
        f.write_at(&bytes(i, 5000), 0).unwrap();
    }
    fs.sync().unwrap();
    assert!(fs.stats().journal.sent >= 60, "{:?}", fs.stats().journal);
    assert!(eng.device().stats().faults_injected > 5, "{:?}", eng.device().stats());
    fs.unmount().unwrap();
    let fs = mount_spec(&plain, MountOptions::default());
    for i in 0..60u64 {
        assert_eq!(read_all(&fs, &format!("f{i}")), bytes(i, 5000), "f{i}");
    }
    fs.unmount().unwrap();
    assert!(check::check(spec_engine(&plain)).unwrap().is_clean());
}

/// A small file read from its start is loaded whole at the first miss (one
/// round trip: tar c, cp and diff read small files in several calls, each
/// of which missed); a larger one is read as asked.
#[test]
fn a_small_file_read_from_its_start_is_loaded_whole_at_the_first_miss() {
    let (dev, fs) = fresh("emu:null,size=64m", FormatOptions::default());
    for (name, len) in [("small", 40 * 1024), ("large", 512 * 1024)] {
        let f = fs.create(name).unwrap();
        f.write_at(&bytes(len as u64, len), 0).unwrap();
    }
    fs.unmount().unwrap();
    // Neither read-ahead nor read-around (which would load the large file's next blocks).
    let options = MountOptions { readahead_bytes: 0, read_around_bytes: 0, ..MountOptions::default() };
    let fs = mount_with(&dev, "sync-path", options);
    let f = fs.open("small").unwrap();
    let before = fs.stats().cache;
    let mut back = vec![0u8; 40 * 1024];
    for (i, piece) in back.chunks_mut(4096).enumerate() {
        assert_eq!(f.read_at(piece, i as u64 * 4096).unwrap(), 4096);
    }
    assert_eq!(back, bytes(40 * 1024, 40 * 1024));
    let after = fs.stats().cache;
    assert_eq!((after.misses - before.misses, after.hits - before.hits), (1, 9), "one miss loads it all");
    let f = fs.open("large").unwrap();
    let before = fs.stats().cache;
    let mut piece = vec![0u8; 4096];
    f.read_at(&mut piece, 0).unwrap();
    f.read_at(&mut piece, 4096).unwrap();
    assert_eq!(fs.stats().cache.misses - before.misses, 2, "a large file is read as asked");
}

/// Pages whose blocks lie together on the device are read with one command
/// each run (holes and blocks elsewhere break runs), byte for byte; a device
/// error fails the run it is in, not the pages of other runs.
#[test]
fn runs_of_blocks_are_read_with_one_command_each_and_fail_alone() {
    let (dev, fs) = fresh("emu:null,size=64m", FormatOptions::default());
    // Two files written block by block in turn: their blocks interleave on the device.
    let (a, b) = (fs.create("a").unwrap(), fs.create("b").unwrap());
    for i in 0..12u64 {
        a.write_at(&bytes(i, 4096), i * 4096).unwrap();
        a.fsync().unwrap();
        b.write_at(&bytes(100 + i, 4096), i * 4096).unwrap();
        b.fsync().unwrap();
    }
    // Then a hole and a contiguous tail in one write.
    a.write_at(&bytes(7, 16 * 4096), 20 * 4096).unwrap();
    drop((a, b));
    fs.unmount().unwrap();
    let mut expect = Vec::new();
    for i in 0..12u64 {
        expect.extend(bytes(i, 4096));
    }
    expect.extend(vec![0u8; 8 * 4096]);
    expect.extend(bytes(7, 16 * 4096));
    for read_path in [ReadPath::Conventional, ReadPath::Aios] {
        let options = MountOptions { readahead_bytes: 0, read_path, ..MountOptions::default() };
        let fs = mount_with(&dev, "sync-path", options);
        let before = fs.stats().device_reads;
        let mut back = vec![0u8; 36 * 4096];
        assert_eq!(fs.open("a").unwrap().read_at(&mut back, 0).unwrap(), back.len());
        assert!(back == expect, "{read_path:?}: the bytes differ");
        let commands = fs.stats().device_reads - before;
        assert!(commands < 28, "{read_path:?}: {commands} reads for 28 blocks, 16 of them together");
        fs.unmount().unwrap();
    }

    let dir = tempfile::tempdir().unwrap();
    let (plain, faulty) = faulty_twin(dir.path(), 1);
    let fs = mount_spec(&plain, MountOptions::default());
    let f = fs.create("f").unwrap(); // its blocks come first: block 0 in the failing range
    f.write_at(&bytes(9, 16 * 4096), 0).unwrap();
    drop(f);
    fs.unmount().unwrap();
    let fs = mount_spec(&faulty, MountOptions { readahead_bytes: 0, ..MountOptions::default() });
    let f = fs.open("f").unwrap();
    let mut back = vec![0u8; 4 * 4096];
    let e = f.read_at(&mut back, 0).unwrap_err();
    assert!(e.to_string().contains("device error on read"), "{e}");
    assert_eq!(f.read_at(&mut back, 8 * 4096).unwrap(), back.len());
    assert_eq!(back, bytes(9, 16 * 4096)[8 * 4096..12 * 4096]);
}

/// A process that opens a directory's files in the order readdir lists them
/// has the next small files loaded ahead (tar c, cp -r); one that opens them
/// out of order does not.
#[test]
fn a_directory_walk_loads_the_next_files_ahead_and_a_random_open_does_not() {
    let (dev, fs) = fresh("emu:null,size=64m", FormatOptions::default());
    fs.mkdir("d", 0o755).unwrap();
    for i in 0..20u64 {
        let f = fs.create(format!("d/f{i:02}")).unwrap();
        f.write_at(&bytes(i, 9000), 0).unwrap();
    }
    fs.unmount().unwrap();
    let fs = mount(&dev);
    let read = |name: &str| {
        let mut back = vec![0u8; 9000];
        assert_eq!(fs.open(name).unwrap().read_at(&mut back, 0).unwrap(), 9000);
        back
    };
    // Out of order: nothing ahead.
    read("d/f15");
    read("d/f03");
    fs.wait_for_readahead();
    assert_eq!(fs.stats().cache.readahead_pages, 0, "{:?}", fs.stats().cache);
    // In order: from the second file on, the next ones are loaded ahead, whole.
    read("d/f04");
    read("d/f05");
    fs.wait_for_readahead();
    let before = fs.stats().cache;
    assert!(before.readahead_pages >= 8 * 3, "{before:?}");
    for i in 6..14u64 {
        assert_eq!(read(&format!("d/f{i:02}")), bytes(i, 9000));
    }
    let after = fs.stats().cache;
    assert_eq!(after.misses, before.misses, "the walk's next files were in the cache: {after:?}");
}

/// The same by inode number: GNU cp -r sorts a directory's entries by inode
/// number before copying them, and files made in one go have consecutive ones.
#[test]
fn a_walk_in_inode_order_loads_the_next_files_ahead_too() {
    let (dev, fs) = fresh("emu:null,size=64m", FormatOptions::default());
    fs.mkdir("d", 0o755).unwrap();
    // Made in reverse name order: inode order is the reverse of name order.
    for i in (0..20u64).rev() {
        let f = fs.create(format!("d/f{i:02}")).unwrap();
        f.write_at(&bytes(i, 9000), 0).unwrap();
    }
    fs.unmount().unwrap();
    let fs = mount(&dev);
    let read = |i: u64| {
        let mut back = vec![0u8; 9000];
        assert_eq!(fs.open(format!("d/f{i:02}")).unwrap().read_at(&mut back, 0).unwrap(), 9000);
        assert_eq!(back, bytes(i, 9000));
    };
    read(19);
    read(18);
    fs.wait_for_readahead();
    let before = fs.stats().cache;
    assert!(before.readahead_pages >= 8 * 3, "{before:?}");
    for i in (10..18u64).rev() {
        read(i);
    }
    let after = fs.stats().cache;
    assert_eq!(after.misses, before.misses, "the walk's next files were in the cache: {after:?}");
}

/// A buffered write changes the modification time in memory at once and
/// stores it with the writeback before any commit: an fsync, a sync or an
/// unmount keeps the time of the last write, and a power cut after an fsync
/// finds it too (an fdatasync that needed no commit, as Linux's, may not).
#[test]
fn the_time_of_the_last_buffered_write_is_what_a_remount_finds() {
    let (dev, fs) = fresh("emu:optane,size=64m,wcache=1", FormatOptions::default());
    let f = fs.create("f").unwrap();
    let pause = || std::thread::sleep(std::time::Duration::from_millis(2));
    let mtime = |fs: &FileSystem| fs.metadata("f").unwrap().mtime_ns;
    // Several writes in one transaction: the last one's time.
    f.write_at(b"first", 0).unwrap();
    let first = mtime(&fs);
    pause();
    f.write_at(b"second", 8192).unwrap();
    let second = mtime(&fs);
    assert!(second > first, "{first} {second}");
    f.fsync().unwrap();
    drop(f);
    let fs = cut_and_remount(&dev, fs);
    assert_eq!(mtime(&fs), second, "after fsync and a power cut");
    // Written again and unmounted without any sync.
    pause();
    fs.open("f").unwrap().write_at(b"third", 100).unwrap();
    let third = mtime(&fs);
    assert!(third > second);
    fs.unmount().unwrap();
    let fs = mount(&dev);
    assert_eq!(mtime(&fs), third, "after an unmount");
    // fdatasync of an overwrite of written blocks makes the data durable and, as
    // Linux's, not the time (it needs no commit); the time is stored with the
    // writeback and reaches the device with the next commit: here an fsync.
    let f = fs.open("f").unwrap();
    pause();
    f.write_at(b"4", 0).unwrap();
    let fourth = mtime(&fs);
    f.fdatasync().unwrap();
    drop(f);
    let fs = cut_and_remount(&dev, fs);
    assert_eq!(&read_all(&fs, "f")[..5], b"4irst", "after fdatasync and a power cut");
    assert!([third, fourth].contains(&mtime(&fs)), "after fdatasync and a power cut");
    let f = fs.open("f").unwrap();
    pause();
    f.write_at(b"5", 1).unwrap();
    let fifth = mtime(&fs);
    f.fdatasync().unwrap();
    f.fsync().unwrap();
    drop(f);
    let fs = cut_and_remount(&dev, fs);
    assert_eq!(mtime(&fs), fifth, "after fdatasync, fsync and a power cut");
}

/// Blocks a file's map holds past its recorded size (written back, never
/// covered by a committed size: a writeback that failed part way, then the
/// process killed) read as zeros when the file grows over them, by truncate
/// or by a write past the end, as POSIX says the bytes past the end do.
#[test]
fn blocks_past_the_recorded_size_of_a_killed_writer_read_as_zeros() {
    let len = 5120 * 4096;
    for grow in ["truncate", "write"] {
        let dir = tempfile::tempdir().unwrap();
        let (plain, faulty) = faulty_twin_at(dir.path(), "64m", 4500, 4);
        let options = MountOptions { cache_bytes: 256 << 20, ..MountOptions::default() };
        let fs = mount_spec(&faulty, options);
        let big = fs.create("big").unwrap();
        big.write_at(&bytes(3, len as usize), 0).unwrap();
        assert!(fs.sync().is_err(), "the second batch fails; the first is written and mapped");
        // Another file's fsync commits the transaction, with `big` at its recorded size 0.
        let other = fs.create("other").unwrap();
        other.write_at(b"committed", 0).unwrap();
        other.fsync().unwrap();
        // The process dies.
        std::mem::forget((big, other, fs));

        let fs = mount_spec(&plain, MountOptions::default());
        let big = fs.open("big").unwrap();
        assert_eq!(big.len(), 0, "{grow}: the size the last commit recorded");
        match grow {
            "truncate" => big.truncate(len).unwrap(),
            _ => big.write_at(b"end", len - 3).unwrap(),
        }
        let mut back = vec![1u8; len as usize - 3];
        assert_eq!(big.read_at(&mut back, 0).unwrap(), back.len());
        assert_eq!(back.iter().position(|&b| b != 0), None, "{grow}: bytes past the old end read as zeros");
        assert_eq!(read_all(&fs, "other"), b"committed");
        drop(big);
        fs.unmount().unwrap();
        assert!(check::check(spec_engine(&plain)).unwrap().is_clean(), "{grow}");
        // And after a remount, from the device rather than the cache.
        let fs = mount_spec(&plain, MountOptions::default());
        let back = read_all(&fs, "big");
        assert_eq!(back.iter().position(|&b| b != 0), Some(len as usize - 3).filter(|_| grow == "write"), "{grow}");
    }
}

/// A mirror ([`iopath::fs::File::mirror`]) holds the file's bytes of its
/// range and follows every write and truncate through any handle, cached
/// or direct, until it is dropped; its memory can be mapped read only but
/// never made writable; it keeps the file system in use while it lives.
#[test]
fn a_mirror_follows_every_change_of_its_range_until_dropped() {
    let (_dev, fs) = fresh("emu:null,size=16m", FormatOptions::default());
    let f = fs.create("m").unwrap();
    f.write_at(&bytes(1, 10_000), 0).unwrap();
    let mirror = fs.open("m").unwrap().mirror(4096, 3 * 4096).unwrap();
    assert_eq!((mirror.offset(), mirror.len()), (4096, 3 * 4096));
    // SAFETY: a new read-only shared mapping of the mirror's memory.
    let p =
        unsafe { libc::mmap(std::ptr::null_mut(), mirror.len(), libc::PROT_READ, libc::MAP_SHARED, mirror.fd(), 0) };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping above, `len` bytes, unmapped at the end of the test.
    let seen = || unsafe { std::slice::from_raw_parts(p.cast::<u8>(), 3 * 4096) }.to_vec();
    let mut want = vec![0u8; 3 * 4096];
    want[..10_000 - 4096].copy_from_slice(&bytes(1, 10_000)[4096..]);
    assert_eq!(seen(), want, "the file's bytes, zeros past its end");
    // A write through another handle, across the mirror's start; one past its end.
    let g = fs.open("m").unwrap();
    g.write_at(&bytes(2, 8192), 0).unwrap();
    g.write_at(&bytes(3, 100), 20_000).unwrap();
    want[..4096].copy_from_slice(&bytes(2, 8192)[4096..]);
    want[10_000 - 4096..].fill(0);
    assert_eq!(seen(), want);
    // A direct handle's write, then an append that grows the file into the range.
    let d = fs.open_direct("m").unwrap();
    d.write_at(&bytes(4, 4096), 8192).unwrap();
    want[4096..8192].copy_from_slice(&bytes(4, 4096));
    assert_eq!(seen(), want);
    // Truncation zeroes what lies past the new end.
    f.truncate(6000).unwrap();
    want[6000 - 4096..].fill(0);
    assert_eq!(seen(), want);
    f.append(&bytes(5, 3000)).unwrap();
    want[6000 - 4096..9000 - 4096].copy_from_slice(&bytes(5, 3000));
    assert_eq!(seen(), want);
    let mut back = vec![0u8; 3 * 4096];
    let n = f.read_at(&mut back, 4096).unwrap();
    assert_eq!(&back[..n], &want[..n], "the mirror and the file agree");
    // The memory is sealed: no writable mapping, no writable mprotect of ours.
    // SAFETY: asking for a writable shared mapping (refused) and a protection change of ours.
    unsafe {
        let w = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_WRITE, libc::MAP_SHARED, mirror.fd(), 0);
        assert_eq!(w, libc::MAP_FAILED, "a writable mapping of the mirror");
        assert_ne!(libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_WRITE), 0, "made writable");
    }
    drop((f, g, d));
    assert!(fs.in_use_elsewhere(), "the mirror keeps its file open");
    drop(mirror);
    assert!(!fs.in_use_elsewhere());
    // Once dropped, it no longer follows the file (its memory stays mapped here).
    let h = fs.open("m").unwrap();
    h.write_at(&bytes(6, 4096), 4096).unwrap();
    assert_eq!(seen(), want);
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(p, 3 * 4096) };
    // Mirrors of no bytes are refused.
    assert_eq!(errno(h.mirror(0, 0).err().unwrap()), libc::EINVAL);
}

/// A writable mirror is the file's truth for its range while it lives:
/// reads see what was stored into its memory, a write of the file still
/// shows in it, and its bytes reach the file (only the pages that differ,
/// only up to the file's end) at `sync`, at an `fsync` of the file and
/// when it is dropped, across a remount.
#[test]
fn a_writable_mirror_is_the_file_while_it_lives_and_reaches_it() {
    let (dev, fs) = fresh("emu:null,size=16m,wcache=1", FormatOptions::default());
    let f = fs.create("w").unwrap();
    f.write_at(&bytes(1, 10_000), 0).unwrap();
    let mirror = f.mirror_writable(0, 3 * 4096).unwrap();
    assert!(mirror.writable());
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: a new writable shared mapping of the mirror's memory.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), 3 * 4096, prot, libc::MAP_SHARED, mirror.fd(), 0) };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping above, 3 pages, unmapped at the end of the test.
    let map = unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), 3 * 4096) };
    assert_eq!(&map[..10_000], &bytes(1, 10_000)[..]);
    map[100..104].copy_from_slice(b"mine");
    map[9000..9003].copy_from_slice(b"end");
    let mut back = vec![0u8; 10_000];
    assert_eq!(f.read_at(&mut back, 0).unwrap(), 10_000);
    assert_eq!((&back[100..104], &back[9000..9003]), (&b"mine"[..], &b"end"[..]), "reads see the stores");
    // A write of the file shows in the map; the store elsewhere in its page stays.
    f.write_at(b"file", 200).unwrap();
    assert_eq!((&map[200..204], &map[100..104]), (&b"file"[..], &b"mine"[..]));
    // Written back at sync: a handle of another mount sees it once durable.
    mirror.sync().unwrap();
    fs.set_mtime("w", 1_000_000_000).unwrap();
    mirror.sync().unwrap();
    assert_eq!(fs.metadata("w").unwrap().mtime_ns, 1_000_000_000, "a sync with nothing new writes nothing");
    map[5000..5005].copy_from_slice(b"fsync");
    f.fsync().unwrap(); // writes the mirror back first
    // Past the file's end nothing goes to the file.
    map[11_000..11_004].copy_from_slice(b"past");
    map[300..303].copy_from_slice(b"drp");
    drop(mirror); // written back
    drop(f);
    let mut want = bytes(1, 10_000);
    want[100..104].copy_from_slice(b"mine");
    want[200..204].copy_from_slice(b"file");
    want[300..303].copy_from_slice(b"drp");
    want[5000..5005].copy_from_slice(b"fsync");
    want[9000..9003].copy_from_slice(b"end");
    assert_eq!(read_all(&fs, "w"), want);
    fs.sync().unwrap();
    drop(fs);
    assert_eq!(read_all(&mount(&dev), "w"), want, "after a remount");
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(p, 3 * 4096) };
}

#[test]
fn a_mount_that_only_reads_reads_the_bitmap_only_where_its_files_are() {
    // The same file on a 256 MiB and a 2 GiB device (2 and 16 blocks of bitmap),
    // formatted alike: a mount that only reads it read all 16 before (16 MiB per
    // 512 GiB of device, faulted in by every process), now the one its blocks are in.
    let options = FormatOptions { inodes: Some(64), journal_blocks: Some(256) };
    let mut read = Vec::new();
    for size in ["256m", "2g"] {
        let (dev, fs) = fresh(&format!("emu:null,size={size}"), options);
        let f = fs.create("one").unwrap();
        f.write_at(b"kept", 0).unwrap();
        drop(f);
        fs.unmount().unwrap();
        let fs = mount(&dev);
        assert_eq!(read_all(&fs, "one"), b"kept");
        let after_reading = fs.stats().device_read_bytes;
        read.push(after_reading);
        if size == "2g" {
            // Counting free space reads the rest of it: 15 blocks more.
            let free = fs.free_blocks().unwrap();
            assert!(free > 500_000 && free < 2 << 18, "{free} blocks free");
            assert!(fs.stats().device_read_bytes >= after_reading + 15 * 4096);
            // Writing somewhere new, then a check from scratch: nothing lost or leaked.
            let g = fs.create("two").unwrap();
            g.write_at(&bytes(7, 100_000), 0).unwrap();
            g.fsync().unwrap();
            drop(g);
            fs.unmount().unwrap();
            let report = check::check(engine(&dev, "sync-path")).unwrap();
            assert!(report.is_clean(), "{:?}", report.problems);
            assert_eq!(report.free_blocks, free - 25, "the new file's 25 blocks");
        }
    }
    assert_eq!(read[1], read[0], "device read bytes after the mount and a read, 256 MiB and 2 GiB");
}

/// File `f`: a block of `bytes(1, 4096)` written and fsynced (on the
/// `journaled` path its image is in the journal), then cut to 100 bytes and
/// fsynced again; the block is kept.
fn shrunk_to_100_bytes(fs: &FileSystem) {
    let f = fs.create("f").unwrap();
    f.write_at(&bytes(1, 4096), 0).unwrap();
    f.fsync().unwrap();
    f.truncate(100).unwrap();
    f.fsync().unwrap();
}

#[test]
fn a_file_shrunk_then_grown_reads_zeros_past_the_old_end_after_replay() {
    // Block 0's image goes into the journal with its first fsync; a shrink keeps the
    // block, and growing the file again zeroes its tail on the device. Replay must
    // not put the older image back over those zeros.
    let options = FormatOptions { inodes: Some(16), journal_blocks: Some(256) };
    type Grow = fn(&FileSystem);
    let grows: [(&str, Grow); 3] = [
        ("truncate", |fs| {
            let f = fs.open("f").unwrap();
            f.truncate(3 * 4096).unwrap();
            f.fsync().unwrap();
        }),
        ("a direct write past the end", |fs| {
            let f = fs.open_direct("f").unwrap();
            f.write_at(&bytes(2, 4096), 2 * 4096).unwrap();
            f.fdatasync().unwrap();
        }),
        ("a buffered write past the end", |fs| {
            let f = fs.open("f").unwrap();
            f.write_at(&bytes(2, 4096), 2 * 4096).unwrap();
            f.fsync().unwrap();
        }),
    ];
    for (what, grow) in grows {
        for cut in ["drop", "tear"] {
            let (dev, fs) = fresh_journaled(&format!("emu:null,size=16m,wcache=1,cut={cut}"), options);
            shrunk_to_100_bytes(&fs);
            grow(&fs);
            let fs = cut_and_remount(&dev, fs);
            let got = read_all(&fs, "f");
            assert_eq!(got.len(), 3 * 4096, "{what}, cut={cut}");
            assert!(got[..100] == bytes(1, 4096)[..100], "{what}, cut={cut}: the kept bytes");
            assert!(
                got[100..2 * 4096].iter().all(|&b| b == 0),
                "{what}, cut={cut}: bytes from before the shrink came back past the old end"
            );
        }
    }
}

#[test]
fn a_write_past_the_end_inside_the_last_block_leaves_zeros_between() {
    for direct in [false, true] {
        let (_dev, fs) = fresh("emu:null,size=16m", FormatOptions::default());
        shrunk_to_100_bytes(&fs);
        let f = if direct { fs.open_direct("f").unwrap() } else { fs.open("f").unwrap() };
        f.write_at(&[7u8; 512], 2048).unwrap();
        f.fsync().unwrap();
        drop(f);
        let got = read_all(&fs, "f");
        assert_eq!(got.len(), 2048 + 512, "direct={direct}");
        assert!(got[100..2048].iter().all(|&b| b == 0), "direct={direct}: bytes from before the shrink came back");
        assert!(got[2048..].iter().all(|&b| b == 7), "direct={direct}");
    }
}

/// One step of [`fsynced_contents_survive_a_power_cut_whatever_came_before`].
#[derive(Debug, Clone)]
enum DataOp {
    /// Buffered (or, `direct`, 512-byte aligned through a direct open) write
    /// of `len` bytes (pattern `seed`) at `offset` into file `file`.
    Write {
        file: usize,
        offset: u64,
        len: usize,
        seed: u64,
        direct: bool,
    },
    Truncate {
        file: usize,
        len: u64,
    },
    Fsync {
        file: usize,
    },
    Fdatasync {
        file: usize,
    },
    /// `append` (at the end, as O_APPEND writes).
    Append {
        file: usize,
        len: usize,
        seed: u64,
    },
    /// Reads the whole file and compares it with the model (before any cut).
    Check {
        file: usize,
    },
    /// Renames file `file` over the other one, then makes a new empty `file`.
    RenameOver {
        file: usize,
    },
    /// Writes back every dirty page of the file system (`sync`).
    Sync,
    /// Punches a hole (`fallocate`'s PUNCH_HOLE): the range reads zeros, the size stays.
    Punch {
        file: usize,
        offset: u64,
        len: u64,
    },
}

fn data_op() -> impl proptest::strategy::Strategy<Value = DataOp> {
    use proptest::prelude::*;
    let file = 0..2usize;
    prop_oneof![
        4 => (file.clone(), 0..48 * 1024u64, prop_oneof![4 => 1..12 * 1024usize, 1 => 1..96 * 1024usize], any::<u64>(), any::<bool>()).prop_map(
            |(file, offset, len, seed, direct)| {
                if direct {
                    let offset = offset / 512 * 512;
                    let len = len.div_ceil(512) * 512;
                    DataOp::Write { file, offset, len, seed, direct }
                } else {
                    DataOp::Write { file, offset, len, seed, direct }
                }
            }
        ),
        2 => (file.clone(), 0..40 * 1024u64).prop_map(|(file, len)| DataOp::Truncate { file, len }),
        1 => file.clone().prop_map(|file| DataOp::Fsync { file }),
        1 => file.clone().prop_map(|file| DataOp::Fdatasync { file }),
        1 => (file.clone(), 1..6000usize, any::<u64>()).prop_map(|(file, len, seed)| DataOp::Append { file, len, seed }),
        1 => file.clone().prop_map(|file| DataOp::Check { file }),
        1 => file.clone().prop_map(|file| DataOp::RenameOver { file }),
        1 => Just(DataOp::Sync),
        2 => (file, 0..48 * 1024u64, 1..24 * 1024u64).prop_map(|(file, offset, len)| DataOp::Punch { file, offset, len }),
    ]
}

/// The model tests' file system: a fresh 16 MiB emulated device with a
/// volatile write cache (a cut tears writes if `tear`, else drops them),
/// formatted with `inodes` inodes and mounted on fsync path `path` (0
/// journaled, 1 aios, 2 conventional).
fn model_fs(tear: bool, path: usize, inodes: u64) -> (Arc<EmuDevice>, FileSystem) {
    let cut = if tear { "tear" } else { "drop" };
    let fsync_path = [FsyncPath::Journaled, FsyncPath::Aios, FsyncPath::Conventional][path];
    let options = FormatOptions { inodes: Some(inodes), journal_blocks: Some(256) };
    let dev = emu(&format!("emu:null,size=16m,wcache=1,cut={cut}"));
    FileSystem::format(engine(&dev, "sync-path"), options).unwrap();
    let fs = mount_with(&dev, "sync-path", MountOptions { fsync_path, ..MountOptions::default() });
    (dev, fs)
}

/// After the cut: `name` holds `want`, or where it first differs is said.
fn holds_after_the_cut(fs: &FileSystem, name: &str, want: &[u8]) -> Result<(), proptest::test_runner::TestCaseError> {
    let got = read_all(fs, name);
    let first_wrong = got.iter().zip(want).position(|(g, w)| g != w);
    proptest::prop_assert!(
        got == want,
        "{} after the cut: {} bytes against {}, first wrong byte at {:?}",
        name,
        got.len(),
        want.len(),
        first_wrong
    );
    Ok(())
}

/// `data` written into `model` at `offset` (growing it with zeros first).
fn write_model(model: &mut Vec<u8>, data: &[u8], offset: u64) {
    let end = offset as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[offset as usize..end].copy_from_slice(data);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 512, ..Default::default() })]

    /// Random writes (buffered and direct), truncates (shrinking and growing)
    /// and syncs of two files on each fsync path, each file fsynced at the
    /// end, then a power cut (writes dropped or torn): what the mount
    /// recovers is byte for byte what was fsynced, and fsck is clean. (On
    /// the `journaled` path replay once put a block's older journal image
    /// back over zeros a later grow wrote in place: c4145c8. The seed kept
    /// for it in fs.proptest-regressions reproduces it for this shape of
    /// input; after a change to the strategies, take the fix out and run
    /// with PROPTEST_CASES=4000 for a new one.)
    #[test]
    fn fsynced_contents_survive_a_power_cut_whatever_came_before(
        ops in proptest::collection::vec(data_op(), 1..32),
        tear in proptest::prelude::any::<bool>(),
        path in 0..3usize,
        cut_early in proptest::prelude::any::<bool>(),
    ) {
        let (dev, fs) = model_fs(tear, path, 16);
        let names = ["a", "b"];
        let mut model = [Vec::<u8>::new(), Vec::new()];
        for name in names {
            fs.create(name).unwrap().fsync().unwrap();
        }
        // What each file's last fsync made durable (`cut_early`: the power is cut
        // without a last fsync of each file, and only files untouched since their
        // last fsync are compared); a file renamed over is left out from then on
        // (a rename is durable only with its directory's sync).
        let mut durable = [Some(Vec::<u8>::new()), Some(Vec::new())];
        let mut renamed = [false; 2];
        for op in &ops {
            match *op {
                DataOp::Write { file, .. }
                | DataOp::Truncate { file, .. }
                | DataOp::Append { file, .. }
                | DataOp::Punch { file, .. } => {
                    durable[file] = None;
                }
                DataOp::RenameOver { .. } => renamed = [true; 2],
                DataOp::Fsync { .. } | DataOp::Fdatasync { .. } | DataOp::Check { .. } | DataOp::Sync => {}
            }
            match *op {
                DataOp::Write { file, offset, len, seed, direct } => {
                    let f = if direct { fs.open_direct(names[file]).unwrap() } else { fs.open(names[file]).unwrap() };
                    let data = bytes(seed, len);
                    f.write_at(&data, offset).unwrap();
                    write_model(&mut model[file], &data, offset);
                }
                DataOp::Truncate { file, len } => {
                    fs.open(names[file]).unwrap().truncate(len).unwrap();
                    model[file].resize(len as usize, 0);
                }
                DataOp::Fsync { file } => {
                    fs.open(names[file]).unwrap().fsync().unwrap();
                    durable[file] = Some(model[file].clone());
                }
                DataOp::Fdatasync { file } => {
                    fs.open(names[file]).unwrap().fdatasync().unwrap();
                    durable[file] = Some(model[file].clone());
                }
                DataOp::Append { file, len, seed } => {
                    let data = bytes(seed, len);
                    fs.open(names[file]).unwrap().append(&data).unwrap();
                    model[file].extend_from_slice(&data);
                }
                DataOp::Check { file } => {
                    proptest::prop_assert!(read_all(&fs, names[file]) == model[file], "{} at {:?}", names[file], op);
                }
                DataOp::RenameOver { file } => {
                    fs.rename(names[file], names[1 - file]).unwrap();
                    drop(fs.create(names[file]).unwrap());
                    model[1 - file] = std::mem::take(&mut model[file]);
                }
                DataOp::Sync => fs.sync().unwrap(),
                DataOp::Punch { file, offset, len } => {
                    fs.open(names[file]).unwrap().punch_hole(offset, len).unwrap();
                    let m = &mut model[file];
                    let end = (offset + len).min(m.len() as u64) as usize;
                    if (offset as usize) < end {
                        m[offset as usize..end].fill(0);
                    }
                }
            }
        }
        for (file, name) in names.iter().enumerate() {
            proptest::prop_assert!(read_all(&fs, name) == model[file], "{} before the cut", name);
            if !cut_early {
                fs.open(name).unwrap().fsync().unwrap();
                durable[file] = Some(model[file].clone());
                renamed[file] = false;
            }
        }
        let fs = cut_and_remount(&dev, fs);
        for (file, name) in names.iter().enumerate() {
            let Some(want) = &durable[file] else { continue };
            if renamed[file] {
                continue;
            }
            holds_after_the_cut(&fs, name, want)?;
        }
        drop(fs);
        proptest::prop_assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
    }
}

#[test]
fn a_punched_hole_reads_zeros_frees_its_whole_blocks_and_survives_a_power_cut() {
    for path in [FsyncPath::Journaled, FsyncPath::Aios, FsyncPath::Conventional] {
        let dev = emu("emu:null,size=16m,wcache=1,cut=drop");
        FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
        let fs = mount_with(&dev, "sync-path", MountOptions { fsync_path: path, ..MountOptions::default() });
        let f = fs.create("f").unwrap();
        let mut want = bytes(5, 40 * 4096 + 123);
        f.write_at(&want, 0).unwrap();
        f.fsync().unwrap();
        let free = fs.free_blocks().unwrap();
        // From inside block 2 to inside block 30: blocks 3..30 freed, the edges zeroed.
        f.punch_hole(2 * 4096 + 500, 28 * 4096).unwrap();
        want[2 * 4096 + 500..30 * 4096 + 500].fill(0);
        assert_eq!(f.len(), want.len() as u64, "{path:?}: the size stays");
        assert!(read_all(&fs, "f") == want, "{path:?}: read back at once");
        assert!(fs.free_blocks().unwrap() >= free + 27, "{path:?}: the whole blocks are freed");
        // A hole that runs past the end zeroes up to the end only; one wholly past it does nothing.
        f.punch_hole(40 * 4096, 1 << 20).unwrap();
        want[40 * 4096..].fill(0);
        f.punch_hole(1 << 30, 4096).unwrap();
        assert_eq!(f.len(), want.len() as u64);
        f.fsync().unwrap();
        drop(f);
        let fs = cut_and_remount(&dev, fs);
        assert!(read_all(&fs, "f") == want, "{path:?}: after a power cut");
        drop(fs);
        assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean(), "{path:?}");
    }
}

/// One step of [`held_files_orphans_and_maps_survive_a_power_cut`]: the
/// same kind of workload as [`DataOp`]'s, through handles kept open from
/// step to step, with writable shared maps alive across other steps and
/// files unlinked while open.
#[derive(Debug, Clone)]
enum HeldOp {
    /// `via`: 0 the held buffered handle, 1 the held direct one (512-byte
    /// aligned), 2 a handle opened for this write.
    Write {
        file: usize,
        offset: u64,
        len: usize,
        seed: u64,
        via: u8,
    },
    Truncate {
        file: usize,
        len: u64,
    },
    /// fsync (or, `data_only`, fdatasync) through the held handle.
    Fsync {
        file: usize,
        data_only: bool,
    },
    /// Maps `pages` pages of the file from page `page` (a writable mirror
    /// mapped shared; `watch`: its stores watched), in place of any map it had.
    MapOpen {
        file: usize,
        page: u64,
        pages: usize,
        watch: bool,
    },
    /// Stores into the map, where it lies inside the file.
    MapStore {
        file: usize,
        offset: u64,
        len: usize,
        seed: u64,
    },
    /// `msync`: the map's stores written into the file.
    MapSync {
        file: usize,
    },
    /// `munmap`: written back and let go.
    MapClose {
        file: usize,
    },
    /// Unlinks the name while its handles (and map) stay open: they go on
    /// as an orphan; a new empty file takes the name.
    UnlinkHeld {
        file: usize,
    },
    /// Writes into the newest orphan and reads it all back.
    OrphanWrite {
        offset: u64,
        len: usize,
        seed: u64,
    },
    /// Lets every orphan go (its blocks are freed).
    CloseOrphans,
    /// Opens the held handles again.
    Reopen {
        file: usize,
    },
    /// Reads the whole file through the held handle and a new one.
    Check {
        file: usize,
    },
    /// `sync`.
    Sync,
    /// `fsync` of the directory.
    SyncNamespace,
    /// `fallocate` (mode 0, or `keep_size`: FALLOC_FL_KEEP_SIZE) through the held handle.
    Allocate {
        file: usize,
        offset: u64,
        len: u64,
        keep_size: bool,
    },
}

fn held_op() -> impl proptest::strategy::Strategy<Value = HeldOp> {
    use proptest::prelude::*;
    let file = 0..2usize;
    prop_oneof![
        5 => (file.clone(), 0..40 * 1024u64, 1..16 * 1024usize, any::<u64>(), 0..3u8).prop_map(
            |(file, offset, len, seed, via)| {
                if via == 1 {
                    HeldOp::Write { file, offset: offset / 512 * 512, len: len.div_ceil(512) * 512, seed, via }
                } else {
                    HeldOp::Write { file, offset, len, seed, via }
                }
            }
        ),
        2 => (file.clone(), 0..40 * 1024u64).prop_map(|(file, len)| HeldOp::Truncate { file, len }),
        2 => (file.clone(), any::<bool>()).prop_map(|(file, data_only)| HeldOp::Fsync { file, data_only }),
        1 => (file.clone(), 0..8u64, 1..5usize, any::<bool>())
            .prop_map(|(file, page, pages, watch)| HeldOp::MapOpen { file, page, pages, watch }),
        3 => (file.clone(), 0..48 * 1024u64, 1..9000usize, any::<u64>())
            .prop_map(|(file, offset, len, seed)| HeldOp::MapStore { file, offset, len, seed }),
        1 => file.clone().prop_map(|file| HeldOp::MapSync { file }),
        1 => file.clone().prop_map(|file| HeldOp::MapClose { file }),
        1 => file.clone().prop_map(|file| HeldOp::UnlinkHeld { file }),
        2 => (0..40 * 1024u64, 1..12 * 1024usize, any::<u64>())
            .prop_map(|(offset, len, seed)| HeldOp::OrphanWrite { offset, len, seed }),
        1 => Just(HeldOp::CloseOrphans),
        1 => file.clone().prop_map(|file| HeldOp::Reopen { file }),
        1 => file.clone().prop_map(|file| HeldOp::Check { file }),
        1 => Just(HeldOp::Sync),
        1 => Just(HeldOp::SyncNamespace),
        2 => (file, 0..48 * 1024u64, 1..32 * 1024u64, any::<bool>())
            .prop_map(|(file, offset, len, keep_size)| HeldOp::Allocate { file, offset, len, keep_size }),
    ]
}

/// A writable mirror of part of a file, mapped shared into this process
/// (what the interposer makes of a program's `mmap`).
struct SharedMap {
    mirror: Option<iopath::fs::mirror::Mirror>,
    at: *mut u8,
    offset: u64,
    len: usize,
}

impl SharedMap {
    fn new(file: &iopath::fs::File, offset: u64, len: usize, watch: bool) -> SharedMap {
        let mirror = file.mirror_writable(offset, len).unwrap();
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a new shared mapping of the mirror's memory, unmapped in `drop`.
        let at = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, mirror.fd(), 0) };
        assert_ne!(at, libc::MAP_FAILED);
        if watch {
            mirror.watch_writes(at.cast());
        }
        SharedMap { mirror: Some(mirror), at: at.cast(), offset, len }
    }

    /// Stores `data` at file offset `at` (inside the map).
    fn store(&self, data: &[u8], at: u64) {
        let start = (at - self.offset) as usize;
        assert!(start + data.len() <= self.len);
        // SAFETY: inside the mapping made in `new`, alive until `drop`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.at.add(start), data.len()) };
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        drop(self.mirror.take()); // written back
        // SAFETY: the mapping made in `new`.
        unsafe { libc::munmap(self.at.cast(), self.len) };
    }
}

/// One of the two names of [`held_files_orphans_and_maps_survive_a_power_cut`]:
/// its open handles, its map, and what the model says of it.
struct HeldName {
    held: iopath::fs::File,
    direct: iopath::fs::File,
    map: Option<SharedMap>,
    model: Vec<u8>,
    /// What its last fsync made durable (None: changed since).
    durable: Option<Vec<u8>>,
    /// Whether the name is durably this file's (false from an unlink until
    /// the directory is synced).
    name_durable: bool,
}

/// A file unlinked while open: its handles and map, and its bytes.
struct Orphan {
    map: Option<SharedMap>,
    held: iopath::fs::File,
    model: Vec<u8>,
}

fn read_through(f: &iopath::fs::File) -> Vec<u8> {
    let mut buf = vec![0u8; f.len() as usize];
    assert_eq!(f.read_at(&mut buf, 0).unwrap(), buf.len());
    buf
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]

    /// [`fsynced_contents_survive_a_power_cut_whatever_came_before`] with
    /// what programs do besides: handles held open across steps (buffered and
    /// direct), writable shared maps alive while the file is written, cut and
    /// synced, files unlinked while open and written on as orphans, then a
    /// power cut with all of it still open. Reads agree with the model at
    /// every check; after the cut every durably named file has its last
    /// fsync's bytes, the orphans are gone and fsck is clean. Ranges
    /// allocated with `fallocate` (growing the file or not) come and go
    /// among the rest.
    #[test]
    fn held_files_orphans_and_maps_survive_a_power_cut(
        ops in proptest::collection::vec(held_op(), 1..40),
        tear in proptest::prelude::any::<bool>(),
        path in 0..3usize,
        cut_early in proptest::prelude::any::<bool>(),
    ) {
        let (dev, fs) = model_fs(tear, path, 32);
        let names = ["a", "b"];
        let mut slots: Vec<HeldName> = names
            .iter()
            .map(|name| {
                let held = fs.create(name).unwrap();
                held.fsync().unwrap();
                let direct = fs.open_direct(name).unwrap();
                HeldName { held, direct, map: None, model: Vec::new(), durable: Some(Vec::new()), name_durable: false }
            })
            .collect();
        fs.sync_namespace().unwrap();
        for slot in &mut slots {
            slot.name_durable = true;
        }
        let mut orphans: Vec<Orphan> = Vec::new();
        for op in &ops {
            match *op {
                HeldOp::Write { file, offset, len, seed, via } => {
                    let slot = &mut slots[file];
                    let data = bytes(seed, len);
                    match via {
                        0 => slot.held.write_at(&data, offset).unwrap(),
                        1 => slot.direct.write_at(&data, offset).unwrap(),
                        _ => fs.open(names[file]).unwrap().write_at(&data, offset).unwrap(),
                    }
                    write_model(&mut slot.model, &data, offset);
                    slot.durable = None;
                }
                HeldOp::Truncate { file, len } => {
                    let slot = &mut slots[file];
                    slot.held.truncate(len).unwrap();
                    slot.model.resize(len as usize, 0);
                    slot.durable = None;
                }
                HeldOp::Fsync { file, data_only } => {
                    let slot = &mut slots[file];
                    if data_only { slot.held.fdatasync().unwrap() } else { slot.held.fsync().unwrap() }
                    slot.durable = Some(slot.model.clone());
                }
                HeldOp::MapOpen { file, page, pages, watch } => {
                    let slot = &mut slots[file];
                    slot.map = None; // the old one written back first
                    slot.map = Some(SharedMap::new(&slot.held, page * 4096, pages * 4096, watch));
                }
                HeldOp::MapStore { file, offset, len, seed } => {
                    let slot = &mut slots[file];
                    let Some(map) = &slot.map else { continue };
                    // The part of [offset, offset + len) inside both the map and the file.
                    let from = offset.max(map.offset);
                    let to = (offset + len as u64).min(map.offset + map.len as u64).min(slot.model.len() as u64);
                    if from >= to {
                        continue;
                    }
                    let data = bytes(seed, (to - from) as usize);
                    map.store(&data, from);
                    write_model(&mut slot.model, &data, from);
                    slot.durable = None;
                }
                HeldOp::MapSync { file } => {
                    if let Some(map) = &slots[file].map {
                        map.mirror.as_ref().unwrap().sync().unwrap();
                    }
                }
                HeldOp::MapClose { file } => slots[file].map = None,
                HeldOp::UnlinkHeld { file } => {
                    fs.unlink(names[file]).unwrap();
                    let held = fs.create(names[file]).unwrap();
                    let direct = fs.open_direct(names[file]).unwrap();
                    let slot = &mut slots[file];
                    let old = std::mem::replace(
                        slot,
                        HeldName { held, direct, map: None, model: Vec::new(), durable: None, name_durable: false },
                    );
                    orphans.push(Orphan { map: old.map, held: old.held, model: old.model });
                }
                HeldOp::OrphanWrite { offset, len, seed } => {
                    let Some(orphan) = orphans.last_mut() else { continue };
                    let data = bytes(seed, len);
                    orphan.held.write_at(&data, offset).unwrap();
                    write_model(&mut orphan.model, &data, offset);
                    proptest::prop_assert!(read_through(&orphan.held) == orphan.model, "the orphan at {:?}", op);
                }
                HeldOp::CloseOrphans => {
                    for orphan in orphans.drain(..) {
                        drop(orphan.map);
                        drop(orphan.held);
                    }
                }
                HeldOp::Reopen { file } => {
                    let slot = &mut slots[file];
                    slot.held = fs.open(names[file]).unwrap();
                    slot.direct = fs.open_direct(names[file]).unwrap();
                }
                HeldOp::Check { file } => {
                    let slot = &slots[file];
                    proptest::prop_assert!(read_through(&slot.held) == slot.model, "{} (held) at {:?}", names[file], op);
                    proptest::prop_assert!(read_all(&fs, names[file]) == slot.model, "{} (new) at {:?}", names[file], op);
                }
                HeldOp::Sync => {
                    fs.sync().unwrap();
                    for slot in &mut slots {
                        slot.name_durable = true;
                        if slot.map.is_none() {
                            slot.durable = Some(slot.model.clone());
                        }
                    }
                }
                HeldOp::SyncNamespace => {
                    fs.sync_namespace().unwrap();
                    for slot in &mut slots {
                        slot.name_durable = true;
                    }
                }
                HeldOp::Allocate { file, offset, len, keep_size } => {
                    let slot = &mut slots[file];
                    slot.held.allocate(offset, len, keep_size).unwrap();
                    let end = (offset + len) as usize;
                    if !keep_size && slot.model.len() < end {
                        slot.model.resize(end, 0);
                    }
                    slot.durable = None;
                }
            }
        }
        for orphan in &orphans {
            proptest::prop_assert!(read_through(&orphan.held) == orphan.model, "an orphan before the cut");
        }
        if !cut_early {
            fs.sync_namespace().unwrap();
        }
        for (slot, name) in slots.iter_mut().zip(names) {
            proptest::prop_assert!(read_through(&slot.held) == slot.model, "{} before the cut (held)", name);
            proptest::prop_assert!(read_all(&fs, name) == slot.model, "{} before the cut", name);
            if !cut_early {
                slot.held.fsync().unwrap();
                slot.durable = Some(slot.model.clone());
                slot.name_durable = true;
            }
        }
        // The power goes with everything still open; letting go afterwards writes nothing.
        assert!(dev.power_cut());
        let wants: Vec<Option<Vec<u8>>> =
            slots.iter().map(|s| if s.name_durable { s.durable.clone() } else { None }).collect();
        drop(orphans);
        drop(slots);
        drop(fs);
        dev.power_on();
        let fs = mount(&dev);
        for (want, name) in wants.iter().zip(names) {
            let Some(want) = want else { continue };
            holds_after_the_cut(&fs, name, want)?;
        }
        drop(fs);
        let report = check::check(engine(&dev, "sync-path")).unwrap();
        proptest::prop_assert!(report.is_clean(), "{:?}", report.problems);
    }
}

#[test]
fn allocated_ranges_read_zeros_hold_their_space_and_survive_a_power_cut() {
    for path in [FsyncPath::Journaled, FsyncPath::Aios, FsyncPath::Conventional] {
        let dev = emu("emu:null,size=16m,wcache=1,cut=drop");
        FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
        let fs = mount_with(&dev, "sync-path", MountOptions { fsync_path: path, ..MountOptions::default() });
        let f = fs.create("f").unwrap();
        let mut want = bytes(3, 5000);
        f.write_at(&want, 0).unwrap();
        f.fsync().unwrap();
        drop(f); // what the write preallocated past it is given back
        let f = fs.open("f").unwrap();
        let free = fs.free_blocks().unwrap();
        // Mode 0 from inside the data to 100 KiB: the data stays, the file grows, the blocks are taken.
        f.allocate(3000, 100 * 1024 - 3000, false).unwrap();
        want.resize(100 * 1024, 0);
        assert_eq!(f.len(), 100 * 1024, "{path:?}");
        assert!(read_all(&fs, "f") == want, "{path:?}: the data and zeros");
        assert_eq!(fs.free_blocks().unwrap(), free - 23, "{path:?}: blocks 2..25 taken");
        assert_eq!(fs.metadata("f").unwrap().blocks, 25 * 8, "{path:?}: st_blocks");
        // KEEP_SIZE: blocks past the end, the size kept, and kept through the last close.
        f.allocate(90 * 1024, 60 * 1024, true).unwrap();
        assert_eq!(f.len(), 100 * 1024);
        assert_eq!(fs.free_blocks().unwrap(), free - 23 - 13, "{path:?}: blocks 25..38 taken");
        drop(f);
        assert_eq!(fs.metadata("f").unwrap().blocks, 38 * 8, "{path:?}: kept past the last close");
        // Writes into allocated blocks take no more space; an append reaches into those past the end.
        let f = fs.open("f").unwrap();
        f.write_at(&bytes(4, 8000), 50_000).unwrap();
        want[50_000..58_000].copy_from_slice(&bytes(4, 8000));
        f.append(&bytes(5, 20_000)).unwrap();
        want.extend_from_slice(&bytes(5, 20_000));
        assert_eq!(fs.free_blocks().unwrap(), free - 36, "{path:?}: writes into allocated blocks");
        // Too much is ENOSPC, with nothing taken.
        let e = f.allocate(0, 64 << 20, false).unwrap_err();
        assert_eq!(errno(e), libc::ENOSPC, "{path:?}");
        assert_eq!(f.len(), want.len() as u64);
        assert_eq!(fs.free_blocks().unwrap(), free - 36, "{path:?}: an allocation that failed took nothing");
        assert_eq!(errno(f.allocate(0, 0, false).unwrap_err()), libc::EINVAL);
        f.fsync().unwrap();
        drop(f);
        let fs = cut_and_remount(&dev, fs);
        assert!(read_all(&fs, "f") == want, "{path:?}: after a power cut");
        // A truncate gives back what lay past the end.
        fs.open("f").unwrap().truncate(4096).unwrap();
        assert_eq!(fs.metadata("f").unwrap().blocks, 8, "{path:?}");
        drop(fs);
        assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean(), "{path:?}");
    }
}

#[test]
fn writes_into_an_allocation_that_fills_the_device_are_never_lost() {
    // Writes into the middle of preallocated (unwritten) blocks split their
    // extents, and the file's map grows past its overflow blocks after the
    // writes were accepted: the blocks for that come from a reserve data
    // allocations leave. Before it, on a full device, every one of these writes
    // and the fsync said yes and a power cut left every block reading zeros.
    for direct_every in [0, 2] {
        let (dev, fs) = fresh("emu:null,size=16m,wcache=1,cut=drop", FormatOptions::default());
        let f = fs.create("all").unwrap();
        // As much as the device gives (a failed allocation takes nothing).
        let mut blocks = fs.free_blocks().unwrap();
        while let Err(e) = f.allocate(0, blocks * 4096, false) {
            assert_eq!(errno(e), libc::ENOSPC);
            blocks -= 1;
        }
        let free = fs.free_blocks().unwrap();
        assert!(free <= 64, "{free} blocks left free");
        // What is left is not for data.
        let g = fs.create("other").unwrap();
        assert_eq!(errno(g.write_at(&bytes(1, 4096), 0).unwrap_err()), libc::ENOSPC);
        drop(g);
        // A write into every 11th block: some 700 extents, three overflow blocks.
        let direct = fs.open_direct("all").unwrap();
        let written: Vec<u64> = (0..blocks).step_by(11).collect();
        for (i, &block) in written.iter().enumerate() {
            let data = bytes(block, 4096);
            let through = if direct_every > 0 && i % direct_every == 0 { &direct } else { &f };
            through.write_at(&data, block * 4096).unwrap();
        }
        f.fsync().unwrap();
        drop((f, direct));
        let fs = cut_and_remount(&dev, fs);
        let f = fs.open("all").unwrap();
        let mut back = vec![0u8; 4096];
        for &block in &written {
            f.read_at(&mut back, block * 4096).unwrap();
            assert!(back == bytes(block, 4096), "direct every {direct_every}: block {block} after the cut");
        }
        drop(f);
        drop(fs);
        assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
    }
}

#[test]
fn an_fdatasync_of_cached_overwrites_makes_the_files_direct_writes_durable_too() {
    // fdatasync of a file whose dirty pages all overwrite committed blocks
    // writes them with forced unit access and sends no flush; a direct write
    // of the file before it was only in the device's cache, and a power cut
    // took it (found by held_files_orphans_and_maps_survive_a_power_cut).
    for path in [FsyncPath::Journaled, FsyncPath::Aios, FsyncPath::Conventional] {
        let dev = emu("emu:null,size=16m,wcache=1,cut=drop");
        FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
        let fs = mount_with(&dev, "sync-path", MountOptions { fsync_path: path, ..MountOptions::default() });
        let f = fs.create("f").unwrap();
        let mut want = bytes(1, 8 * 4096);
        f.write_at(&want, 0).unwrap();
        f.fsync().unwrap();
        let direct = fs.open_direct("f").unwrap();
        direct.write_at(&bytes(2, 4096), 6 * 4096).unwrap();
        want[6 * 4096..7 * 4096].copy_from_slice(&bytes(2, 4096));
        f.write_at(b"cached", 10).unwrap();
        want[10..16].copy_from_slice(b"cached");
        f.fdatasync().unwrap();
        drop((f, direct));
        let fs = cut_and_remount(&dev, fs);
        assert!(read_all(&fs, "f") == want, "{path:?}");
    }
}

#[test]
fn seek_data_and_seek_hole_find_what_was_written() {
    let (_dev, fs) = fresh("emu:null,size=16m", FormatOptions::default());
    let f = fs.create("s").unwrap();
    // A block of data, a hole to block 256, data in blocks 256 and 257 (the end).
    f.write_at(&bytes(1, 4096), 0).unwrap();
    f.write_at(&bytes(2, 4196), 256 * 4096).unwrap();
    let size = 256 * 4096 + 4196;
    let seek = |f: &iopath::fs::File, offset: u64, data: bool| f.seek_data_or_hole(offset, data).unwrap();
    let check = |f: &iopath::fs::File, when: &str| {
        assert_eq!(seek(f, 0, true), Some(0), "{when}");
        assert_eq!(seek(f, 0, false), Some(4096), "{when}: appends' preallocation past block 0 is a hole");
        assert_eq!(seek(f, 100, false), Some(4096), "{when}");
        assert_eq!(seek(f, 5000, false), Some(5000), "{when}: inside the hole");
        assert_eq!(seek(f, 5000, true), Some(256 * 4096), "{when}");
        assert_eq!(seek(f, 256 * 4096 + 10, false), Some(size), "{when}: the end is a hole");
        assert_eq!(seek(f, size - 1, true), Some(size - 1), "{when}");
        assert_eq!(seek(f, size, true), None, "{when}");
        assert_eq!(seek(f, size, false), None, "{when}");
    };
    check(&f, "dirty pages");
    f.fsync().unwrap();
    check(&f, "written");
    check(&fs.open_direct("s").unwrap(), "through a direct handle");
    // Allocated blocks read zeros and stay a hole until written.
    f.allocate(8 * 4096, 16 * 4096, false).unwrap();
    assert_eq!(seek(&f, 8 * 4096, false), Some(8 * 4096));
    assert_eq!(seek(&f, 4096, true), Some(256 * 4096));
    f.write_at(b"x", 10 * 4096 + 5).unwrap();
    assert_eq!(seek(&f, 4096, true), Some(10 * 4096), "a write into them");
    assert_eq!(seek(&f, 10 * 4096, false), Some(11 * 4096));
    // A writable map's range is data while it lives (its stores are the file's).
    let map = f.mirror_writable(100 * 4096, 2 * 4096).unwrap();
    assert_eq!(seek(&f, 11 * 4096, true), Some(100 * 4096));
    assert_eq!(seek(&f, 100 * 4096, false), Some(102 * 4096));
    drop(map); // nothing stored: nothing written back
    assert_eq!(seek(&f, 11 * 4096, true), Some(256 * 4096));
}

/// A file "all" allocated (unwritten) over as many blocks as data may
/// still take, and that number: what is left is the reserve for block maps.
fn file_over_the_whole_device(fs: &FileSystem) -> (iopath::fs::File, u64) {
    let f = fs.create("all").unwrap();
    let mut blocks = fs.free_blocks().unwrap();
    while f.allocate(0, blocks * 4096, false).is_err() {
        blocks -= 1;
    }
    (f, blocks)
}

#[test]
fn a_block_map_that_cannot_be_stored_fails_the_syncs_that_needed_it() {
    // The reserve for block maps (32 blocks on 64 MiB, some 8,000 extents) used
    // up: a write into every other block of a file allocated over the whole
    // device splits its map into 16,000 extents. The data reaches the device,
    // but the map that says so cannot be stored: fsync and sync say ENOSPC,
    // never that the data is durable.
    let (_dev, fs) = fresh("emu:null,size=64m", FormatOptions::default());
    let (f, blocks) = file_over_the_whole_device(&fs);
    for block in (0..blocks).step_by(2) {
        f.write_at(&bytes(block, 4096), block * 4096).unwrap();
    }
    assert_eq!(errno(f.fsync().unwrap_err()), libc::ENOSPC);
    assert_eq!(errno(fs.sync().unwrap_err()), libc::ENOSPC);
    // What was written reads back all the same.
    let mut back = vec![0u8; 4096];
    for block in (0..blocks).step_by(202) {
        f.read_at(&mut back, block * 4096).unwrap();
        assert!(back == bytes(block, 4096), "block {block}");
    }
}

#[test]
fn a_direct_write_whose_map_cannot_be_stored_is_never_called_durable() {
    // Direct writes into every other block of a file allocated over the whole
    // device split its map past the reserve: a write whose map cannot be stored
    // says ENOSPC, but its blocks are marked written in memory, so the same
    // write again succeeded without a store and fsync said the data was durable;
    // after a power cut those blocks read zeros.
    let (dev, fs) = fresh("emu:null,size=64m,wcache=1,cut=drop", FormatOptions::default());
    let (f, blocks) = file_over_the_whole_device(&fs);
    f.fsync().unwrap();
    let direct = fs.open_direct("all").unwrap();
    let mut written = Vec::new();
    let mut refused = 0;
    for block in (0..blocks).step_by(2) {
        let data = bytes(block, 4096);
        if direct.write_at(&data, block * 4096).is_err() {
            refused += 1;
            // Written again: as a program that retries.
            if direct.write_at(&data, block * 4096).is_err() {
                continue;
            }
        }
        written.push(block);
    }
    assert!(refused > 0, "the reserve was never used up: the test no longer tests this");
    let synced = f.fsync();
    drop((f, direct));
    let fs = cut_and_remount(&dev, fs);
    match synced {
        Ok(()) => {
            let f = fs.open("all").unwrap();
            let mut back = vec![0u8; 4096];
            for &block in &written {
                f.read_at(&mut back, block * 4096).unwrap();
                assert!(back == bytes(block, 4096), "block {block}: fsync said yes, the cut took it");
            }
        }
        Err(e) => assert_eq!(errno(e), libc::ENOSPC),
    }
}

#[test]
fn a_write_past_a_hole_preallocates_nothing_for_a_sparse_file() {
    // A write that leaves a hole before it is not an append: a sparse file
    // grown by a truncate afterwards (rsync --sparse, dd seek=) kept the
    // blocks preallocated after it inside its size, 1 MiB per such write.
    let (_dev, fs) = fresh("emu:null,size=64m", FormatOptions::default());
    let f = fs.create("sparse").unwrap();
    f.write_at(&bytes(1, 8192), 3000 * 4096).unwrap();
    f.truncate(50 << 20).unwrap();
    f.fsync().unwrap();
    drop(f);
    assert_eq!(fs.metadata("sparse").unwrap().blocks, 2 * 8, "two written blocks, nothing else");
    // An append still preallocates (given back past the end at the last close).
    let g = fs.create("log").unwrap();
    g.write_at(&bytes(2, 4096), 0).unwrap();
    g.append(&bytes(3, 4096)).unwrap();
    assert!(fs.metadata("log").unwrap().blocks > 2 * 8, "an append preallocates");
    drop(g);
    assert_eq!(fs.metadata("log").unwrap().blocks, 2 * 8, "given back at the last close");
}

#[test]
fn writers_short_of_space_find_what_a_commit_freed() {
    // Four threads truncate and rewrite files of their own without fsync on a
    // small device, so the blocks they free sit in the running transaction
    // until a writer finds no space and commits. A writer whose transaction
    // another thread was committing saw the commit's watermark raised before
    // the blocks it freed could be allocated, looked again at once and got
    // ENOSPC with 3,691 blocks of 3,707 freed (`tests/c/handlers_on_mount.c`
    // on a 16 MiB mount: 3 runs in 20).
    let dir = tempfile::tempdir().unwrap();
    let dev = emu("emu:null,size=16m");
    FileSystem::format(engine(&dev, "sync-path"), FormatOptions::default()).unwrap();
    let log = shm_log(&dir.path().join("log"), 1 << 20);
    let (fs, _) =
        FileSystem::mount_beside(engine(&dev, "sync-path"), MountOptions::default(), None, Some(log)).unwrap();
    std::thread::scope(|s| {
        for n in 0..4 {
            let fs = &fs;
            s.spawn(move || {
                let f = fs.create(format!("f{n}")).unwrap();
                let data = bytes(n, 4096);
                for round in 0..1000 {
                    f.truncate(0).unwrap();
                    for i in 0..64 {
                        f.write_at(&data, i * 4096).unwrap_or_else(|e| panic!("f{n}, round {round}, record {i}: {e}"));
                    }
                }
            });
        }
    });
    fs.unmount().unwrap();
    assert!(check::check(engine(&dev, "sync-path")).unwrap().is_clean());
}
