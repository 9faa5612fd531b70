//! Custom metric families that plugins declare through the `host`
//! interface (counters, gauges, histograms with labels). They live in the
//! [`MetricRegistry`] of the server's plugin telemetry and render in
//! Prometheus text format for the metrics endpoint.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

use tern_core::error::{Error, Result};

/// Kind of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down, can be set.
    Gauge,
    /// Observations counted into buckets.
    Histogram,
}

type Labels = Vec<(String, String)>;

#[derive(Debug, Default, Clone)]
struct Series {
    value: f64,
    buckets: Vec<u64>,
    count: u64,
}

#[derive(Debug)]
struct Family {
    name: String,
    /// The plugin model that declared it first (whose cap it counts against).
    owner: String,
    help: String,
    kind: Kind,
    bounds: Vec<f64>,
    series: BTreeMap<Labels, Series>,
}

/// How many metric families and label sets one plugin model may create
/// (model parameters `max_metric_families`, `max_metric_series`).
#[derive(Debug, Clone, Copy)]
pub struct Caps {
    /// Families a plugin model may declare.
    pub families: usize,
    /// Label sets (series) per family.
    pub series: usize,
}

impl Default for Caps {
    fn default() -> Self {
        Caps {
            families: 64,
            series: 1000,
        }
    }
}

/// The metric families plugins declared, by handle (their index).
#[derive(Debug, Default)]
pub struct MetricRegistry {
    families: Mutex<Vec<Family>>,
}

use tern_core::prometheus::{self as text, valid_name};

impl MetricRegistry {
    /// Declares a family for plugin model `owner` (or returns the existing
    /// one of the same name and kind), within `caps`.
    pub fn family(
        &self,
        owner: &str,
        caps: Caps,
        name: &str,
        help: &str,
        kind: Kind,
        buckets: &[f64],
    ) -> Result<u32> {
        if !valid_name(name) {
            return Err(Error::invalid_arg(format!(
                "metric name '{name}' is not a valid Prometheus name"
            )));
        }
        if name.starts_with("nv_") || name.starts_with("tern_") {
            return Err(Error::invalid_arg(format!(
                "metric name '{name}': the prefixes 'nv_' and 'tern_' are reserved for the server"
            )));
        }
        let mut bounds: Vec<f64> = buckets.iter().copied().filter(|b| b.is_finite()).collect();
        bounds.sort_by(f64::total_cmp);
        bounds.dedup();
        let mut r = self
            .families
            .lock()
            .expect("metrics lock poisoned: nothing panics while holding it");
        if let Some(i) = r.iter().position(|f| f.name == name) {
            if r[i].kind != kind {
                return Err(Error::new(
                    tern_core::error::Code::AlreadyExists,
                    format!("metric '{name}' already exists as a {:?}", r[i].kind),
                ));
            }
            return Ok(i as u32);
        }
        if r.iter().filter(|f| f.owner == owner).count() >= caps.families {
            return Err(Error::invalid_arg(format!(
                "metric '{name}': model '{owner}' already declared {} metric families, its limit (parameter max_metric_families)",
                caps.families
            )));
        }
        r.push(Family {
            owner: owner.into(),
            name: name.into(),
            help: help.into(),
            kind,
            bounds,
            series: BTreeMap::new(),
        });
        Ok(r.len() as u32 - 1)
    }

