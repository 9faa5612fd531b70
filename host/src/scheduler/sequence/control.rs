//! What the sequence batcher adds to each request before it runs and takes
//! from each response after: the control input tensors (START, END, READY,
//! CORRID in the forms the config declares), the implicit state inputs (the
//! sequence's last state output, or the initial state on START), and the
//! state outputs it keeps for the next request.

use std::path::Path;

use tern_core::config::pb::model_sequence_batching::{
    control::Kind, initial_state::StateData, Control,
};
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};
use tern_core::sequence::{batching, control_data_type, CorrelationId};
use tern_core::tensor::element_count;
use tern_core::{DataType, InferRequest, InferResponse, Tensor};

/// A boolean control input: its tensor and the encoded false/true values.
struct Flag {
    name: String,
    dtype: DataType,
    values: [Vec<u8>; 2],
}

/// The CORRID control input.
struct Corrid {
    name: String,
    dtype: DataType,
}

/// One implicit state.
struct State {
    input: String,
    output: String,
    /// The state output is also one of the model's declared outputs: the
    /// client gets it too (Triton allows the two to share a name).
    client_output: bool,
    dtype: DataType,
    /// The state input of a sequence's first request (per request, batch dim included).
    initial: Tensor,
}

/// Where a request stands in its sequence, as its control inputs say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// First request of the sequence.
    pub start: bool,
    /// Last request of the sequence.
    pub end: bool,
    /// A real request (false for the filler of an empty direct slot).
    pub ready: bool,
}

/// The control inputs and states of one sequence model.
pub struct Controls {
    start: Option<Flag>,
    end: Option<Flag>,
    ready: Option<Flag>,
    corrid: Option<Corrid>,
    states: Vec<State>,
    batched: bool,
}

fn flag(name: &str, c: &Control) -> Result<Flag> {
    let dtype = DataType::from_config(control_data_type(c))?;
    let values = |i: usize| -> Vec<u8> {
        match dtype {
            DataType::Int32 => c.int32_false_true[i].to_le_bytes().to_vec(),
            DataType::Fp32 => c.fp32_false_true[i].to_le_bytes().to_vec(),
            _ => vec![c.bool_false_true[i] as u8],
        }
    };
    Ok(Flag {
        name: name.to_string(),
        dtype,
        values: [values(0), values(1)],
    })
}

impl Controls {
    /// Reads the control inputs and states of a (validated) config; initial
    /// state files are read from `<model_dir>/initial_state/`.
    pub fn new(cfg: &ModelConfig, model_dir: &Path) -> Result<Controls> {
        let sb = batching(cfg).ok_or_else(|| {
            Error::internal(format!("model '{}' has no sequence_batching", cfg.name))
        })?;
        let batched = cfg.max_batch_size > 0;
        let mut controls = Controls {
            start: None,
            end: None,
            ready: None,
            corrid: None,
            states: Vec::new(),
            batched,
        };
        for ci in &sb.control_input {
            // Like Triton, a tensor listing several kinds takes the last.
            let Some(c) = ci.control.last() else { continue };
            match Kind::try_from(c.kind) {
                Ok(Kind::ControlSequenceStart) => controls.start = Some(flag(&ci.name, c)?),
                Ok(Kind::ControlSequenceEnd) => controls.end = Some(flag(&ci.name, c)?),
                Ok(Kind::ControlSequenceReady) => controls.ready = Some(flag(&ci.name, c)?),
                Ok(Kind::ControlSequenceCorrid) => {
                    controls.corrid = Some(Corrid {
                        name: ci.name.clone(),
                        dtype: DataType::from_config(c.data_type)?,
                    })
                }
                Err(_) => {}
            }
        }
        for s in &sb.state {
            let dtype = DataType::from_config(s.data_type)?;
            let (dims, data) = match s.initial_state.first() {
                Some(init) => {
                    let dims = init.dims.clone();
                    let data = match &init.state_data {
                        Some(StateData::DataFile(f)) => {
                            initial_file(model_dir, f, dtype, &dims, &s.input_name)?
                        }
                        _ => zeros(dtype, element_count(&dims)),
                    };
                    (dims, data)
                }
                // Triton leaves this buffer uninitialised; Tern starts from zeros.
                None => {
                    let dims: Vec<i64> = s.dims.iter().map(|&d| d.max(1)).collect();
                    let data = zeros(dtype, element_count(&dims));
                    (dims, data)
                }
            };
            let shape = if batched {
                std::iter::once(1).chain(dims).collect()
            } else {
                dims
            };
            controls.states.push(State {
                input: s.input_name.clone(),
                output: s.output_name.clone(),
                client_output: cfg.output.iter().any(|o| o.name == s.output_name),
                dtype,
                initial: Tensor::new(s.input_name.clone(), dtype, shape, data),
            });
        }
        Ok(controls)
    }

