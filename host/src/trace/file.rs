//! Triton's trace files (`--trace-config mode=triton`, the default): each
//! finished trace tree as Triton writes it — one JSON object per timestamp
//! or tensor, the model header just before `REQUEST_START` — gathered per
//! setting and written to `<file>.<n>` every `log_frequency` traces, or
//! appended to `<file>` (one JSON array, closed at shutdown) when the
//! setting ends.

use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use tern_core::trace::{Entry, Record};
use tern_core::{DataType, Tensor};

use super::clock::Clock;

/// One trace file name, shared by every setting that writes to it: the
/// numbered files' next index and the plain file's state.
pub struct TraceFile {
    path: String,
    index: AtomicU32,
    plain: Mutex<Plain>,
}

#[derive(Default)]
enum Plain {
    /// Not written yet (created, truncated, on the first write).
    #[default]
    Unopened,
    Open(File),
    /// Closed at shutdown: later writes are dropped.
    Closed,
}

impl TraceFile {
    /// The file `path` (nothing is created until traces are written).
    pub fn new(path: &str) -> TraceFile {
        TraceFile {
            path: path.to_string(),
            index: AtomicU32::new(0),
            plain: Mutex::new(Plain::Unopened),
        }
    }

    /// The file's name as the settings show it.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Writes `traces` (rendered, comma-separated) as one JSON array to
    /// `<file>.<index>`, the next index.
    pub fn save_numbered(&self, traces: &str) {
        let name = format!(
            "{}.{}",
            self.path,
            self.index.fetch_add(1, Ordering::Relaxed)
        );
        if let Err(e) = std::fs::write(&name, format!("[{traces}]")) {
            tracing::warn!("cannot write trace file '{name}': {e}");
        }
    }

    /// Appends `traces` to the plain file's array (opening it with `[` first).
    pub fn append(&self, traces: &str) {
        let mut plain = self.plain.lock().unwrap_or_else(|p| p.into_inner());
        let (file, sep) = match &mut *plain {
            Plain::Closed => {
                tracing::warn!("trace file '{}' is closed; traces dropped", self.path);
                return;
            }
            Plain::Open(f) => (f, ","),
            Plain::Unopened => match File::create(PathBuf::from(&self.path)) {
                Ok(f) => {
                    *plain = Plain::Open(f);
                    let Plain::Open(f) = &mut *plain else {
                        unreachable!("just opened")
                    };
                    (f, "[")
                }
                Err(e) => {
                    tracing::warn!("cannot create trace file '{}': {e}", self.path);
                    return;
                }
            },
        };
        if let Err(e) = file.write_all(format!("{sep}{traces}").as_bytes()) {
            tracing::warn!("cannot write trace file '{}': {e}", self.path);
        }
    }

    /// Closes the plain file's array (`]`); later traces are dropped.
    pub fn close(&self) {
        let mut plain = self.plain.lock().unwrap_or_else(|p| p.into_inner());
        if let Plain::Open(f) = &mut *plain {
            if let Err(e) = f.write_all(b"]").and_then(|()| f.sync_data()) {
                tracing::warn!("cannot close trace file '{}': {e}", self.path);
            }
        }
        *plain = Plain::Closed;
    }
}

/// A finished trace tree as Triton's trace file spells it: the objects of
/// each record in the order recorded, comma-separated, without brackets.
pub fn render(tree: &[Record], clock: &Clock) -> String {
    let mut out = String::new();
    for record in tree {
        for entry in &record.entries {
            if !out.is_empty() {
                out.push(',');
            }
            match entry {
                Entry::Timestamp(name, at) => {
                    if *name == "REQUEST_START" {
                        header(&mut out, record);
                        out.push(',');
                    }
                    let _ = write!(
                        out,
                        r#"{{"id":{},"timestamps":[{{"name":"{name}","ns":{}}}]}}"#,
                        record.id,
                        clock.monotonic_ns(*at)
                    );
                }
                Entry::Tensor(activity, t) => {
                    // Triton's key order: name, data, shape, dtype.
                    let s = |v: String| serde_json::Value::from(v);
                    let shape = t.shape.iter().map(i64::to_string).collect::<Vec<_>>();
                    let _ = write!(
                        out,
                        r#"{{"id":{},"activity":"{activity}","tensor":{{"name":{},"data":{},"shape":{},"dtype":"{}"}}}}"#,
                        record.id,
                        s(t.name.clone()),
                        s(tensor_data(t)),
                        s(shape.join(",")),
                        t.dtype.wire_name()
                    );
                }
            }
        }
    }
    out
}

