//! Trims (discards) on every backend and through the merging paths: a
//! trimmed range reads back as zeros, its neighbours keep their data, and
//! `iopath bench --rw trim/randtrim` counts them as fio does.

use iopath::device::{Op, open_device};
use iopath::path::PathSpec;
use iopath::{Engine, HandleOptions, IoBuf};
use serde_json::Value;
use std::process::Command;

const BS: usize = 4096;
const BLOCKS: usize = 32;

fn block(i: usize) -> IoBuf {
    let mut b = IoBuf::new(BS);
    b.iter_mut().enumerate().for_each(|(j, x)| *x = (i * 31 + j % 251 + 1) as u8);
    b
}

/// Writes every block, trims some (blocking and queued), reads all back.
fn trims_read_back_as_zeros(spec: &str, path: &str) {
    let device = open_device(spec, Some((BS * BLOCKS) as u64)).unwrap();
    let engine = Engine::with_device(device, PathSpec::parse(path).unwrap().config().unwrap()).unwrap();
    for i in 0..BLOCKS {
        engine.write_at(&block(i), (i * BS) as u64).unwrap();
    }
    let mut handle = engine.handle(HandleOptions { depth: 8, buffers: 8, buffer_size: BS }).unwrap();
    // Blocks 4-7 in one blocking trim; 12, 14, 16, 18 queued together.
    handle.trim((4 * BS) as u64, 4 * BS).unwrap();
    for (slot, b) in [12, 14, 16, 18].into_iter().enumerate() {
        handle.submit(Op::Trim, slot, (b * BS) as u64, BS).unwrap();
    }
    handle.commit().unwrap();
    let mut done = Vec::new();
    while done.len() < 4 {
        handle.reap(1, &mut done).unwrap();
    }
    assert!(
        done.iter().all(|d| d.result.is_ok()),
        "{spec} {path}: {:?}",
        done.iter().map(|d| &d.result).collect::<Vec<_>>()
    );
    engine.flush().unwrap();
    let trimmed = |i: usize| (4..8).contains(&i) || [12, 14, 16, 18].contains(&i);
    let mut buf = IoBuf::new(BS);
    for i in 0..BLOCKS {
        engine.read_at(&mut buf, (i * BS) as u64).unwrap();
        if trimmed(i) {
            assert!(buf.iter().all(|&x| x == 0), "{spec} {path}: block {i} was trimmed");
        } else {
            assert_eq!(&buf[..], &block(i)[..], "{spec} {path}: block {i} keeps its data");
        }
    }
}

#[test]
fn trims_zero_their_range_on_every_backend_and_path() {
    let dir = tempfile::tempdir().unwrap();
    for (n, path) in ["sync-path", "sync-intr", "stm", "2q", "atm"].into_iter().enumerate() {
        trims_read_back_as_zeros("emu:optane", path);
        trims_read_back_as_zeros("emu:optane,wcache=1", path);
        trims_read_back_as_zeros("emu:null,audit=1", path);
        let file = dir.path().join(format!("u{n}.img"));
        trims_read_back_as_zeros(&format!("uring:{}", file.display()), path);
        let file = dir.path().join(format!("p{n}.img"));
        trims_read_back_as_zeros(&format!("psync:{}", file.display()), path);
        let file = dir.path().join(format!("a{n}.img"));
        trims_read_back_as_zeros(&format!("aio:{}", file.display()), path);
    }
}

fn bench(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_iopath")).current_dir(dir).arg("bench").args(args).output().unwrap()
}

#[test]
fn bench_counts_trims_as_fio_does_and_refuses_to_verify_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = bench(
        dir.path(),
        &["--device", "emu:optane", "--rw", "randtrim", "--size", "16m", "--ios", "500", "--no-progress"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("\ntrim "), "a trim row in the table");
    let out = bench(
        dir.path(),
        &[
            "--device",
            "emu:optane",
            "--rw",
            "trim",
            "--size",
            "1m",
            "--output-format",
            "json",
            "--no-progress",
            "--write-lat-log",
            "t",
        ],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let j = &doc["jobs"][0];
    assert_eq!(j["trim"]["total_ios"], 256, "one pass over 1 MiB");
    assert_eq!(j["read"]["total_ios"], 0);
    assert_eq!(j["write"]["total_ios"], 0);
    let log = std::fs::read_to_string(dir.path().join("t_lat.1.log")).unwrap();
    assert_eq!(log.lines().count(), 256);
    assert!(log.lines().all(|l| l.split(", ").nth(2) == Some("2")), "fio's direction 2 is trim");

    let out = bench(dir.path(), &["--device", "emu:optane", "--rw", "trim", "--verify", "--no-progress"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("reads back as zeros"));
    // A trim destroys data: a file iopath did not create is refused as for writes.
    let foreign = dir.path().join("foreign.img");
    std::fs::write(&foreign, vec![7u8; 1 << 20]).unwrap();
    let out = bench(dir.path(), &["--device", &format!("psync:{}", foreign.display()), "--rw", "trim"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--allow-overwrite"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::read(&foreign).unwrap().iter().all(|&b| b == 7), "untouched");
}