    /// Number of implicit states.
    pub fn state_count(&self) -> usize {
        self.states.len()
    }

    /// Checks a correlation id against the CORRID control's data type, with
    /// Triton's message.
    pub fn check_corrid(&self, model: &str, id: &CorrelationId) -> Result<()> {
        let Some(c) = &self.corrid else {
            return Ok(());
        };
        let (got, fits) = match id {
            CorrelationId::Text(_) => ("BYTES", c.dtype == DataType::Bytes),
            CorrelationId::Number(_) => ("UINT64", c.dtype != DataType::Bytes),
        };
        if fits {
            return Ok(());
        }
        Err(Error::invalid_arg(format!(
            "sequence batching control '{}' data-type is '{got}', but model '{model}' expects '{}'",
            c.name,
            c.dtype.wire_name()
        )))
    }

    fn shape(&self) -> Vec<i64> {
        if self.batched {
            vec![1, 1]
        } else {
            vec![1]
        }
    }

    /// Adds the control inputs for `at` to a request (`id` None for a filler: CORRID 0).
    pub fn add_controls(&self, req: &mut InferRequest, at: Position, id: Option<&CorrelationId>) {
        for (flag, on) in [
            (&self.start, at.start),
            (&self.end, at.end),
            (&self.ready, at.ready),
        ] {
            if let Some(f) = flag {
                let data = f.values[on as usize].clone();
                set(
                    req,
                    Tensor::new(f.name.clone(), f.dtype, self.shape(), data),
                );
            }
        }
        if let Some(c) = &self.corrid {
            let data = corrid_bytes(c.dtype, id);
            set(
                req,
                Tensor::new(c.name.clone(), c.dtype, self.shape(), data),
            );
        }
    }

    /// Adds the state inputs: `kept[i]` is the state the sequence's last
    /// request produced (`None`: the initial state).
    pub fn add_states(&self, req: &mut InferRequest, kept: &[Option<Tensor>]) {
        for (i, s) in self.states.iter().enumerate() {
            let t = match kept.get(i).and_then(|k| k.as_ref()) {
                Some(t) => Tensor::new(s.input.clone(), s.dtype, t.shape.clone(), t.data.clone()),
                None => s.initial.clone(),
            };
            set(req, t);
        }
    }

    /// Removes the control and state inputs [`Controls::add_controls`] and
    /// [`Controls::add_states`] added, leaving the client's own: a request
    /// queued again (rescheduled) then batches with requests that have not
    /// run yet, and gets its controls and states anew when it runs.
    pub fn strip(&self, req: &mut InferRequest) {
        let flags = [&self.start, &self.end, &self.ready];
        let added: Vec<&str> = flags
            .iter()
            .filter_map(|f| f.as_ref().map(|f| f.name.as_str()))
            .chain(self.corrid.as_ref().map(|c| c.name.as_str()))
            .chain(self.states.iter().map(|s| s.input.as_str()))
            .collect();
        req.inputs.retain(|t| !added.contains(&t.name.as_str()));
    }

    /// Takes the state outputs from a response (they are not the client's,
    /// unless the config also declares them as outputs: then the client gets
    /// them too): `Some` for each state the model produced.
    pub fn take_states(&self, response: &mut InferResponse) -> Vec<Option<Tensor>> {
        self.states
            .iter()
            .map(|s| {
                let pos = response.outputs.iter().position(|t| t.name == s.output)?;
                Some(if s.client_output {
                    response.outputs[pos].clone()
                } else {
                    response.outputs.swap_remove(pos)
                })
            })
            .collect()
    }