/// `{"id":..,"model_name":..,"model_version":..[,"request_id":..][,"parent_id":..]}`.
fn header(out: &mut String, r: &Record) {
    let _ = write!(
        out,
        r#"{{"id":{},"model_name":{},"model_version":{}"#,
        r.id,
        serde_json::Value::from(r.model_name.as_str()),
        r.model_version
    );
    if !r.request_id.is_empty() {
        let _ = write!(
            out,
            r#","request_id":{}"#,
            serde_json::Value::from(r.request_id.as_str())
        );
    }
    if r.parent_id != 0 {
        let _ = write!(out, r#","parent_id":{}"#, r.parent_id);
    }
    out.push('}');
}

/// A tensor's elements comma-separated as Triton writes them (numbers as
/// C++ streams print them, strings in double quotes, booleans as 0/1).
fn tensor_data(t: &Tensor) -> String {
    let d = &t.data[..];
    let fixed = |n: usize| d.chunks_exact(n);
    let values: Vec<String> = match t.dtype {
        DataType::Bool => d.iter().map(|b| u8::from(*b != 0).to_string()).collect(),
        DataType::Uint8 => d.iter().map(u8::to_string).collect(),
        DataType::Int8 => d.iter().map(|b| (*b as i8).to_string()).collect(),
        DataType::Uint16 => fixed(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]).to_string())
            .collect(),
        DataType::Int16 => fixed(2)
            .map(|c| i16::from_le_bytes([c[0], c[1]]).to_string())
            .collect(),
        DataType::Uint32 => fixed(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap_or_default()).to_string())
            .collect(),
        DataType::Int32 => fixed(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap_or_default()).to_string())
            .collect(),
        DataType::Uint64 => fixed(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()).to_string())
            .collect(),
        DataType::Int64 => fixed(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()).to_string())
            .collect(),
        DataType::Fp16 => fixed(2)
            .map(|c| general(half::f16::from_le_bytes([c[0], c[1]]).to_f64()))
            .collect(),
        DataType::Bf16 => fixed(2)
            .map(|c| general(half::bf16::from_le_bytes([c[0], c[1]]).to_f64()))
            .collect(),
        DataType::Fp32 => fixed(4)
            .map(|c| general(f32::from_le_bytes(c.try_into().unwrap_or_default()) as f64))
            .collect(),
        DataType::Fp64 => fixed(8)
            .map(|c| general(f64::from_le_bytes(c.try_into().unwrap_or_default())))
            .collect(),
        DataType::Bytes => tern_core::bytes_tensor::decode(d)
            .unwrap_or_default()
            .into_iter()
            .map(|e| format!("\"{}\"", String::from_utf8_lossy(e)))
            .collect(),
    };
    values.join(",")
}

/// `v` as C's `%g` (a C++ stream's default) prints it: 6 significant
/// digits, trailing zeros dropped, exponent form below 1e-4 or from 1e6.
fn general(v: f64) -> String {
    if !v.is_finite() {
        return if v.is_nan() {
            "nan".into()
        } else if v > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    if v == 0.0 {
        return if v.is_sign_negative() {
            "-0".into()
        } else {
            "0".into()
        };
    }
    let sci = format!("{v:.5e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa), exp.abs())
    } else {
        trim(&format!("{v:.*}", (5 - exp).max(0) as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use tern_core::trace::Level;

    #[test]
    fn numbers_print_as_a_cpp_stream_prints_them() {
        let cases = [
            (0.5, "0.5"),
            (1.0, "1"),
            (1.5, "1.5"),
            (100000.0, "100000"),
            (1234567.0, "1.23457e+06"),
            (0.0001, "0.0001"),
            (0.00001234, "1.234e-05"),
            (-2.25, "-2.25"),
            (1.0 / 3.0, "0.333333"),
            (f64::NAN, "nan"),
        ];
        for (v, s) in cases {
            assert_eq!(general(v), s, "{v}");
        }
    }

    #[test]
    fn a_tree_renders_as_tritons_records() {
        let clock = Clock::new();
        let at = Instant::now();
        let x = Tensor::new(
            "X",
            DataType::Fp32,
            vec![1, 2],
            [1.0f32, 0.5]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        let s = Tensor::new(
            "S",
            DataType::Bytes,
            vec![1],
            tern_core::bytes_tensor::encode([b"hi"]),
        );
        let record = |id, parent_id, entries| Record {
            id,
            parent_id,
            model_name: "m".into(),
            model_version: 1,
            request_id: if parent_id == 0 {
                "r".into()
            } else {
                String::new()
            },
            level: Level {
                timestamps: true,
                tensors: true,
            },
            entries,
            ..Default::default()
        };
        let tree = [
            record(2, 1, vec![Entry::Timestamp("REQUEST_START", at)]),
            record(
                1,
                0,
                vec![
                    Entry::Timestamp("HTTP_RECV_START", at),
                    Entry::Timestamp("REQUEST_START", at),
                    Entry::Tensor("TENSOR_QUEUE_INPUT", x),
                    Entry::Tensor("TENSOR_BACKEND_OUTPUT", s),
                ],
            ),
        ];
        let ns = clock.monotonic_ns(at);
        let json: serde_json::Value =
            serde_json::from_str(&format!("[{}]", render(&tree, &clock))).unwrap();
        let expected = serde_json::json!([
            {"id": 2, "model_name": "m", "model_version": 1, "parent_id": 1},
            {"id": 2, "timestamps": [{"name": "REQUEST_START", "ns": ns}]},
            {"id": 1, "timestamps": [{"name": "HTTP_RECV_START", "ns": ns}]},
            {"id": 1, "model_name": "m", "model_version": 1, "request_id": "r"},
            {"id": 1, "timestamps": [{"name": "REQUEST_START", "ns": ns}]},
            {"id": 1, "activity": "TENSOR_QUEUE_INPUT", "tensor": {"name": "X", "data": "1,0.5", "shape": "1,2", "dtype": "FP32"}},
            {"id": 1, "activity": "TENSOR_BACKEND_OUTPUT", "tensor": {"name": "S", "data": "\"hi\"", "shape": "1", "dtype": "BYTES"}},
        ]);
        assert_eq!(json, expected);
    }

    #[test]
    fn numbered_files_and_the_plain_files_array() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.json");
        let f = TraceFile::new(path.to_str().unwrap());
        f.save_numbered(r#"{"id":1}"#);
        f.save_numbered(r#"{"id":2}"#);
        f.append(r#"{"id":3}"#);
        f.append(r#"{"id":4}"#);
        f.close();
        f.append(r#"{"id":5}"#);
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(dir.path().join("t.json.0")), r#"[{"id":1}]"#);
        assert_eq!(read(dir.path().join("t.json.1")), r#"[{"id":2}]"#);
        assert_eq!(read(path), r#"[{"id":3},{"id":4}]"#);
    }
}
