//! iopath's output read by fio's own tools, and one job file run by fio and
//! by iopath side by side. `.ci/run` installs fio, python3-six and gnuplot;
//! without them these tests say SKIPPED and pass.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn have(tool: &str) -> bool {
    let found =
        Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success());
    if !found {
        eprintln!("SKIPPED: {tool} is not installed (apt-get install fio python3-six gnuplot-nox)");
    }
    found
}

fn iopath(dir: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_iopath")).current_dir(dir).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn fio_jsonplus_clat2csv_reads_and_validates_iopaths_json_plus() {
    if !have("fio_jsonplus_clat2csv") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let args = ["bench", "--device", "emu:optane", "--rw", "randrw", "--runtime", "300ms", "--no-progress"];
    iopath(dir.path(), &[&args[..], &["--output-format", "json+", "--output", "plus.json"]].concat());
    for extra in [&[][..], &["--validate"][..]] {
        let out = Command::new("fio_jsonplus_clat2csv")
            .current_dir(dir.path())
            .args(["plus.json", "plus.csv"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let csv = std::fs::read_to_string(dir.path().join("plus_job0.csv")).unwrap();
    assert!(csv.lines().count() > 10 && csv.starts_with("nsec, read_slat_ns_count"), "{csv:.200}");
}

#[test]
fn fio_generate_plots_draws_iopaths_latency_logs() {
    if !have("fio_generate_plots") || !have("gnuplot") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let logs = ["--write-lat-log", "run", "--write-bw-log", "run", "--write-iops-log", "run", "--log-avg-msec", "50"];
    iopath(
        dir.path(),
        &[&["bench", "--device", "emu:optane", "--runtime", "500ms", "--no-progress"][..], &logs].concat(),
    );
    // It plots every kind of log and fails if one is missing.
    let out = Command::new("fio_generate_plots").current_dir(dir.path()).arg("run").output().unwrap();
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for kind in ["lat", "clat", "slat", "bw", "iops"] {
        let svg = std::fs::read_to_string(dir.path().join(format!("run-{kind}.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains("<path"), "{kind}: a plot");
    }
}

#[test]
fn one_job_file_under_fio_and_iopath_gives_the_same_fields_and_both_logs() {
    if !have("fio") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let job = "[global]\nioengine=psync\ndirect=1\nsize=16m\nbs=4k\nthread\ntime_based\nruntime=1\n\n\
               [mix]\nrw=randrw\nrwmixread=70\nrandom_distribution=zipf:1.2\nrate_iops=200\nwrite_lat_log=mix\n";
    let mut docs = Vec::new();
    for who in ["fio", "iopath"] {
        let d = dir.path().join(who);
        std::fs::create_dir(&d).unwrap();
        std::fs::write(d.join("job.fio"), format!("{}filename={}\n", job, d.join("data.img").display())).unwrap();
        let out = if who == "fio" {
            let out = Command::new("fio").current_dir(&d).args(["--output-format=json", "job.fio"]).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            out
        } else {
            iopath(&d, &["bench", "job.fio", "--output-format", "json", "--no-progress"])
        };
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let lat = std::fs::read_to_string(d.join("mix_lat.1.log")).unwrap();
        let (ios, lines) = (
            doc["jobs"][0]["read"]["total_ios"].as_u64().unwrap()
                + doc["jobs"][0]["write"]["total_ios"].as_u64().unwrap(),
            lat.lines().count() as u64,
        );
        assert!(lines.abs_diff(ios) <= 2, "{who}: {lines} log lines for {ios} requests");
        docs.push(doc);
    }
    let (fio, mine) = (&docs[0]["jobs"][0], &docs[1]["jobs"][0]);
    // Every field of fio's job object, and of its read/write objects, is in iopath's.
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<std::collections::BTreeSet<_>>();
    let missing: Vec<_> = keys(fio).difference(&keys(mine)).cloned().collect();
    assert!(missing.is_empty(), "iopath's job lacks fio's {missing:?}");
    for d in ["read", "write"] {
        let missing: Vec<_> = keys(&fio[d]).difference(&keys(&mine[d])).cloned().collect();
        assert!(missing.is_empty(), "iopath's {d} lacks fio's {missing:?}");
    }
    let options = |v: &Value| {
        let mut o = v["job options"].as_object().unwrap().clone();
        o.remove("filename"); // each ran on its own file
        o
    };
    assert_eq!(options(fio), options(mine), "the job's own options, as given");
    // Both hold each direction to 200 IOPS: never above it (the cap is the
    // feature), and well on the way to it; how close depends on how fast this
    // machine's disk takes a direct write (a slow CI disk gave 454 of 500).
    for d in ["read", "write"] {
        let iops = mine[d]["iops"].as_f64().unwrap();
        assert!((100.0..=210.0).contains(&iops), "iopath {d}: {iops:.0} IOPS (fio: {})", fio[d]["iops"]);
    }
}

/// fio forks its jobs (without --thread) before they do any I/O: the job's
/// process must route its own calls, opening its own engine.
#[test]
fn a_forked_fio_job_routes_its_own_io() {
    if !have("fio") {
        return;
    }
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let file = dir.path().join("data.img");
    let file = file.to_str().unwrap();
    iopath(dir.path(), &["bench", "--device", &format!("uring:{file}"), "--size", "4m", "--ios", "1", "--no-progress"]);
    let out = Command::new(env!("CARGO_BIN_EXE_iopath"))
        .args(["run", "--log", "--files", file, "--", "fio", "--name=forked", "--ioengine=psync", "--direct=1"])
        .args(["--rw=randread", "--bs=4k", "--size=4m", "--io_size=256k", &format!("--filename={file}")])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("engine open"), "the forked job opened no engine of its own:\n{stderr}");
}
