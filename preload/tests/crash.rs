//! SIGKILL in the middle of writing loses nothing acknowledged (a C writer,
//! SQLite, RocksDB's db_bench, a MariaDB server):
//! `tests/c/crash_writer.c` appends records with fdatasync and replaces a
//! state file atomically on an iopath mount, saying on stdout what is
//! durable; it is killed at a random moment, again and again on the same
//! image (each next writer's mount recovers what the last one left), and
//! after every kill every acknowledged record must be there byte for byte,
//! the state file must be whole, and fsck must be clean.

mod common;

use common::{compile, engine, formatted_image, formatted_image_of, mounted};
use iopath::fs::{FileSystem, check};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs `command` for `run_for`, kills it with SIGKILL, and returns the lines
/// it printed; fails the test if it ended on its own.
fn kill_after(mut command: Command, run_for: Duration, what: &str) -> Vec<String> {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let lines = std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<_>>());
    std::thread::sleep(run_for);
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.code().is_none(), "{what}: the writer stopped on its own ({status}): {stderr}");
    lines.join().unwrap()
}

/// The record crash_writer.c writes for `seq` in file `f`.
fn record(seq: u64, f: u8) -> [u8; 64] {
    let mut r = [0u8; 64];
    r[..3].copy_from_slice(b"REC");
    r[3..11].copy_from_slice(&seq.to_le_bytes());
    r[11] = f;
    let mut x = seq.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    for b in &mut r[12..60] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let sum = r[..60].iter().fold(0u32, |s, &b| s.wrapping_mul(31).wrapping_add(b as u32));
    r[60..].copy_from_slice(&sum.to_le_bytes());
    r
}

/// The whole records in `data` (a killed writer may leave a torn one between them).
fn records(data: &[u8], f: u8) -> Vec<u64> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 64 <= data.len() {
        let seq = u64::from_le_bytes(data[at + 3..at + 11].try_into().unwrap());
        if data[at..at + 3] == *b"REC" && data[at..at + 64] == record(seq, f) {
            out.push(seq);
            at += 64;
        } else {
            at += 1;
        }
    }
    out
}

#[test]
fn sigkill_in_the_middle_of_writing_loses_no_acknowledged_write() {
    let writer = compile("crash_writer", &[]);
    let scratch = tempfile::tempdir().unwrap();
    let (image, mnt) = formatted_image(scratch.path());
    let rounds: u64 = std::env::var("CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(16);
    let mut acked: BTreeMap<u8, Vec<u64>> = BTreeMap::new();
    let mut state_at_least = None;
    let mut rng = fastrand::Rng::with_seed(7);
    for round in 0..rounds {
        let mut command = Command::new(&writer);
        command.arg(&mnt).arg(round.to_string()).arg((round * 1_000_000).to_string());
        mounted(&mut command, &mnt, &image);
        let lines = kill_after(command, Duration::from_millis(rng.u64(20..250)), &format!("round {round}"));
        for line in &lines {
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                ["A", seq, f] => acked.entry(f.parse().unwrap()).or_default().push(seq.parse().unwrap()),
                ["S", seq] => state_at_least = Some(seq.parse::<u64>().unwrap()),
                _ => panic!("round {round}: odd line {line:?}"),
            }
        }
        // Every other round, look now; the rest leave recovery to the next writer's mount.
        if round % 2 == 1 || round + 1 == rounds {
            let report = check::check(engine(&image)).unwrap();
            assert!(report.is_clean(), "round {round}: fsck: {:?}", report.problems);
            let (fs, _) = FileSystem::mount(engine(&image)).unwrap();
            let read = |name: &str| {
                let f = fs.open(name).unwrap();
                let mut data = vec![0u8; f.len() as usize];
                assert_eq!(f.read_at(&mut data, 0).unwrap(), data.len());
                data
            };
            for (&f, seqs) in &acked {
                let found = records(&read(&format!("log-{f}")), f);
                let mut it = found.iter();
                for seq in seqs {
                    assert!(it.any(|s| s == seq), "round {round}: acknowledged record {seq} of log-{f} is lost");
                }
            }
            if let Some(least) = state_at_least {
                let state = read("state");
                assert_eq!(state.len(), 64, "round {round}: the state file is whole");
                let seq = u64::from_le_bytes(state[3..11].try_into().unwrap());
                assert!(
                    seq >= least && state[..] == record(seq, 9),
                    "round {round}: state {seq} < acknowledged {least}"
                );
            }
            fs.unmount().unwrap();
        }
        eprintln!("round {round}: {} lines acknowledged", lines.len());
    }
    let total: usize = acked.values().map(Vec::len).sum();
    assert!(total > 50, "the writers acknowledged only {total} records: too few to mean anything");
    let _ = std::fs::remove_file(writer);
}

