//! NaN and infinities in request and response JSON, as Triton has them.
//!
//! Triton parses with rapidjson's `kParseNanAndInfFlag`, which reads the bare
//! tokens `NaN`, `Inf`, `Infinity`, `-Inf` and `-Infinity` as numbers, and
//! writes tensor data with `kWriteNanAndInfFlag`: `NaN`, `Infinity`,
//! `-Infinity`. serde_json knows none of them, so a request that fails to
//! parse is [rewritten](rewrite) with each token outside a string replaced by
//! a sentinel string the decoder then reads as the number, and float data
//! with a non-finite value is [written](write_floats) element by element.

use serde::Serialize;
use serde_json::Value;

/// Sentinel of `NaN` (and `-NaN`). It starts with NUL, which a JSON string
/// can only hold as the escape `\u0000`: [`rewrite`] declines a text that has
/// one, so a rewritten document holds no string that looks like a sentinel.
const NAN: &str = "\0NaN";
/// Sentinel of `Inf` and `Infinity`.
const INF: &str = "\0Inf";
/// Sentinel of `-Inf` and `-Infinity`.
const NEG_INF: &str = "\0-Inf";

/// The tokens, longest first, and the JSON text of their sentinels.
const TOKENS: [(&[u8], &[u8]); 6] = [
    (b"-Infinity", br#""\u0000-Inf""#),
    (b"-Inf", br#""\u0000-Inf""#),
    (b"-NaN", br#""\u0000NaN""#),
    (b"Infinity", br#""\u0000Inf""#),
    (b"Inf", br#""\u0000Inf""#),
    (b"NaN", br#""\u0000NaN""#),
];

/// Whether `b` may continue a token or number (so that no token starts or
/// ends next to it).
fn word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'+' | b'-')
}

/// `text` with every bare NaN/infinity token outside strings replaced by its
/// sentinel string; `None` when it has no such token, or when a string in it
/// holds a NUL escape (`\u0000`) and could be taken for a sentinel.
pub fn rewrite(text: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() + 64);
    let mut changed = false;
    let mut i = 0;
    // The last non-whitespace byte written, kept as we go: looking it up from
    // the end of `out` at every byte was quadratic in a run of whitespace.
    let mut last: Option<u8> = None;
    while i < text.len() {
        let b = text[i];
        if b == b'"' {
            let start = i;
            i += 1;
            while i < text.len() {
                match text[i] {
                    b'\\' => {
                        if text[i + 1..].starts_with(b"u0000") {
                            return None;
                        }
                        i += 2;
                    }
                    b'"' => {
                        i += 1;
                        break;
                    }
                    _ => i += 1,
                }
            }
            i = i.min(text.len());
            out.extend_from_slice(&text[start..i]);
            last = out.last().copied();
            continue;
        }
        // Only where a value may stand (not as an object key).
        let value_position = matches!(last, Some(b'[' | b',' | b':') | None);
        if matches!(b, b'-' | b'I' | b'N') && value_position && (i == 0 || !word_byte(text[i - 1]))
        {
            let rest = &text[i..];
            let token = TOKENS.iter().find(|(t, _)| {
                rest.starts_with(t) && rest.get(t.len()).is_none_or(|&n| !word_byte(n))
            });
            if let Some((t, sentinel)) = token {
                out.extend_from_slice(sentinel);
                last = out.last().copied();
                i += t.len();
                changed = true;
                continue;
            }
        }
        out.push(b);
        if !b.is_ascii_whitespace() {
            last = Some(b);
        }
        i += 1;
    }
    changed.then_some(out)
}

/// The number a sentinel string stands for.
pub fn of_str(s: &str) -> Option<f64> {
    match s {
        NAN => Some(f64::NAN),
        INF => Some(f64::INFINITY),
        NEG_INF => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// The number a sentinel value stands for.
pub fn of_value(v: &Value) -> Option<f64> {
    v.as_str().and_then(of_str)
}

/// `v` for an error message: a sentinel as its token, anything else as JSON.
pub fn show(v: &Value) -> String {
    match of_value(v) {
        Some(x) if x.is_nan() => "NaN".into(),
        Some(x) if x > 0.0 => "Infinity".into(),
        Some(_) => "-Infinity".into(),
        None => v.to_string(),
    }
}

/// Writes `values` as a JSON array: all finite as serde_json writes them,
/// otherwise element by element with Triton's `NaN`, `Infinity` and
/// `-Infinity` for the non-finite ones.
pub fn write_floats<T>(out: &mut Vec<u8>, values: &[T]) -> serde_json::Result<()>
where
    T: Serialize + Copy + Into<f64>,
{
    if values.iter().all(|&x| x.into().is_finite()) {
        return serde_json::to_writer(out, values);
    }
    out.push(b'[');
    for (i, &x) in values.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let f: f64 = x.into();
        if f.is_nan() {
            out.extend_from_slice(b"NaN");
        } else if f == f64::INFINITY {
            out.extend_from_slice(b"Infinity");
        } else if f == f64::NEG_INFINITY {
            out.extend_from_slice(b"-Infinity");
        } else {
            serde_json::to_writer(&mut *out, &x)?;
        }
    }
    out.push(b']');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(text: &str) -> Option<String> {
        rewrite(text.as_bytes()).map(|v| String::from_utf8(v).unwrap())
    }

    #[test]
    fn rewrites_bare_tokens_only() {
        let text =
            r#"{"a":[NaN,Inf,-Inf,Infinity,-Infinity,-NaN,1e5,-2],"s":"NaN \" Inf","t":true}"#;
        let out = rewritten(text).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        let a: Vec<Option<f64>> = v["a"].as_array().unwrap().iter().map(of_value).collect();
        assert!(a[0].unwrap().is_nan() && a[5].unwrap().is_nan());
        assert_eq!(a[1..5], [INF, NEG_INF, INF, NEG_INF].map(of_str));
        assert_eq!(a[6..], [None, None]);
        assert_eq!(v["s"], "NaN \" Inf", "strings are left as they are");
        assert_eq!(show(&v["a"][0]), "NaN");
        assert_eq!(show(&v["a"][2]), "-Infinity");
        assert_eq!(show(&v["s"]), r#""NaN \" Inf""#);
    }

    #[test]
    fn long_whitespace_is_linear() {
        // 4 MiB of whitespace before a token: quadratic, this took minutes.
        let mut text = vec![b' '; 4 << 20];
        text.extend_from_slice(b"[NaN]");
        assert!(rewrite(&text).is_some());
        let spaced: Vec<u8> = b"[1, "
            .iter()
            .copied()
            .chain(std::iter::repeat_n(b' ', 1 << 20))
            .chain(*b"-Infinity]")
            .collect();
        assert!(rewrite(&spaced).is_some());
    }

    #[test]
    fn declines_what_it_cannot_rewrite_safely() {
        // Nothing to rewrite.
        assert_eq!(rewritten(r#"{"a":[1,"NaN"]}"#), None);
        // Not whole tokens.
        assert_eq!(rewritten("[NaNa,Infinit,xInf,1Inf,Info]"), None);
        // Not in a value position (an object key).
        assert_eq!(rewritten(r#"{NaN:1}"#), None);
        // A NUL escape: such a string could pass for a sentinel.
        assert_eq!(rewritten(r#"["\u0000NaN",NaN]"#), None);
        // Other escapes are fine, and an unterminated string ends the text.
        assert_eq!(
            rewritten(r#"["\n\\",NaN,"x\"#).as_deref(),
            Some(r#"["\n\\","\u0000NaN","x\"#)
        );
    }

    #[test]
    fn writes_non_finite_as_triton() {
        let mut out = Vec::new();
        write_floats(&mut out, &[1.5f32, 0.1]).unwrap();
        assert_eq!(out, b"[1.5,0.1]");
        out.clear();
        write_floats(&mut out, &[f32::NAN, 0.1, f32::INFINITY, f32::NEG_INFINITY]).unwrap();
        assert_eq!(out, b"[NaN,0.1,Infinity,-Infinity]");
        out.clear();
        write_floats(&mut out, &[-0.25f64, f64::NAN]).unwrap();
        assert_eq!(out, b"[-0.25,NaN]");
        out.clear();
        write_floats::<f64>(&mut out, &[]).unwrap();
        assert_eq!(out, b"[]");
    }
}
