//! Model warmup (`model_warmup [ ... ]`): synthetic requests built from the
//! config (zero data, random data, or raw files under `<model>/warmup/`) and
//! run on every instance before the model reports READY.

use std::path::Path;

use tern_core::config::pb::model_warmup::input::InputDataType;
use tern_core::config::pb::model_warmup::Input as WarmupInput;
use tern_core::config::pb::ModelWarmup;
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::tensor::{element_count, shape_str};
use tern_core::validate::validate_request;
use tern_core::{bytes_tensor, DataType, InferRequest, Tensor};

/// One warmup sample: its name, the request and how many times to run it.
#[derive(Debug)]
pub struct Sample {
    /// `model_warmup.name`.
    pub name: String,
    /// The request.
    pub request: InferRequest,
    /// Executions (at least 1).
    pub count: u32,
}

/// A small deterministic generator for `random_data` (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn random_bytes(dt: DataType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dt.size().unwrap_or(4));
    for _ in 0..n {
        match dt {
            DataType::Bool => out.push((rng.next() & 1) as u8),
            DataType::Fp32 => out.extend_from_slice(&(rng.unit() as f32).to_le_bytes()),
            DataType::Fp64 => out.extend_from_slice(&rng.unit().to_le_bytes()),
            DataType::Fp16 => out.extend_from_slice(&half::f16::from_f64(rng.unit()).to_le_bytes()),
            DataType::Bf16 => {
                out.extend_from_slice(&half::bf16::from_f64(rng.unit()).to_le_bytes())
            }
            DataType::Bytes => bytes_tensor::push(&mut out, b""),
            other => out.extend_from_slice(&rng.next().to_le_bytes()[..other.size().unwrap_or(1)]),
        }
    }
    out
}

/// Largest warmup input, in bytes: a config value must never make the
/// server allocate without bound.
const MAX_SAMPLE_BYTES: usize = 1 << 30;

/// Builds the warmup samples of a config; errors name the sample and input.
pub fn samples(cfg: &ModelConfig, model_dir: &Path) -> Result<Vec<Sample>> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    cfg.model_warmup
        .iter()
        .map(|w| sample(cfg, w, model_dir, &mut rng))
        .collect()
}

/// One warmup sample: its batch size checked, its inputs built, the request
/// validated and reshaped as a client's would be.
fn sample(cfg: &ModelConfig, w: &ModelWarmup, model_dir: &Path, rng: &mut Rng) -> Result<Sample> {
    let what = format!("model '{}' warmup sample '{}'", cfg.name, w.name);
    if w.batch_size < 1
        || (cfg.max_batch_size == 0 && w.batch_size != 1)
        || (cfg.max_batch_size > 0 && i64::from(w.batch_size) > i64::from(cfg.max_batch_size))
    {
        return Err(Error::invalid_arg(format!(
            "{what}: batch_size {} must be between 1 and {}",
            w.batch_size,
            cfg.max_batch_size.max(1)
        )));
    }
    let mut names: Vec<&String> = w.inputs.keys().collect();
    names.sort();
    let inputs = names
        .into_iter()
        .map(|name| {
            let at = Where {
                cfg,
                w,
                what: &what,
                name,
                model_dir,
            };
            sample_input(&at, &w.inputs[name], rng)
        })
        .collect::<Result<Vec<_>>>()?;
    // A sequence model's sample may give the control and state inputs the batcher
    // would add (START, READY, ...): the instance gets them as they are, as Triton
    // hands warmup samples to the backend; the model's own inputs are checked.
    let sequence: std::collections::HashSet<&str> = tern_core::sequence::batching(cfg)
        .into_iter()
        .flat_map(|sb| {
            sb.control_input
                .iter()
                .map(|c| c.name.as_str())
                .chain(sb.state.iter().map(|s| s.input_name.as_str()))
        })
        .collect();
    let (controls, inputs): (Vec<Tensor>, Vec<Tensor>) = inputs.into_iter().partition(|t| {
        sequence.contains(t.name.as_str()) && !cfg.input.iter().any(|i| i.name == t.name)
    });
    let mut request = InferRequest {
        model_name: cfg.name.clone(),
        id: format!("warmup:{}", w.name),
        inputs,
        ..Default::default()
    };
    validate_request(cfg, &request).map_err(|e| e.context(&what))?;
    tern_core::validate::apply_reshape(cfg, &mut request);
    request.inputs.extend(controls);
    Ok(Sample {
        name: w.name.clone(),
        request,
        count: w.count.max(1),
    })
}

