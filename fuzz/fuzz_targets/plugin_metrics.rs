//! Metric calls a plugin makes (`metric-family`, `metric-record`,
//! `metric-set` of the `host` interface) through the host's
//! `tern_wasm::metrics::MetricRegistry`, which `host.rs` calls with the
//! plugin's arguments as they are, then the metrics page (`render`).
//!
//! Invariants: no model declares more families, and no family holds more
//! label sets, than its caps; the rendered page is valid Prometheus text
//! (the checks of Prometheus' own parser, expfmt: valid names, escapes that
//! are `\\`, `\n` (and `\"` in label values), no label name twice in a
//! sample, a number for each value).
#![no_main]

use std::collections::{BTreeMap, HashSet};

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tern_wasm::metrics::{Caps, Kind, MetricRegistry};

#[derive(Arbitrary, Debug)]
enum Name {
    Pool(u8),
    Any(String),
}

const NAMES: [&str; 8] = [
    "requests_total",
    "latency_seconds",
    "queue",
    "le",
    "model",
    "x:y",
    "_hidden",
    "tern_x",
];

impl Name {
    fn get(&self) -> String {
        match self {
            Name::Pool(i) => NAMES[usize::from(*i) % NAMES.len()].into(),
            Name::Any(s) => s.clone(),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Op {
    Family {
        owner: bool,
        name: Name,
        help: String,
        kind: u8,
        buckets: Vec<f64>,
    },
    Record {
        family: u8,
        labels: Vec<(Name, String)>,
        value: f64,
    },
    Set {
        family: u8,
        labels: Vec<(Name, String)>,
        value: f64,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    families: u8,
    series: u8,
    ops: Vec<Op>,
}

fuzz_target!(|input: Input| {
    let caps = Caps {
        families: usize::from(input.families % 8),
        series: usize::from(input.series % 8),
    };
    let registry = MetricRegistry::default();
    let mut owned: BTreeMap<u32, bool> = BTreeMap::new();
    for op in &input.ops {
        match op {
            Op::Family {
                owner,
                name,
                help,
                kind,
                buckets,
            } => {
                let kind = [Kind::Counter, Kind::Gauge, Kind::Histogram][usize::from(*kind % 3)];
                let owner_name = if *owner { "a" } else { "b" };
                if let Ok(id) = registry.family(owner_name, caps, &name.get(), help, kind, buckets)
                {
                    owned.entry(id).or_insert(*owner);
                }
            }
            Op::Record {
                family,
                labels,
                value,
            } => {
                let labels = labels.iter().map(|(k, v)| (k.get(), v.clone())).collect();
                let _ = registry.record(u32::from(*family % 8), labels, *value, caps.series);
            }
            Op::Set {
                family,
                labels,
                value,
            } => {
                let labels = labels.iter().map(|(k, v)| (k.get(), v.clone())).collect();
                let _ = registry.set(u32::from(*family % 8), labels, *value, caps.series);
            }
        }
    }
    for owner in [true, false] {
        assert!(owned.values().filter(|&&o| o == owner).count() <= caps.families);
    }
    check_page(&registry.render(), caps.series);
});

/// Prometheus' text format, as its parser reads it.
fn check_page(page: &str, max_series: usize) {
    let mut series: BTreeMap<String, HashSet<String>> = BTreeMap::new();
    let mut family = String::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            assert!(tern_core::prometheus::valid_name(name), "{line:?}");
            check_escapes(help, false, line);
            family = name.to_string();
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("a kind");
            assert_eq!(name, family);
            assert!(["counter", "gauge", "histogram"].contains(&kind));
            continue;
        }
        let (name, rest) = line
            .find(['{', ' '])
            .map(|i| line.split_at(i))
            .unwrap_or_else(|| panic!("no value: {line:?}"));
        assert!(tern_core::prometheus::valid_name(name), "{line:?}");
        assert!(
            name.starts_with(&family),
            "{line:?} outside family {family}"
        );
        let (labels, value) = match rest.strip_prefix('{') {
            Some(rest) => {
                let end = label_block_end(rest, line);
                (&rest[..end], &rest[end + 1..])
            }
            None => ("", rest),
        };
        let value = value
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("{line:?}"));
        assert!(value.parse::<f64>().is_ok(), "value {value:?} in {line:?}");
        let mut names = HashSet::new();
        let mut without_le = Vec::new();
        for pair in split_pairs(labels) {
            let (k, _) = pair.split_once('=').expect("k=v");
            assert!(
                tern_core::prometheus::valid_name(k),
                "label {k:?} in {line:?}"
            );
            assert!(names.insert(k.to_string()), "label {k:?} twice in {line:?}");
            if k != "le" {
                without_le.push(pair.to_string());
            }
        }
        series
            .entry(family.clone())
            .or_default()
            .insert(without_le.join(","));
    }
    for (f, s) in series {
        assert!(s.len() <= max_series, "{f}: {} label sets", s.len());
    }
}

/// Where the label block (after `{`) ends: its `}` outside a quoted value.
fn label_block_end(s: &str, line: &str) -> usize {
    let mut quoted = false;
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '\\' if quoted => {
                let (_, e) = chars.next().expect("escape");
                assert!(matches!(e, '\\' | '"' | 'n'), "escape \\{e} in {line:?}");
            }
            '\n' => panic!("newline in {line:?}"),
            '}' if !quoted => return i,
            _ => {}
        }
    }
    panic!("unterminated labels: {line:?}")
}

/// The `k="v"` pairs of a label block.
fn split_pairs(block: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut quoted, mut escaped, mut start) = (false, false, 0);
    for (i, c) in block.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                out.push(&block[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < block.len() {
        out.push(&block[start..]);
    }
    out
}

/// HELP text: only `\\` and `\n` escapes.
fn check_escapes(s: &str, _quotes: bool, line: &str) {
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let e = chars.next();
            assert!(
                matches!(e, Some('\\' | 'n')),
                "HELP escape {e:?} in {line:?}"
            );
        }
    }
}