    /// A filler for an empty direct slot, shaped like `like` (which already
    /// has its controls and states): every tensor zero, READY false, CORRID 0.
    pub fn null_request(&self, like: &InferRequest) -> InferRequest {
        let mut null = InferRequest {
            model_name: like.model_name.clone(),
            model_version: like.model_version,
            inputs: like
                .inputs
                .iter()
                .map(|t| {
                    let data = zeros(t.dtype, t.element_count());
                    Tensor::new(t.name.clone(), t.dtype, t.shape.clone(), data)
                })
                .collect(),
            ..Default::default()
        };
        let at = Position {
            start: false,
            end: false,
            ready: false,
        };
        self.add_controls(&mut null, at, None);
        null
    }
}

/// Replaces or adds an input.
fn set(req: &mut InferRequest, t: Tensor) {
    match req.inputs.iter_mut().find(|i| i.name == t.name) {
        Some(slot) => *slot = t,
        None => req.inputs.push(t),
    }
}

/// `count` zero elements (BYTES: empty strings).
fn zeros(dtype: DataType, count: usize) -> Vec<u8> {
    vec![0; count * dtype.size().unwrap_or(4)]
}

/// The CORRID tensor's bytes: integers keep the low-order bytes of the u64
/// (as Triton copies them), strings are one length-prefixed element.
fn corrid_bytes(dtype: DataType, id: Option<&CorrelationId>) -> Vec<u8> {
    match (dtype, id) {
        (DataType::Bytes, Some(CorrelationId::Text(s))) => {
            let mut v = (s.len() as u32).to_le_bytes().to_vec();
            v.extend_from_slice(s.as_bytes());
            v
        }
        (DataType::Bytes, Some(CorrelationId::Number(n))) => {
            let s = n.to_string();
            let mut v = (s.len() as u32).to_le_bytes().to_vec();
            v.extend_from_slice(s.as_bytes());
            v
        }
        (DataType::Bytes, None) => vec![0; 4],
        (dt, id) => {
            let n = match id {
                Some(CorrelationId::Number(n)) => *n,
                _ => 0,
            };
            n.to_le_bytes()[..dt.size().unwrap_or(8)].to_vec()
        }
    }
}