/// SQLite transactions killed at random moments: every acknowledged commit
/// survives and `PRAGMA integrity_check` stays ok, in rollback-journal
/// and WAL mode, both with SQLite's default `synchronous=FULL`. Runs where
/// `python3` has its `sqlite3` module (it says so otherwise).
#[test]
fn sigkill_during_sqlite_transactions_keeps_every_commit_and_an_intact_database() {
    let python = Command::new("python3").args(["-c", "import sqlite3"]).status();
    if !python.is_ok_and(|s| s.success()) {
        eprintln!("SKIPPED: no python3 with sqlite3 here (apt-get install python3)");
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let (image, mnt) = formatted_image(scratch.path());
    let writer = r#"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1] + "/" + sys.argv[2] + ".db", isolation_level=None)
if sys.argv[2] == "wal":
    db.execute("pragma locking_mode=EXCLUSIVE")  # WAL's index in memory: no mmap of -shm
db.execute("pragma journal_mode=" + sys.argv[2])
# DELETE commits by unlinking the journal, which FULL does not sync: the unlink must
# outlive the killed process as it would with the kernel (iopath writes namespace
# changes to its journal at once: NamespaceCommit::Written).
db.execute("pragma synchronous=FULL")
db.execute("create table if not exists t(k integer primary key, v blob)")
k = int(sys.argv[3])
while True:
    db.execute("begin")
    db.execute("insert into t values (?, randomblob(300))", (k,))
    db.execute("update t set v = randomblob(200) where k = ?", (k // 2,))
    db.execute("commit")
    print(k, flush=True)
    k += 1
"#;
    let checker = r#"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1] + "/" + sys.argv[2] + ".db")
if sys.argv[2] == "wal":
    db.execute("pragma locking_mode=EXCLUSIVE")
print(db.execute("pragma integrity_check").fetchone()[0])
try:
    print(" ".join(str(r[0]) for r in db.execute("select k from t")))
except sqlite3.OperationalError as e:
    # Killed before it made its table (Python takes 0.6 s to start on a loaded
    # machine; the kill comes after 0.3-0.9 s): nothing was acknowledged, which
    # the caller checks.
    print("")
    print(e, file=sys.stderr)
"#;
    let mut rng = fastrand::Rng::with_seed(11);
    let mut acked: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for round in 0..8u64 {
        let mode = if round % 2 == 0 { "delete" } else { "wal" };
        let mut c = Command::new("python3");
        c.args(["-c", writer, &mnt.display().to_string(), mode, &(round * 100_000 + 1).to_string()]);
        mounted(&mut c, &mnt, &image);
        let lines = kill_after(c, Duration::from_millis(rng.u64(300..900)), &format!("round {round}"));
        acked.entry(mode).or_default().extend(lines.iter().map(|l| l.parse::<u64>().unwrap()));
        let mut c = Command::new("python3");
        c.args(["-c", checker, &mnt.display().to_string(), mode]);
        mounted(&mut c, &mnt, &image);
        let out = c.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "round {round}: {}", String::from_utf8_lossy(&out.stderr));
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("ok"), "round {round} ({mode}): integrity_check");
        let keys: std::collections::HashSet<u64> =
            lines.next().unwrap_or("").split(' ').filter(|w| !w.is_empty()).map(|w| w.parse().unwrap()).collect();
        for k in &acked[mode] {
            assert!(keys.contains(k), "round {round} ({mode}): committed row {k} is lost");
        }
        let report = check::check(engine(&image)).unwrap();
        assert!(report.is_clean(), "round {round}: fsck: {:?}", report.problems);
        eprintln!("round {round} ({mode}): {} commits acknowledged so far", acked[mode].len());
    }
    assert!(acked.values().all(|v| v.len() > 10), "too few commits to mean anything: {acked:?}");
}

/// RocksDB's `db_bench fillseq --sync=1` (one thread: each write is in the
/// write-ahead log and synced before the next begins, db_bench's `fillsync`
/// with keys in order) killed with SIGKILL at a random moment, on a fresh
/// database of the same image each round: the database opens (`ldb`
/// recovers its log) and holds keys 0 to M-1 and nothing else, each with
/// its 100-byte value, where M is at least the count of writes db_bench had
/// reported finished (its progress lines on stderr); fsck is clean. Runs
/// where rocksdb-tools is installed (it says so otherwise).
#[test]
fn sigkill_of_db_bench_fillsync_keeps_every_acknowledged_write() {
    if Command::new("db_bench").arg("--version").output().is_err() || Command::new("ldb").output().is_err() {
        eprintln!("SKIPPED: no db_bench or ldb here (apt-get install rocksdb-tools)");
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let (image, mnt) = formatted_image_of(scratch.path(), 256 << 20);
    let rounds: u64 = std::env::var("CRASH_ROUNDS").ok().and_then(|v| v.parse().ok()).map_or(3, |r: u64| r.div_ceil(8));
    let mut rng = fastrand::Rng::with_seed(11);
    for round in 0..rounds {
        let db = mnt.join(format!("db{round}"));
        let mut bench = Command::new("db_bench");
        bench.args(["--benchmarks=fillseq", "--sync=1", "--num=10000000", "--threads=1", "--value_size=100"]);
        bench.args(["--compression_type=none", "--progress_reports=true"]).arg(format!("--db={}", db.display()));
        mounted(&mut bench, &mnt, &image);
        let mut child = bench.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        let progress = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
            text
        });
        std::thread::sleep(Duration::from_millis(rng.u64(300..1200)));
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        let text = progress.join().unwrap();
        assert!(status.code().is_none(), "round {round}: db_bench stopped on its own ({status}): {text}");
        // "... finished N ops", each line ended by a carriage return.
        let acked = text
            .split(['\r', '\n'])
            .filter_map(|l| l.trim().strip_prefix("... finished ")?.strip_suffix(" ops")?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        let report = check::check(engine(&image)).unwrap();
        assert!(report.is_clean(), "round {round}: fsck: {:?}", report.problems);
        let mut scan = Command::new("ldb");
        scan.arg(format!("--db={}", db.display())).args(["scan", "--hex"]);
        mounted(&mut scan, &mnt, &image);
        let out = common::output_within(&mut scan, Duration::from_secs(120));
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "round {round}: ldb scan: {}", String::from_utf8_lossy(&out.stderr));
        let mut keys = 0u64;
        for line in listing.lines() {
            let (key, value) = line.split_once(" : ").unwrap_or_else(|| panic!("round {round}: odd line {line:?}"));
            // A key: its number, 8 bytes big-endian, then eight '0's (db_bench's 16-byte keys).
            let expected = format!("0x{keys:016X}{}", "30".repeat(8));
            assert_eq!(key, expected, "round {round}: key {keys} is missing or out of place");
            assert_eq!(value.len(), 2 + 200, "round {round}: the value of key {keys} is not 100 bytes");
            keys += 1;
        }
        assert!(keys >= acked, "round {round}: {acked} writes acknowledged, {keys} keys found");
        assert!(acked > 100, "round {round}: db_bench acknowledged only {acked} writes: too few to mean anything");
        eprintln!("round {round}: {acked} writes acknowledged, {keys} keys found");
    }
}

