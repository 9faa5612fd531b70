//! `magika_prep`: Magika's feature extraction (v2, as in the `magika` Python
//! package 1.0) as a plugin. `FILE` (BYTES, one file's raw content per batch
//! row) → `features` (INT32 `[rows, beg_size + end_size]`, the model's `bytes`
//! input) and `decided` (BYTES `[rows, 1]`): empty when the model must decide,
//! otherwise the label Magika gives without the model (`empty`, or `txt` /
//! `unknown` for files with too few meaningful bytes).
//!
//! The sizes come from the model's own `config.min.json` (copied from the
//! `magika` wheel into the version folder by `make`).

use tern_plugin::{export_model, Error, Model, ModelContext, Request, Response, Tensor};

/// The feature-extraction settings of a Magika model.
#[derive(Debug, Clone, PartialEq)]
struct Features {
    beg_size: usize,
    end_size: usize,
    block_size: usize,
    padding_token: i32,
    min_file_size_for_dl: usize,
}

/// What the preprocessing decided for one file.
#[derive(Debug, PartialEq)]
struct Extracted {
    features: Vec<i32>,
    /// The final label when the model is not needed.
    decided: Option<&'static str>,
}

/// Python's `bytes.strip()` whitespace: space, \t, \n, \v, \f, \r.
fn is_py_space(b: &u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

fn lstrip(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|c| !is_py_space(c)).unwrap_or(b.len());
    &b[start..]
}

fn rstrip(b: &[u8]) -> &[u8] {
    let end = b.iter().rposition(|c| !is_py_space(c)).map_or(0, |i| i + 1);
    &b[..end]
}

/// Magika's label for content too short for the model: `txt` if it is valid
/// UTF-8, `unknown` otherwise.
fn few_bytes_label(content: &[u8]) -> &'static str {
    if std::str::from_utf8(content).is_ok() {
        "txt"
    } else {
        "unknown"
    }
}

impl Features {
    fn from_config(json: &[u8]) -> Result<Features, Error> {
        let config: serde_json::Value = serde_json::from_slice(json)
            .map_err(|e| Error::invalid_arg(format!("config.min.json: {e}")))?;
        let field = |key: &str| {
            config
                .get(key)
                .and_then(serde_json::Value::as_u64)
                .ok_or_else(|| {
                    Error::invalid_arg(format!("config.min.json: '{key}' missing or not a count"))
                })
        };
        if field("mid_size")? != 0 || config.get("use_inputs_at_offsets") == Some(&true.into()) {
            return Err(Error::unsupported(
                "config.min.json: mid features and inputs at offsets are not supported \
                 (neither does the magika package)",
            ));
        }
        let f = Features {
            beg_size: field("beg_size")? as usize,
            end_size: field("end_size")? as usize,
            block_size: field("block_size")? as usize,
            padding_token: field("padding_token")? as i32,
            min_file_size_for_dl: field("min_file_size_for_dl")? as usize,
        };
        if f.beg_size >= f.block_size
            || f.end_size >= f.block_size
            || f.min_file_size_for_dl == 0
            || f.min_file_size_for_dl > f.beg_size
        {
            return Err(Error::invalid_arg(format!(
                "config.min.json: inconsistent sizes {f:?}"
            )));
        }
        Ok(f)
    }

    /// The model input for one file, or the label decided without it.
    fn extract(&self, content: &[u8]) -> Extracted {
        let n = content.len();
        let read = n.min(self.block_size);
        let beg = lstrip(&content[..read]);
        let beg = &beg[..beg.len().min(self.beg_size)];
        let end = rstrip(&content[n - read..]);
        let end = &end[end.len() - end.len().min(self.end_size)..];
        let mut features = Vec::with_capacity(self.beg_size + self.end_size);
        features.extend(beg.iter().map(|&b| i32::from(b)));
        features.resize(self.beg_size, self.padding_token);
        features.resize(
            self.beg_size + self.end_size - end.len(),
            self.padding_token,
        );
        features.extend(end.iter().map(|&b| i32::from(b)));
        let decided = if n == 0 {
            Some("empty")
        } else if n < self.min_file_size_for_dl
            || features[self.min_file_size_for_dl - 1] == self.padding_token
        {
            Some(few_bytes_label(&content[..read]))
        } else {
            None
        };
        Extracted { features, decided }
    }

    fn run(&self, r: &Request) -> Result<Response, Error> {
        let file = r.input("FILE")?;
        let files = file.strings()?;
        let width = self.beg_size + self.end_size;
        let mut features = Vec::with_capacity(files.len() * width);
        let mut decided = Vec::with_capacity(files.len());
        for content in files {
            let e = self.extract(content);
            features.extend(e.features);
            decided.push(e.decided.unwrap_or(""));
        }
        let rows = decided.len() as i64;
        Ok(Response::new(vec![
            Tensor::from_vec("features", vec![rows, width as i64], features),
            Tensor::from_strings("decided", vec![rows, 1], &decided),
        ]))
    }
}

impl Model for Features {
    fn initialize(ctx: ModelContext) -> Result<Self, Error> {
        Features::from_config(&ctx.read_file("config.min.json")?)
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests.iter().map(|r| self.run(r)).collect()
    }
}

export_model!(Features);

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Features {
        Features {
            beg_size: 4,
            end_size: 4,
            block_size: 8,
            padding_token: 256,
            min_file_size_for_dl: 2,
        }
    }

    #[test]
    fn strips_python_whitespace_and_pads() {
        let f = small();
        let e = f.extract(b" \x0b\tab\x0ccd  ");
        // block of 8 bytes from each end: " \v\tab\fcd" / "\tab\fcd  "
        assert_eq!(e.features[..4], [97, 98, 12, 99]);
        assert_eq!(e.features[4..], [98, 12, 99, 100]);
        assert_eq!(e.decided, None);
        let e = f.extract(b"  xyz");
        // Only the beginning is left-stripped, only the end right-stripped.
        assert_eq!(e.features, [120, 121, 122, 256, 32, 120, 121, 122]);
    }

    #[test]
    fn short_and_empty_files_are_decided_without_the_model() {
        let f = small();
        assert_eq!(f.extract(b"").decided, Some("empty"));
        assert_eq!(f.extract(b"a").decided, Some("txt"));
        assert_eq!(f.extract(b"\xff").decided, Some("unknown"));
        // Long enough, but only one meaningful byte after stripping.
        assert_eq!(f.extract(b"      a").decided, Some("txt"));
        assert_eq!(f.extract(b"ab").decided, None);
    }

    #[test]
    fn reads_magika_config() {
        let json = br#"{"beg_size":1024,"mid_size":0,"end_size":1024,"use_inputs_at_offsets":false,
            "min_file_size_for_dl":8,"padding_token":256,"block_size":4096}"#;
        let f = Features::from_config(json).unwrap();
        assert_eq!((f.beg_size, f.end_size, f.block_size), (1024, 1024, 4096));
        let bad = br#"{"beg_size":1024,"mid_size":8,"end_size":1024,"min_file_size_for_dl":8,"padding_token":256,"block_size":4096}"#;
        assert!(Features::from_config(bad).is_err());
        assert!(Features::from_config(b"{}").is_err());
    }
}