/// The sample and input a warmup tensor is built for, for its errors.
struct Where<'a> {
    cfg: &'a ModelConfig,
    w: &'a ModelWarmup,
    /// `model '<m>' warmup sample '<s>'`.
    what: &'a str,
    name: &'a str,
    model_dir: &'a Path,
}

/// One input of a sample: fixed dims, within the size limit, filled with
/// zeros, random data or a file's contents.
fn sample_input(at: &Where, input: &WarmupInput, rng: &mut Rng) -> Result<Tensor> {
    let (cfg, what, name) = (at.cfg, at.what, at.name);
    let dt = DataType::from_config(input.data_type)
        .map_err(|e| e.context(format!("{what} input '{name}'")))?;
    if input.dims.iter().any(|&d| d < 0) {
        return Err(Error::invalid_arg(format!(
            "{what} input '{name}': dims {} must be fixed (no -1)",
            shape_str(&input.dims)
        )));
    }
    let mut shape = input.dims.clone();
    if cfg.max_batch_size > 0 {
        shape.insert(0, at.w.batch_size as i64);
    }
    let n = element_count(&shape);
    let bytes = n.checked_mul(dt.size().unwrap_or(4));
    if bytes.is_none_or(|b| b > MAX_SAMPLE_BYTES) {
        return Err(Error::invalid_arg(format!(
            "{what} input '{name}': {} element(s) of shape {} exceed the {MAX_SAMPLE_BYTES}-byte limit of a warmup input",
            n,
            shape_str(&shape)
        )));
    }
    let data = match &input.input_data_type {
        Some(InputDataType::ZeroData(_)) | None => match dt {
            DataType::Bytes => bytes_tensor::encode(std::iter::repeat_n(b"", n)),
            _ => vec![0u8; n * dt.size().unwrap_or(1)],
        },
        Some(InputDataType::RandomData(_)) => random_bytes(dt, n, rng),
        Some(InputDataType::InputDataFile(file)) => {
            file_data(at, dt, element_count(&input.dims), file)?
        }
    };
    Ok(Tensor::new(name.to_string(), dt, shape, data))
}

