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
    help: String,
    kind: Kind,
    bounds: Vec<f64>,
    series: BTreeMap<Labels, Series>,
}

/// The metric families plugins declared, by handle (their index).
#[derive(Debug, Default)]
pub struct MetricRegistry {
    families: Mutex<Vec<Family>>,
}

use tern_core::prometheus::{self as text, valid_name};

impl MetricRegistry {
    /// Declares a family (or returns the existing one of the same name and kind).
    pub fn family(&self, name: &str, help: &str, kind: Kind, buckets: &[f64]) -> Result<u32> {
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
        let mut r = self.families.lock().expect("metrics lock");
        if let Some(i) = r.iter().position(|f| f.name == name) {
            if r[i].kind != kind {
                return Err(Error::new(
                    tern_core::error::Code::AlreadyExists,
                    format!("metric '{name}' already exists as a {:?}", r[i].kind),
                ));
            }
            return Ok(i as u32);
        }
        r.push(Family {
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
        f: impl FnOnce(&Family, &mut Series) -> Result<()>,
    ) -> Result<()> {
        for (k, _) in &labels {
            if !valid_name(k) || k.contains(':') {
                return Err(Error::invalid_arg(format!(
                    "metric label '{k}' is not a valid label name"
                )));
            }
        }
        let mut r = self.families.lock().expect("metrics lock");
        let fam = r
            .get_mut(id as usize)
            .ok_or_else(|| Error::not_found(format!("no metric family with handle {id}")))?;
        let mut labels = labels;
        labels.sort();
        let n = fam.bounds.len();
        let mut series = fam.series.remove(&labels).unwrap_or_else(|| Series {
            buckets: vec![0; n],
            ..Default::default()
        });
        let result = f(fam, &mut series);
        fam.series.insert(labels, series);
        result
    }

    /// Counter: add (>= 0); gauge: add; histogram: observe.
    pub fn record(&self, id: u32, labels: Labels, value: f64) -> Result<()> {
        self.with_series(id, labels, |fam, s| {
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
    pub fn set(&self, id: u32, labels: Labels, value: f64) -> Result<()> {
        self.with_series(id, labels, |fam, s| {
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
        let r = self.families.lock().expect("metrics lock");
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
    fn families_series_and_rendering() {
        let r = MetricRegistry::default();
        let c = r
            .family("test_requests_total", "Requests.", Kind::Counter, &[])
            .unwrap();
        assert_eq!(
            r.family("test_requests_total", "again", Kind::Counter, &[])
                .unwrap(),
            c
        );
        assert!(r
            .family("test_requests_total", "x", Kind::Gauge, &[])
            .is_err());
        assert!(r
            .family("nv_inference_count", "x", Kind::Gauge, &[])
            .is_err());
        assert!(r.family("bad name", "x", Kind::Gauge, &[]).is_err());
        r.record(c, l("model", "a"), 2.0).unwrap();
        r.record(c, l("model", "a"), 1.0).unwrap();
        assert!(r.record(c, vec![], -1.0).is_err());
        let g = r
            .family("test_queue_depth", "Depth.", Kind::Gauge, &[])
            .unwrap();
        r.set(g, vec![], 5.0).unwrap();
        r.record(g, vec![], -2.0).unwrap();
        assert!(r.set(c, vec![], 1.0).is_err());
        let h = r
            .family("test_latency_ms", "Latency.", Kind::Histogram, &[10.0, 1.0])
            .unwrap();
        r.record(h, vec![], 0.5).unwrap();
        r.record(h, vec![], 5.0).unwrap();
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
        assert!(r.record(999, vec![], 1.0).is_err());
    }
}