    fn with_series(
        &self,
        id: u32,
        labels: Labels,
        max_series: usize,
        f: impl FnOnce(&Family, &mut Series) -> Result<()>,
    ) -> Result<()> {
        for (k, _) in &labels {
            if !valid_name(k) || k.contains(':') {
                return Err(Error::invalid_arg(format!(
                    "metric label '{k}' is not a valid label name"
                )));
            }
        }
        let mut r = self
            .families
            .lock()
            .expect("metrics lock poisoned: nothing panics while holding it");
        let fam = r
            .get_mut(id as usize)
            .ok_or_else(|| Error::not_found(format!("no metric family with handle {id}")))?;
        let mut labels = labels;
        labels.sort();
        // The text format allows a label name once per sample, and a
        // histogram's buckets add `le` themselves.
        if let Some(w) = labels.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Error::invalid_arg(format!(
                "metric '{}': label '{}' is given more than once",
                fam.name, w[0].0
            )));
        }
        if fam.kind == Kind::Histogram && labels.iter().any(|(k, _)| k == "le") {
            return Err(Error::invalid_arg(format!(
                "metric '{}': the label 'le' is reserved for a histogram's buckets",
                fam.name
            )));
        }
        let n = fam.bounds.len();
        let (mut series, new) = match fam.series.remove(&labels) {
            Some(s) => (s, false),
            None if fam.series.len() >= max_series => {
                return Err(Error::invalid_arg(format!(
                    "metric '{}' already has {max_series} label sets, its limit (parameter max_metric_series); this one was not recorded",
                    fam.name
                )))
            }
            None => (
                Series {
                    buckets: vec![0; n],
                    ..Default::default()
                },
                true,
            ),
        };
        let result = f(fam, &mut series);
        // A refused value creates no series.
        if result.is_ok() || !new {
            fam.series.insert(labels, series);
        }
        result
    }

    /// Counter: add (>= 0); gauge: add; histogram: observe.
    pub fn record(&self, id: u32, labels: Labels, value: f64, max_series: usize) -> Result<()> {
        self.with_series(id, labels, max_series, |fam, s| {
            match fam.kind {
                Kind::Counter if value < 0.0 || value.is_nan() => {
                    return Err(Error::invalid_arg(format!(
                        "counter '{}' cannot decrease (got {value})",
                        fam.name
                    )))
                }
                Kind::Counter | Kind::Gauge => s.value += value,
                Kind::Histogram => {
                    s.value += value;
                    s.count += 1;
                    for (b, bound) in s.buckets.iter_mut().zip(&fam.bounds) {
                        if value <= *bound {
                            *b += 1;
                        }
                    }
                }
            }
            Ok(())
        })
    }

    /// Gauge only: set.
    pub fn set(&self, id: u32, labels: Labels, value: f64, max_series: usize) -> Result<()> {
        self.with_series(id, labels, max_series, |fam, s| {
            if fam.kind != Kind::Gauge {
                return Err(Error::invalid_arg(format!(
                    "metric '{}' is a {:?}; only gauges can be set",
                    fam.name, fam.kind
                )));
            }
            s.value = value;
            Ok(())
        })
    }

    /// All plugin metric families in Prometheus text format.
    pub fn render(&self) -> String {
        let r = self
            .families
            .lock()
            .expect("metrics lock poisoned: nothing panics while holding it");
        let mut out = String::new();
        for f in r.iter() {
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            text::header(&mut out, &f.name, kind, &f.help);
            for (labels, s) in &f.series {
                if f.kind == Kind::Histogram {
                    for (b, bound) in s.buckets.iter().zip(&f.bounds) {
                        let _ = writeln!(
                            out,
                            "{}_bucket{} {b}",
                            f.name,
                            label_str(labels, Some(("le", bound.to_string())))
                        );
                    }
                    let _ = writeln!(
                        out,
                        "{}_bucket{} {}",
                        f.name,
                        label_str(labels, Some(("le", "+Inf".into()))),
                        s.count
                    );
                    let _ = writeln!(out, "{}_sum{} {}", f.name, label_str(labels, None), s.value);
                    let _ = writeln!(
                        out,
                        "{}_count{} {}",
                        f.name,
                        label_str(labels, None),
                        s.count
                    );
                } else {
                    let _ = writeln!(out, "{}{} {}", f.name, label_str(labels, None), s.value);
                }
            }
        }
        out
    }
}

