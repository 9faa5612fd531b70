//! Prometheus text exposition format (0.0.4): family headers, label
//! escaping and sample lines. Every family the server exposes is written
//! through here.

use std::fmt::Write;

/// Escapes a label value.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Label names that prometheus-cpp appends after a sample's own labels
/// instead of sorting them in: a histogram bucket's `le` and a summary's
/// `quantile`.
const TRAILING: [&str; 2] = ["le", "quantile"];

/// `{k="v",...}` for the labels (empty string when there are none), in the
/// order prometheus-cpp (so Triton) prints them: sorted by label name, with
/// `le` / `quantile` last. Scrapers and scripts that match the text rely on it.
pub fn labels<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let mut sorted: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(k, v)| (k.as_ref(), v.as_ref()))
        .collect();
    // Stable: equal names (which callers do not produce) keep their order.
    sorted.sort_by_key(|(k, _)| (TRAILING.contains(k), *k));
    let parts: Vec<String> = sorted
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// Writes `# HELP` and `# TYPE` for a family.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    // The text format's HELP escapes: a backslash is `\\` (a lone one
    // makes Prometheus refuse the page); lines are joined.
    let help = help.replace('\\', "\\\\").replace('\n', " ");
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Writes one sample line; `labels` is the output of [`labels`].
pub fn sample(out: &mut String, name: &str, labels: &str, value: f64) {
    let _ = writeln!(out, "{name}{labels} {value}");
}

/// Something that renders its own metric families (a backend's counters,
/// the memory pools): the metrics page asks each owner instead of reading
/// its internals.
pub trait Families: Send + Sync {
    /// Appends the families, with their headers, in the text format.
    fn render(&self, out: &mut String);
}

/// Whether `n` is a valid metric or label name.
pub fn valid_name(n: &str) -> bool {
    let mut chars = n.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_and_escapes() {
        let mut out = String::new();
        header(&mut out, "x_total", "counter", "Things.\nMore.");
        sample(
            &mut out,
            "x_total",
            &labels(&[("model", "a\"b\\c\nd")]),
            3.0,
        );
        sample(&mut out, "x_total", &labels::<&str, &str>(&[]), 0.5);
        assert_eq!(
            out,
            "# HELP x_total Things. More.\n# TYPE x_total counter\nx_total{model=\"a\\\"b\\\\c\\nd\"} 3\nx_total 0.5\n"
        );
        assert!(valid_name("nv_x:y") && !valid_name("9x") && !valid_name("a-b"));
    }

    #[test]
    fn labels_are_sorted_by_name_as_prometheus_cpp_prints_them() {
        assert_eq!(
            labels(&[("version", "1"), ("model", "simple")]),
            "{model=\"simple\",version=\"1\"}"
        );
        assert_eq!(
            labels(&[("model", "m"), ("version", "2"), ("reason", "REJECTED")]),
            "{model=\"m\",reason=\"REJECTED\",version=\"2\"}"
        );
        // Tags sort in with the rest; a summary's quantile and a bucket's le go last.
        assert_eq!(
            labels(&[
                ("quantile", "0.5"),
                ("version", "1"),
                ("team", "edge"),
                ("model", "m"),
                ("area", "x"),
            ]),
            "{area=\"x\",model=\"m\",team=\"edge\",version=\"1\",quantile=\"0.5\"}"
        );
        assert_eq!(
            labels(&[("route", "a"), ("le", "+Inf"), ("code", "200")]),
            "{code=\"200\",route=\"a\",le=\"+Inf\"}"
        );
        assert_eq!(labels(&[("gpu_uuid", "GPU-1")]), "{gpu_uuid=\"GPU-1\"}");
    }
}
