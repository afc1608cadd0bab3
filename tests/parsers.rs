//! Every parser a user's text reaches (device specs, path names, sizes,
//! durations, workloads, policies) gives an answer or a clear error for any
//! input, never a panic. proptest feeds them arbitrary text and text shaped
//! like what they expect (known keys with random values), then shrinks any
//! failure to a smallest input.

use iopath::device::DeviceSpec;
use iopath::device::spec::Backend;
use iopath::path::{CompletionKind, DispatchKind, PathSpec};
use iopath::units::{parse_duration, parse_duration_default_unit, parse_size};
use proptest::prelude::*;

/// Text that looks like a device spec: a known or unknown backend, a first
/// field, and key=value options drawn from every backend's keys and the
/// fault keys, with values that are numbers, sizes, ranges or junk.
fn device_spec_like() -> impl Strategy<Value = String> {
    let backend = one_of(&["emu:", "null", "null:", "null,", "uring:", "psync:", "floppy:", ""], "[a-z]{0,5}:");
    let first = one_of(&["dram-ssd", "custom", "nand", "/nonexistent-iopath/x.img", ""], "[a-z/.]{0,12}");
    // Every backend's keys and the fault wrapper's.
    let mut keys: Vec<&'static str> = vec![
        "size", "file", "slots", "channels", "cmd", "xfer", "rcmd", "wxfer", "flush", "populate", "readonly", "direct",
        "taskrun", "iopoll", "sqpoll",
    ];
    keys.extend_from_slice(iopath::device::fault::KNOWN);
    let key = one_of(&keys, "[a-z_]{0,8}");
    let value = prop_oneof![
        one_of(
            &["0", "1", "-1", "18446744073709551616", "1.5", "NaN", "inf", "4k-8k", "8k-4k", "-", "16777216t"],
            ".{0,6}"
        ),
        any::<u64>().prop_map(|n| n.to_string()),
        "[0-9]{1,4}(k|m|g|t|us|ms|s|ns|x)?",
    ];
    let option = (key, value, any::<bool>()).prop_map(|(k, v, eq)| if eq { format!("{k}={v}") } else { k });
    (backend, first, proptest::collection::vec(option, 0..6)).prop_map(|(b, f, opts)| {
        let mut spec = format!("{b}{f}");
        for o in opts {
            spec.push(',');
            spec.push_str(&o);
        }
        spec
    })
}

/// One of `known`, or text matching `other`.
fn one_of(known: &[&'static str], other: &'static str) -> impl Strategy<Value = String> + use<> {
    let known: Vec<String> = known.iter().map(|s| s.to_string()).collect();
    prop_oneof![3 => proptest::sample::select(known), 1 => other]
}

/// Text that looks like a path name: a preset or pair and @knob=value settings.
fn path_like() -> impl Strategy<Value = String> {
    let base = one_of(&["stm", "sync-path", "2q", "combine+poll", "stm+interrupt", "warp+poll", "+"], ".{0,8}");
    let knob = one_of(
        &["combine-polling", "combine-budget", "pipeline", "waiter-spin", "unplug-thresh", "unplug-us", "max-segments"],
        "[a-z-]{0,6}",
    );
    let value = one_of(&["winner", "shared", "4294967296", "0", "20us"], "[0-9a-z.]{0,6}");
    (base, proptest::collection::vec((knob, value), 0..4)).prop_map(|(b, knobs)| {
        let mut name = b;
        for (k, v) in knobs {
            name.push_str(&format!("@{k}={v}"));
        }
        name
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn device_specs_never_panic(text in ".{0,40}", size in proptest::option::of(any::<u64>())) {
        let _ = DeviceSpec::parse(&text, size);
    }

    #[test]
    fn device_spec_shaped_text_never_panics(text in device_spec_like(), size in proptest::option::of(any::<u64>())) {
        // Parsing only: opening would create files.
        if let Err(e) = DeviceSpec::parse(&text, size) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn emulated_devices_that_parse_also_open_and_serve_a_request(text in device_spec_like(), path in path_like()) {
        // Memory-backed only (no files), and small: opening allocates the store.
        let Ok(spec) = DeviceSpec::parse(&text, Some(1 << 20)) else { return Ok(()) };
        let memory = matches!(&spec.backend, Backend::Null(_))
            || matches!(&spec.backend, Backend::Emu(c) if c.file.is_none() && c.size <= 16 << 20);
        let slow = spec.faults.as_ref().is_some_and(|f| f.hang_nth.is_some() || f.panic_nth.is_some() || f.spike_rate > 0.0);
        if !memory || slow {
            return Ok(());
        }
        let Ok(device) = spec.open() else { return Ok(()) };
        let Ok(path) = PathSpec::parse(&path) else { return Ok(()) };
        let mut config = path.base.clone();
        path.apply_knobs(&mut config).unwrap();
        config.timeout = std::time::Duration::from_millis(200);
        if let Ok(engine) = iopath::Engine::with_device(device, config) {
            let mut buf = iopath::IoBuf::new(512);
            // A device error or a bad request is an answer; a panic or a hang is not.
            let _ = engine.read_at(&mut buf, 0);
            let _ = engine.write_at(&buf, 512);
        }
    }

    #[test]
    fn path_names_never_panic(text in ".{0,30}") {
        let _ = PathSpec::parse(&text);
    }

    #[test]
    fn path_shaped_names_never_panic(text in path_like()) {
        if let Ok(spec) = PathSpec::parse(&text) {
            let mut path = spec.base.clone();
            prop_assert!(spec.apply_knobs(&mut path).is_ok());
            prop_assert!(spec.shown_name(&path).starts_with(&spec.shown_name(&spec.base)[..1]));
        }
    }

    #[test]
    fn sizes_and_durations_never_panic(text in ".{0,24}") {
        let _ = parse_size(&text);
        let _ = parse_duration(&text);
        let _ = parse_duration_default_unit(&text, 1e3);
        let _ = iopath::bench::Rw::parse(&text);
        let _ = CompletionKind::parse(&text);
        let _ = DispatchKind::parse(&text);
    }

    #[test]
    fn number_shaped_sizes_and_durations_never_panic(
        n in "[0-9]{0,25}(\\.[0-9]{0,3})?",
        unit in "(k|K|kb|KiB|m|g|t|tb|b|ns|us|µs|ms|s|sec|m|min|h|x|)",
    ) {
        let text = format!("{n}{unit}");
        let _ = parse_size(&text);
        let _ = parse_duration(&text);
    }

    #[test]
    fn sizes_parse_to_what_they_say(n in 0u64..1_000_000, shift in 0usize..4) {
        let suffix = ["", "k", "m", "g"][shift];
        prop_assert_eq!(parse_size(&format!("{n}{suffix}")).unwrap(), n << (10 * shift));
    }
}