/// An `input_data_file` from the model's `warmup/` folder: one batch item
/// of `per_item` elements, repeated for the sample's batch size.
fn file_data(at: &Where, dt: DataType, per_item: usize, file: &str) -> Result<Vec<u8>> {
    let (what, name, model_dir) = (at.what, at.name, at.model_dir);
    let path = model_dir.join("warmup").join(file);
    let raw = tern_core::files::read_inside(
        model_dir,
        &model_dir.join("warmup"),
        file,
        &format!("{what} input '{name}'"),
    )?;
    let item_ok = match dt.size() {
        Some(size) => raw.len() == per_item * size,
        None => bytes_tensor::count(&raw)
            .map(|c| c == per_item)
            .unwrap_or(false),
    };
    if !item_ok {
        return Err(Error::invalid_arg(format!(
            "{what} input '{name}': '{}' has {} bytes, which is not {per_item} {dt} element(s)",
            path.display(),
            raw.len()
        )));
    }
    let times = if at.cfg.max_batch_size > 0 {
        at.w.batch_size as usize
    } else {
        1
    };
    if raw
        .len()
        .checked_mul(times)
        .is_none_or(|b| b > MAX_SAMPLE_BYTES)
    {
        return Err(Error::invalid_arg(format!(
            "{what} input '{name}': '{}' repeated {times} time(s) exceeds the {MAX_SAMPLE_BYTES}-byte limit of a warmup input",
            path.display()
        )));
    }
    Ok(raw.repeat(times))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::config::parse_pbtxt;

    const IO: &str = r#"name: "m" max_batch_size: 4
        input [{name: "A" data_type: TYPE_FP32 dims: [3]}, {name: "S" data_type: TYPE_STRING dims: [2]}]"#;

    #[test]
    fn builds_each_data_kind() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("warmup")).unwrap();
        std::fs::write(
            dir.path().join("warmup/a.bin"),
            [1f32, 2., 3.]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        let cfg = parse_pbtxt(&format!(
            r#"{IO} model_warmup [
                {{ name: "zeros" batch_size: 2 inputs {{ key: "A" value: {{ data_type: TYPE_FP32 dims: [3] zero_data: true }} }}
                                               inputs {{ key: "S" value: {{ data_type: TYPE_STRING dims: [2] random_data: true }} }} }},
                {{ name: "file" batch_size: 1 count: 3 inputs {{ key: "A" value: {{ data_type: TYPE_FP32 dims: [3] input_data_file: "a.bin" }} }}
                                                     inputs {{ key: "S" value: {{ data_type: TYPE_STRING dims: [2] zero_data: true }} }} }} ]"#
        ))
        .unwrap();
        let s = samples(&cfg, dir.path()).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].request.inputs[0].shape, vec![2, 3]);
        assert_eq!(s[0].request.inputs[0].data.len(), 24);
        assert_eq!(s[1].count, 3);
        assert_eq!(&s[1].request.inputs[0].data[4..8], &2f32.to_le_bytes());
    }

    #[test]
    fn a_sequence_samples_control_inputs_go_to_the_instance_as_given() {
        let cfg = parse_pbtxt(
            r#"name: "s" max_batch_size: 1
               input [{name: "IN" data_type: TYPE_INT32 dims: [1]}]
               sequence_batching { control_input [
                 { name: "START" control [{ kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] }] },
                 { name: "READY" control [{ kind: CONTROL_SEQUENCE_READY int32_false_true: [0, 1] }] } ] }
               model_warmup [{ name: "w" batch_size: 1
                 inputs { key: "IN" value: { data_type: TYPE_INT32 dims: [1] zero_data: true } }
                 inputs { key: "START" value: { data_type: TYPE_INT32 dims: [1] zero_data: true } }
                 inputs { key: "READY" value: { data_type: TYPE_INT32 dims: [1] zero_data: true } } }]"#,
        )
        .unwrap();
        let s = samples(&cfg, Path::new("/nonexistent")).unwrap();
        let names: Vec<&str> = s[0]
            .request
            .inputs
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(names, ["IN", "READY", "START"]);
        let stray = cfg.model_warmup[0].clone();
        let mut bad = cfg.clone();
        bad.model_warmup[0]
            .inputs
            .insert("NOPE".into(), stray.inputs["IN"].clone());
        assert!(samples(&bad, Path::new("/nonexistent"))
            .unwrap_err()
            .message
            .contains("'NOPE'"));
    }

    #[test]
    fn rejects_bad_samples() {
        let dir = tempfile::tempdir().unwrap();
        let bad = |w: &str| {
            samples(
                &parse_pbtxt(&format!("{IO} model_warmup [{w}]")).unwrap(),
                dir.path(),
            )
            .unwrap_err()
            .message
        };
        assert!(bad(r#"{ name: "v" batch_size: 1 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [-1] zero_data: true } } }"#).contains("must be fixed"));
        assert!(bad(r#"{ name: "b" batch_size: 9 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [3] zero_data: true } } }"#).contains("batch_size 9"));
        assert!(bad(r#"{ name: "b" batch_size: 4294967295 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [3] zero_data: true } } }"#).contains("batch_size 4294967295"));
        assert!(bad(r#"{ name: "h" batch_size: 1 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [9223372036854775807, 4] zero_data: true } } }"#).contains("byte limit of a warmup input"));
        assert!(bad(r#"{ name: "f" batch_size: 1 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [3] input_data_file: "x" } } }"#).contains("cannot read"));
        let e = bad(
            r#"{ name: "m" batch_size: 1 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [3] zero_data: true } } }"#,
        );
        assert!(
            e.contains("warmup sample 'm'") && e.contains("missing required input(s) ['S']"),
            "{e}"
        );
    }
}
