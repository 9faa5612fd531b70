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

/// `{k="v",...}` for the labels (empty string when there are none).
pub fn labels<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}=\"{}\"", k.as_ref(), escape(v.as_ref())))
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// Writes `# HELP` and `# TYPE` for a family.
pub fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {}", help.replace('\n', " "));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Writes one sample line; `labels` is the output of [`labels`].
pub fn sample(out: &mut String, name: &str, labels: &str, value: f64) {
    let _ = writeln!(out, "{name}{labels} {value}");
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
}
