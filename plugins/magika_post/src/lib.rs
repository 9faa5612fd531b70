//! `magika_post`: Magika's output logic (as in the `magika` Python package
//! 1.0) as a plugin. `target_label` (FP32 `[rows, labels]`, the model's
//! scores) and `decided` (BYTES `[rows, 1]` from `magika_prep`) →
//! `label` (BYTES `[rows, 1]`, what `magika` reports as `output.label`),
//! `score` (FP32 `[rows, 1]`) and `dl_label` (BYTES `[rows, 1]`, the
//! model's own top label, `undefined` when the model was not needed).
//!
//! Reads `config.min.json` (label space, thresholds, overwrite map) and
//! `content_types_kb.min.json` (which labels are text) from its version
//! folder. `parameters { key: "prediction_mode" }`: `high_confidence`
//! (default, like magika), `medium_confidence` or `best_guess`.

use std::collections::{HashMap, HashSet};

use tern_plugin::{export_model, Error, Model, ModelContext, Request, Response, Tensor};

/// Which scores are trusted (magika's `PredictionMode`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    BestGuess,
    MediumConfidence,
    HighConfidence,
}

/// Magika's output configuration.
struct Labels {
    space: Vec<String>,
    thresholds: HashMap<String, f64>,
    medium: f64,
    overwrite: HashMap<String, String>,
    text: HashSet<String>,
    mode: Mode,
}

fn json(bytes: &[u8], file: &str) -> Result<serde_json::Value, Error> {
    serde_json::from_slice(bytes).map_err(|e| Error::invalid_arg(format!("{file}: {e}")))
}

fn bad(file: &str, what: &str) -> Error {
    Error::invalid_arg(format!("{file}: '{what}' missing or malformed"))
}

impl Labels {
    fn new(config: &[u8], kb: &[u8], mode: Mode) -> Result<Labels, Error> {
        const CONFIG: &str = "config.min.json";
        const KB: &str = "content_types_kb.min.json";
        let config = json(config, CONFIG)?;
        let strings = |key: &str| -> Result<Vec<String>, Error> {
            config
                .get(key)
                .and_then(|v| v.as_array())
                .and_then(|a| a.iter().map(|s| s.as_str().map(str::to_string)).collect())
                .ok_or_else(|| bad(CONFIG, key))
        };
        let map = |key: &str| -> Result<&serde_json::Map<String, serde_json::Value>, Error> {
            config
                .get(key)
                .and_then(|v| v.as_object())
                .ok_or_else(|| bad(CONFIG, key))
        };
        let space = strings("target_labels_space")?;
        let thresholds = map("thresholds")?
            .iter()
            .map(|(k, v)| Some((k.clone(), v.as_f64()?)))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(CONFIG, "thresholds"))?;
        let overwrite = map("overwrite_map")?
            .iter()
            .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(CONFIG, "overwrite_map"))?;
        let medium = config
            .get("medium_confidence_threshold")
            .and_then(|v| v.as_f64())
            .ok_or_else(|| bad(CONFIG, "medium_confidence_threshold"))?;
        let kb = json(kb, KB)?;
        let text = kb
            .as_object()
            .ok_or_else(|| bad(KB, "content types"))?
            .iter()
            .filter(|(_, info)| info.get("is_text") == Some(&true.into()))
            .map(|(k, _)| k.clone())
            .collect();
        Ok(Labels {
            space,
            thresholds,
            medium,
            overwrite,
            text,
            mode,
        })
    }

    /// The reported label for the model's top label and its score.
    fn output_label<'a>(&'a self, dl_label: &'a str, score: f32) -> &'a str {
        let label = self
            .overwrite
            .get(dl_label)
            .map_or(dl_label, String::as_str);
        let score = f64::from(score);
        let trusted = match self.mode {
            Mode::BestGuess => true,
            Mode::HighConfidence => {
                score
                    >= self
                        .thresholds
                        .get(dl_label)
                        .copied()
                        .unwrap_or(self.medium)
            }
            Mode::MediumConfidence => score >= self.medium,
        };
        match (trusted, self.text.contains(label)) {
            (true, _) => label,
            (false, true) => "txt",
            (false, false) => "unknown",
        }
    }

    fn run(&self, r: &Request) -> Result<Response, Error> {
        let scores = r.input("target_label")?;
        let decided = r.input("decided")?.strings()?;
        let rows = decided.len();
        let width = self.space.len();
        if scores.shape[..] != [rows as i64, width as i64] {
            return Err(Error::invalid_arg(format!(
                "target_label: expected shape [{rows}, {width}], got {:?}",
                scores.shape
            )));
        }
        let scores = scores.as_slice::<f32>()?;
        let (mut labels, mut best, mut dl_labels) = (Vec::new(), Vec::new(), Vec::new());
        for (row, decided) in scores.chunks_exact(width).zip(decided) {
            if !decided.is_empty() {
                labels.push(String::from_utf8_lossy(decided).into_owned());
                best.push(1.0f32);
                dl_labels.push("undefined");
                continue;
            }
            // The first maximum, as Python's max() picks it.
            let (top, score) =
                row.iter()
                    .enumerate()
                    .fold(
                        (0, f32::NEG_INFINITY),
                        |acc, (i, &s)| if s > acc.1 { (i, s) } else { acc },
                    );
            let dl_label = self.space[top].as_str();
            labels.push(self.output_label(dl_label, score).to_string());
            best.push(score);
            dl_labels.push(dl_label);
        }
        let shape = vec![rows as i64, 1];
        Ok(Response::new(vec![
            Tensor::from_strings("label", shape.clone(), &labels),
            Tensor::from_vec("score", shape.clone(), best),
            Tensor::from_strings("dl_label", shape, &dl_labels),
        ]))
    }
}