/// A MariaDB server with its data directory on a mount, killed with SIGKILL
/// after its client saw every insert committed: after recovery every row is
/// there and CHECK TABLE is clean. Its redo log is what carries the commits:
/// MariaDB 10.11 maps it with `MAP_SYNC` and, given such a map, takes the
/// file for persistent memory and never syncs it; on a build that granted
/// the map, the table and all its rows were gone after the kill.
#[test]
fn sigkill_of_a_mariadb_server_keeps_every_acknowledged_commit() {
    if Command::new("mariadbd").arg("--version").output().is_err() {
        eprintln!("SKIPPED: no mariadbd here (apt-get install mariadb-server)");
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let (image, mnt) = formatted_image_of(scratch.path(), 384 << 20);
    let cnf = scratch.path().join("my.cnf");
    std::fs::write(
        &cnf,
        "[mariadbd]\nskip-networking\nuser=root\ninnodb_flush_method=O_DIRECT\ninnodb_use_native_aio=0\n\
         innodb_buffer_pool_size=16M\ninnodb_log_file_size=16M\nskip-grant-tables\n",
    )
    .unwrap();
    let sock = scratch.path().join("sock");
    let data = mnt.join("data");
    let defaults = format!("--defaults-file={}", cnf.display());
    let mut install = Command::new("mariadb-install-db");
    install.args([&defaults, &format!("--datadir={}", data.display()), "--user=root"]);
    install.arg("--auth-root-authentication-method=normal");
    mounted(&mut install, &mnt, &image);
    let out = common::output_within(&mut install, Duration::from_secs(120));
    assert!(out.status.success(), "mariadb-install-db: {}", String::from_utf8_lossy(&out.stderr));
    let client = |sql: &str| {
        let mut c = Command::new("mariadb");
        c.args([&format!("--socket={}", sock.display()), "-N", "-e", sql]);
        c.output().unwrap()
    };
    let start = || {
        let mut server = Command::new("mariadbd");
        server.args([&defaults, &format!("--datadir={}", data.display()), &format!("--socket={}", sock.display())]);
        server.arg(format!("--log-error={}", scratch.path().join("err.log").display()));
        mounted(&mut server, &mnt, &image);
        let mut child = server.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let began = std::time::Instant::now();
        while !client("select 1").status.success() {
            let log = std::fs::read_to_string(scratch.path().join("err.log")).unwrap_or_default();
            assert!(child.try_wait().unwrap().is_none(), "mariadbd stopped: {log}");
            assert!(began.elapsed() < Duration::from_secs(120), "mariadbd did not answer: {log}");
            std::thread::sleep(Duration::from_millis(100));
        }
        child
    };
    let mut server = start();
    let rows = 300;
    let inserts: String = (1..=rows).map(|k| format!("insert into t.t values ({k}, repeat('x', 200));")).collect();
    let out =
        client(&format!("create database t; create table t.t (k int primary key, v text) engine=innodb; {inserts}"));
    assert!(out.status.success(), "inserts: {}", String::from_utf8_lossy(&out.stderr));
    // Every insert was committed and answered (autocommit, one after another): now the kill.
    server.kill().unwrap();
    server.wait().unwrap();
    let mut server = start();
    let count = client("select count(*), sum(k) from t.t");
    let check = client("check table t.t");
    let _ = client("shutdown");
    server.wait().unwrap();
    let (count, check) = (String::from_utf8_lossy(&count.stdout), String::from_utf8_lossy(&check.stdout));
    assert_eq!(count.trim(), format!("{rows}\t{}", rows * (rows + 1) / 2), "rows after recovery");
    assert!(check.trim_end().ends_with("\tOK"), "CHECK TABLE: {check}");
    let report = check::check(engine(&image)).unwrap();
    assert!(report.is_clean(), "fsck: {:?}", report.problems);
}