fn label_str(labels: &Labels, extra: Option<(&str, String)>) -> String {
    let mut pairs: Vec<(&str, &str)> = labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if let Some((k, v)) = &extra {
        pairs.push((k, v));
    }
    text::labels(&pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(k: &str, v: &str) -> Labels {
        vec![(k.to_string(), v.to_string())]
    }

    #[test]
    fn plugins_cannot_create_unbounded_families_or_series() {
        let r = MetricRegistry::default();
        let caps = Caps {
            families: 2,
            series: 3,
        };
        let a = r.family("p", caps, "p_a", "", Kind::Gauge, &[]).unwrap();
        r.family("p", caps, "p_b", "", Kind::Gauge, &[]).unwrap();
        let e = r
            .family("p", caps, "p_c", "", Kind::Gauge, &[])
            .unwrap_err();
        assert!(e.message.contains("max_metric_families"), "{e}");
        // Another plugin has its own allowance.
        r.family("q", caps, "q_a", "", Kind::Gauge, &[]).unwrap();
        for i in 0..3 {
            r.set(a, l("k", &i.to_string()), 1.0, caps.series).unwrap();
        }
        let e = r.set(a, l("k", "3"), 1.0, caps.series).unwrap_err();
        assert!(e.message.contains("max_metric_series"), "{e}");
        r.set(a, l("k", "0"), 2.0, caps.series).unwrap();
        assert!(!r.render().contains("k=\"3\""));
    }

    /// Found by the `plugin_metrics` fuzz target: a label name given twice,
    /// or `le` on a histogram, rendered a sample with a label twice, which
    /// Prometheus refuses (the whole page fails to scrape); a backslash in
    /// HELP was an invalid escape.
    #[test]
    fn samples_never_repeat_a_label_and_help_is_escaped() {
        let r = MetricRegistry::default();
        let caps = Caps::default();
        let h = r
            .family("p", caps, "lat", "a\\b", Kind::Histogram, &[1.0])
            .unwrap();
        let c = r.family("p", caps, "n", "", Kind::Counter, &[]).unwrap();
        let e = r.record(h, l("le", "x"), 0.5, 10).unwrap_err();
        assert!(e.message.contains("'le' is reserved"), "{}", e.message);
        let twice = [l("a", "1"), l("a", "2")].concat();
        let e = r.record(c, twice, 1.0, 10).unwrap_err();
        assert!(e.message.contains("more than once"), "{}", e.message);
        let page = r.render();
        assert!(page.contains("# HELP lat a\\\\b\n"), "{page}");
        assert!(
            !page.contains("n{"),
            "refused values create no series: {page}"
        );
    }

    #[test]
    fn families_series_and_rendering() {
        let r = MetricRegistry::default();
        let c = r
            .family(
                "p",
                Caps::default(),
                "test_requests_total",
                "Requests.",
                Kind::Counter,
                &[],
            )
            .unwrap();
        assert_eq!(
            r.family(
                "p",
                Caps::default(),
                "test_requests_total",
                "again",
                Kind::Counter,
                &[]
            )
            .unwrap(),
            c
        );
        assert!(r
            .family(
                "p",
                Caps::default(),
                "test_requests_total",
                "x",
                Kind::Gauge,
                &[]
            )
            .is_err());
        assert!(r
            .family(
                "p",
                Caps::default(),
                "nv_inference_count",
                "x",
                Kind::Gauge,
                &[]
            )
            .is_err());
        assert!(r
            .family("p", Caps::default(), "bad name", "x", Kind::Gauge, &[])
            .is_err());
        r.record(c, l("model", "a"), 2.0, 1000).unwrap();
        r.record(c, l("model", "a"), 1.0, 1000).unwrap();
        assert!(r.record(c, vec![], -1.0, 1000).is_err());
        let g = r
            .family(
                "p",
                Caps::default(),
                "test_queue_depth",
                "Depth.",
                Kind::Gauge,
                &[],
            )
            .unwrap();
        r.set(g, vec![], 5.0, 1000).unwrap();
        r.record(g, vec![], -2.0, 1000).unwrap();
        assert!(r.set(c, vec![], 1.0, 1000).is_err());
        let h = r
            .family(
                "p",
                Caps::default(),
                "test_latency_ms",
                "Latency.",
                Kind::Histogram,
                &[10.0, 1.0],
            )
            .unwrap();
        r.record(h, vec![], 0.5, 1000).unwrap();
        r.record(h, vec![], 5.0, 1000).unwrap();
        let text = r.render();
        assert!(
            text.contains("test_requests_total{model=\"a\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("test_queue_depth 3\n"), "{text}");
        assert!(
            text.contains("test_latency_ms_bucket{le=\"1\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("test_latency_ms_bucket{le=\"10\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("test_latency_ms_count 2\n"), "{text}");
        assert!(r.record(999, vec![], 1.0, 1000).is_err());
    }
}