impl Model for Labels {
    fn initialize(ctx: ModelContext) -> Result<Self, Error> {
        let mode = match ctx.parameter("prediction_mode").as_deref() {
            None | Some("high_confidence") => Mode::HighConfidence,
            Some("medium_confidence") => Mode::MediumConfidence,
            Some("best_guess") => Mode::BestGuess,
            Some(other) => {
                return Err(Error::invalid_arg(format!(
                    "parameter 'prediction_mode' must be high_confidence, medium_confidence \
                     or best_guess, got '{other}'"
                )))
            }
        };
        Labels::new(
            &ctx.read_file("config.min.json")?,
            &ctx.read_file("content_types_kb.min.json")?,
            mode,
        )
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests.iter().map(|r| self.run(r)).collect()
    }
}

export_model!(Labels);

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &[u8] = br#"{"medium_confidence_threshold":0.5,
        "target_labels_space":["python","randomtxt","zip","markdown"],
        "thresholds":{"markdown":0.75},"overwrite_map":{"randomtxt":"txt"}}"#;
    const KB: &[u8] = br#"{"python":{"is_text":true},"randomtxt":{"is_text":true},
        "txt":{"is_text":true},"zip":{"is_text":false},"markdown":{"is_text":true}}"#;

    #[test]
    fn thresholds_overwrites_and_fallbacks() {
        let l = Labels::new(CONFIG, KB, Mode::HighConfidence).unwrap();
        assert_eq!(l.output_label("python", 0.6), "python");
        assert_eq!(l.output_label("python", 0.4), "txt");
        assert_eq!(l.output_label("zip", 0.4), "unknown");
        assert_eq!(l.output_label("markdown", 0.7), "txt");
        assert_eq!(l.output_label("markdown", 0.8), "markdown");
        assert_eq!(l.output_label("randomtxt", 0.9), "txt");
        let l = Labels::new(CONFIG, KB, Mode::MediumConfidence).unwrap();
        assert_eq!(l.output_label("markdown", 0.7), "markdown");
        let l = Labels::new(CONFIG, KB, Mode::BestGuess).unwrap();
        assert_eq!(l.output_label("zip", 0.1), "zip");
    }

    #[test]
    fn malformed_config_is_an_error() {
        assert!(Labels::new(b"{}", KB, Mode::BestGuess).is_err());
        assert!(Labels::new(CONFIG, b"[]", Mode::BestGuess).is_err());
    }
}