/// Reads an initial state file, checking it holds the state's bytes.
fn initial_file(
    model_dir: &Path,
    file: &str,
    dtype: DataType,
    dims: &[i64],
    input: &str,
) -> Result<Vec<u8>> {
    let path = model_dir.join("initial_state").join(file);
    let data = tern_core::files::read_inside(
        model_dir,
        &model_dir.join("initial_state"),
        file,
        &format!("initial_state data file of state '{input}'"),
    )?;
    match dtype.size() {
        Some(size) => {
            let want = element_count(dims) * size;
            if data.len() < want {
                return Err(Error::invalid_arg(format!(
                    "initial_state setting expects {want} bytes, but the data provided from {} only has {} bytes.",
                    path.display(),
                    data.len()
                )));
            }
            Ok(data[..want].to_vec())
        }
        // A string state takes the whole file as it is (Triton copies it unread): it should
        // hold the state's elements in the serialized BYTES form; when it does not, the model
        // gets it anyway and the log says so.
        None => {
            let t = Tensor::new(input, dtype, dims.to_vec(), data.clone());
            if let Err(e) = t.check_size_as("initial_state") {
                tracing::warn!(
                    "initial_state data file '{}' of state '{input}' is passed to the model as it is, but it is not {} serialized string element(s): {}",
                    path.display(),
                    element_count(dims),
                    e.message
                );
            }
            Ok(data)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::config::parse_pbtxt;

    fn controls(extra: &str) -> Controls {
        let cfg = parse_pbtxt(&format!(
            r#"name: "m" max_batch_size: 4
               input [{{name: "X" data_type: TYPE_INT32 dims: [1]}}]
               output [{{name: "Y" data_type: TYPE_INT32 dims: [1]}}]
               sequence_batching {{
                 control_input [
                   {{name: "S" control [{{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}}]}},
                   {{name: "E" control [{{kind: CONTROL_SEQUENCE_END fp32_false_true: [0, 1]}}]}},
                   {{name: "R" control [{{kind: CONTROL_SEQUENCE_READY bool_false_true: [false, true]}}]}},
                   {{name: "C" control [{{kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT32}}]}}
                 ]
                 {extra}
               }}"#
        ))
        .unwrap();
        Controls::new(&cfg, Path::new("/nonexistent")).unwrap()
    }

    #[test]
    fn control_tensors_take_the_configured_forms() {
        let c = controls("");
        let mut req = InferRequest::default();
        let at = Position {
            start: true,
            end: false,
            ready: true,
        };
        c.add_controls(&mut req, at, Some(&CorrelationId::Number(0x1_0000_0007)));
        let get = |n: &str| req.input(n).unwrap().clone();
        assert_eq!(get("S").data.as_ref(), &1i32.to_le_bytes());
        assert_eq!(get("S").shape, vec![1, 1]);
        assert_eq!(get("E").data.as_ref(), &0f32.to_le_bytes());
        assert_eq!(get("R").data.as_ref(), &[1u8]);
        // UINT32 keeps the low-order bytes of the id, as Triton does.
        assert_eq!(get("C").data.as_ref(), &7u32.to_le_bytes());
        let null = c.null_request(&req);
        assert_eq!(null.input("R").unwrap().data.as_ref(), &[0u8]);
        assert_eq!(null.input("C").unwrap().data.as_ref(), &0u32.to_le_bytes());
        assert!(c.check_corrid("m", &CorrelationId::Number(3)).is_ok());
        let e = c
            .check_corrid("m", &CorrelationId::Text("a".into()))
            .unwrap_err();
        assert_eq!(
            e.message,
            "sequence batching control 'C' data-type is 'BYTES', but model 'm' expects 'UINT32'"
        );
    }

    #[test]
    fn a_string_initial_state_file_is_taken_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("initial_state")).unwrap();
        let mut serialized = 5u32.to_le_bytes().to_vec();
        serialized.extend_from_slice(b"hello");
        for (file, bytes) in [("ok.bin", serialized), ("raw.txt", b"hello".to_vec())] {
            std::fs::write(dir.path().join("initial_state").join(file), &bytes).unwrap();
            let cfg = parse_pbtxt(&format!(
                r#"name: "m" max_batch_size: 0
                   sequence_batching {{ state [{{input_name: "IN" output_name: "OUT" data_type: TYPE_STRING dims: [1]
                     initial_state {{data_type: TYPE_STRING dims: [1] data_file: "{file}" name: "s"}}}}] }}"#
            ))
            .unwrap();
            let c = Controls::new(&cfg, dir.path()).unwrap();
            let mut req = InferRequest::default();
            c.add_states(&mut req, &[None]);
            assert_eq!(
                req.input("IN").unwrap().data.as_ref(),
                bytes.as_slice(),
                "{file}"
            );
        }
    }

    #[test]
    fn states_start_from_the_initial_state_and_follow_the_outputs() {
        let c = controls(
            r#"state [{input_name: "IN" output_name: "OUT" data_type: TYPE_INT32 dims: [2]
                       initial_state {data_type: TYPE_INT32 dims: [2] zero_data: true name: "z"}}]"#,
        );
        let mut req = InferRequest::default();
        c.add_states(&mut req, &[None]);
        assert_eq!(req.input("IN").unwrap().shape, vec![1, 2]);
        assert_eq!(req.input("IN").unwrap().data.as_ref(), &[0u8; 8]);
        let mut resp = InferResponse {
            outputs: vec![
                Tensor::new("Y", DataType::Int32, vec![1, 1], vec![0; 4]),
                Tensor::new("OUT", DataType::Int32, vec![1, 2], vec![9; 8]),
            ],
            ..Default::default()
        };
        let kept = c.take_states(&mut resp);
        assert_eq!(
            resp.outputs.len(),
            1,
            "the state output is not the client's"
        );
        c.add_states(&mut req, &kept);
        assert_eq!(req.input("IN").unwrap().data.as_ref(), &[9u8; 8]);
    }
}
