//! Sequences (stateful models): the correlation id and START/END flags a
//! request carries as Triton's `sequence_id`, `sequence_start` and
//! `sequence_end` parameters (HTTP JSON and gRPC alike), and what the
//! sequence batcher's config declares besides the model's own inputs and
//! outputs — control inputs and implicit state — so that backends feed and
//! fetch them.

use std::fmt;

use crate::config::pb::model_sequence_batching::{
    self, control::Kind, initial_state::StateData, StrategyChoice as Strategy,
};
use crate::config::pb::{model_config::SchedulingChoice, ModelConfig};
use crate::error::{Error, Result};
use crate::request::{InferRequest, Parameter};

/// A sequence's correlation id: Triton accepts unsigned integers and strings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CorrelationId {
    /// A numeric id (never 0: 0 means "no sequence").
    Number(u64),
    /// A string id (never empty).
    Text(String),
}

impl fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CorrelationId::Number(n) => write!(f, "{n}"),
            CorrelationId::Text(s) => write!(f, "{s}"),
        }
    }
}

/// The sequence a request belongs to and where it stands in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceFlags {
    /// Correlation id; `None` when the request names no sequence (or 0 / "").
    pub id: Option<CorrelationId>,
    /// `sequence_start`: the first request of the sequence.
    pub start: bool,
    /// `sequence_end`: the last request of the sequence.
    pub end: bool,
}

impl InferRequest {
    /// Reads the sequence parameters, as Triton's frontends do: `sequence_id`
    /// an integer or a string (0 and "" mean none), `sequence_start` and
    /// `sequence_end` booleans.
    pub fn sequence(&self) -> Result<SequenceFlags> {
        let id = match self.parameters.get("sequence_id") {
            None => None,
            Some(Parameter::Int(0)) => None,
            Some(Parameter::Int(i)) => {
                Some(CorrelationId::Number(u64::try_from(*i).map_err(|_| {
                    Error::invalid_arg(format!(
                        "sequence_id must be a non-negative integer or a string, got {i}"
                    ))
                })?))
            }
            Some(Parameter::String(s)) if s.is_empty() => None,
            Some(Parameter::String(s)) => Some(CorrelationId::Text(s.clone())),
            Some(_) => {
                return Err(Error::invalid_arg(
                    "sequence_id parameter must be an integer or a string",
                ))
            }
        };
        let flag = |key: &str| match self.parameters.get(key) {
            None => Ok(false),
            Some(Parameter::Bool(b)) => Ok(*b),
            Some(_) => Err(Error::invalid_arg(format!(
                "{key} parameter must be a boolean"
            ))),
        };
        Ok(SequenceFlags {
            id,
            start: flag("sequence_start")?,
            end: flag("sequence_end")?,
        })
    }
}

/// The model's `sequence_batching` section, if it has one.
pub fn batching(cfg: &ModelConfig) -> Option<&crate::config::pb::ModelSequenceBatching> {
    match &cfg.scheduling_choice {
        Some(SchedulingChoice::SequenceBatching(sb)) => Some(sb),
        _ => None,
    }
}

/// A tensor the sequence batcher adds to or takes from a model, beside the
/// config's `input`/`output` lists: a control input, or a state's input or
/// output.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtraTensor {
    /// Tensor name in the model.
    pub name: String,
    /// `TYPE_*` data type (config enum value).
    pub data_type: i32,
    /// Dims without the batch dimension; `[1]` for control inputs.
    pub dims: Vec<i64>,
}

/// Inputs the sequence batcher feeds the model: every control input and
/// every state's `input_name`.
pub fn extra_inputs(cfg: &ModelConfig) -> Vec<ExtraTensor> {
    let Some(sb) = batching(cfg) else {
        return Vec::new();
    };
    let controls = sb.control_input.iter().filter_map(|ci| {
        ci.control.first().map(|c| ExtraTensor {
            name: ci.name.clone(),
            data_type: control_data_type(c),
            dims: vec![1],
        })
    });
    let states = sb.state.iter().map(|s| ExtraTensor {
        name: s.input_name.clone(),
        data_type: s.data_type,
        dims: s.dims.clone(),
    });
    controls.chain(states).collect()
}

/// Outputs the sequence batcher takes from the model: every state's `output_name`.
pub fn extra_outputs(cfg: &ModelConfig) -> Vec<ExtraTensor> {
    batching(cfg)
        .map(|sb| {
            sb.state
                .iter()
                .map(|s| ExtraTensor {
                    name: s.output_name.clone(),
                    data_type: s.data_type,
                    dims: s.dims.clone(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The data type a control input has: `TYPE_INT32`, `TYPE_FP32` or
/// `TYPE_BOOL` by which `*_false_true` list it gives, else its `data_type`
/// (the CORRID form).
pub fn control_data_type(c: &model_sequence_batching::Control) -> i32 {
    use crate::config::pb::DataType as T;
    if !c.int32_false_true.is_empty() {
        T::TypeInt32 as i32
    } else if !c.fp32_false_true.is_empty() {
        T::TypeFp32 as i32
    } else if !c.bool_false_true.is_empty() {
        T::TypeBool as i32
    } else {
        c.data_type
    }
}

/// Triton's default `max_sequence_idle_microseconds` (one second), filled in
/// by normalisation when the config gives 0.
pub const DEFAULT_IDLE_MICROSECONDS: u64 = 1_000_000;

/// The name Triton gives a control kind in its messages.
pub fn kind_name(kind: i32) -> &'static str {
    match Kind::try_from(kind) {
        Ok(Kind::ControlSequenceStart) => "CONTROL_SEQUENCE_START",
        Ok(Kind::ControlSequenceReady) => "CONTROL_SEQUENCE_READY",
        Ok(Kind::ControlSequenceEnd) => "CONTROL_SEQUENCE_END",
        Ok(Kind::ControlSequenceCorrid) => "CONTROL_SEQUENCE_CORRID",
        Err(_) => "an unknown control kind",
    }
}

/// Validates a `sequence_batching` section with Triton's rules and messages
/// (control inputs, strategies, implicit state); `Ok` when there is none.
pub fn validate_config(cfg: &ModelConfig) -> Result<()> {
    let Some(sb) = batching(cfg) else {
        return Ok(());
    };
    let m = &cfg.name;
    let err = |msg: String| Err(Error::invalid_arg(msg));
    let mut names: Vec<&str> = Vec::new();
    let mut kinds: Vec<i32> = Vec::new();
    for ci in &sb.control_input {
        if ci.name.is_empty() {
            return err(format!(
                "sequence batching control tensor must have a name for {m}"
            ));
        }
        if names.contains(&ci.name.as_str()) {
            return err(format!(
                "sequence batching control tensor '{}' is specified for multiple control kinds for {m}",
                ci.name
            ));
        }
        names.push(&ci.name);
        for c in &ci.control {
            let k = kind_name(c.kind);
            if Kind::try_from(c.kind).is_err() {
                return err(format!(
                    "sequence batching control tensor '{}' has unknown control kind {} for {m}",
                    ci.name, c.kind
                ));
            }
            if kinds.contains(&c.kind) {
                return err(format!(
                    "sequence batching specifies multiple {k} tensors for {m}"
                ));
            }
            kinds.push(c.kind);
            let lists = [
                ("int32_false_true", c.int32_false_true.len()),
                ("fp32_false_true", c.fp32_false_true.len()),
                ("bool_false_true", c.bool_false_true.len()),
            ];
            let given: Vec<_> = lists.iter().filter(|(_, n)| *n > 0).collect();
            if c.kind == Kind::ControlSequenceCorrid as i32 {
                if !given.is_empty() {
                    return err(format!(
                        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_CORRID for {m}"
                    ));
                }
                use crate::config::pb::DataType as T;
                let allowed = [
                    T::TypeUint64,
                    T::TypeInt64,
                    T::TypeUint32,
                    T::TypeInt32,
                    T::TypeString,
                ];
                if !allowed.iter().any(|t| *t as i32 == c.data_type) {
                    return err(format!(
                        "unexpected data type for control CONTROL_SEQUENCE_CORRID for {m}. Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
                    ));
                }
                continue;
            }
            match given.as_slice() {
                [] => {
                    return err(format!(
                        "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for {k} for {m}"
                    ))
                }
                [(list, n)] if *n != 2 => {
                    return err(format!(
                        "sequence batching control '{list}' must have exactly 2 entries for {k} for {m}"
                    ))
                }
                [_] => {}
                _ => {
                    return err(format!(
                        "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and 'bool_false_true' for {k} for {m}"
                    ))
                }
            }
        }
    }
    match &sb.strategy_choice {
        Some(Strategy::Direct(d)) if !(0.0..=1.0).contains(&d.minimum_slot_utilization) => {
            return err(format!(
                "sequence batching minimum slot utilization must be in range (0.0, 1.0] for {m}"
            ));
        }
        Some(Strategy::Direct(_)) => {}
        Some(Strategy::Oldest(o)) => {
            if o.max_candidate_sequences < 0 {
                return err(format!(
                    "sequence batching max_candidate_sequences must be >= 0 for {m}"
                ));
            }
            for &p in &o.preferred_batch_size {
                if p < 1 {
                    return err(format!(
                        "sequence batching preferred batch size must be positive for {m}"
                    ));
                }
                if p > cfg.max_batch_size.max(1) {
                    return err(format!(
                        "sequence batching preferred batch size must be <= max batch size for {m}"
                    ));
                }
            }
        }
        None => {}
    }
    let mut state_inputs: Vec<&str> = Vec::new();
    for s in &sb.state {
        let input = &s.input_name;
        if input.is_empty() || s.output_name.is_empty() {
            return err(format!(
                "model '{m}': every sequence batching state must have an input_name and an output_name"
            ));
        }
        if state_inputs.contains(&input.as_str()) {
            return err(format!(
                "State input name '{input}' specified more than once."
            ));
        }
        state_inputs.push(input);
        if crate::DataType::from_config(s.data_type).is_err() {
            return err(format!(
                "model '{m}': state '{input}' has data_type {}, which is not valid",
                crate::dtype::config_name(s.data_type)
            ));
        }
        if s.dims.is_empty() || s.dims.iter().any(|&d| d < 1 && d != -1) {
            return err(format!(
                "model '{m}': state '{input}' dims {} must be non-empty, each >= 1 or -1",
                crate::tensor::shape_str(&s.dims)
            ));
        }
        if s.initial_state.len() > 1 {
            return err(format!(
                "initial_state field for state input '{input}' must contain exactly one or zero element. Found '{}' elements.",
                s.initial_state.len()
            ));
        }
        if let Some(init) = s.initial_state.first() {
            if init.data_type != s.data_type {
                return err(format!(
                    "The data type used for 'initial_state' field of state '{input}' does not match the state data type."
                ));
            }
            if init.name.is_empty() {
                return err(format!(
                    "Field 'name' must be set when using initial_state for state input '{input}'."
                ));
            }
            if init.dims.len() != s.dims.len() {
                return err(format!(
                    "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input '{input}'. {} != {}",
                    init.dims.len(),
                    s.dims.len()
                ));
            }
            if init.dims.iter().any(|&d| d < 0) {
                return err(format!(
                    "'initial_state' field for state input name '{input}' contains variable dimensions."
                ));
            }
            for (&a, &b) in init.dims.iter().zip(&s.dims) {
                if b != -1 && a != b {
                    return err(format!(
                        "'initial_state' dim for input name '{input}' doesn't match 'state' dim description. {a} != {b}"
                    ));
                }
            }
            match &init.state_data {
                None | Some(StateData::ZeroData(false)) => {
                    return err(format!(
                        "initial_state setting expects state'{input}' to have state_data set"
                    ))
                }
                Some(StateData::DataFile(f)) => {
                    let inside = !f.is_empty()
                        && std::path::Path::new(f)
                            .components()
                            .all(|c| matches!(c, std::path::Component::Normal(_)));
                    if !inside {
                        return err(format!(
                            "model '{m}': initial_state data_file '{f}' of state '{input}' must be a relative path inside the model's initial_state folder"
                        ));
                    }
                }
                Some(StateData::ZeroData(true)) => {}
            }
        }
    }
    // The batcher feeds these itself: a client must not be asked for them.
    for extra in extra_inputs(cfg) {
        if cfg.input.iter().any(|i| i.name == extra.name) {
            return err(format!(
                "model '{m}': '{}' is both a model input and a sequence batching control or state input; remove it from 'input'",
                extra.name
            ));
        }
    }
    for extra in extra_outputs(cfg) {
        if cfg.output.iter().any(|o| o.name == extra.name) {
            return err(format!(
                "model '{m}': '{}' is both a model output and a sequence batching state output; remove it from 'output'",
                extra.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(params: &[(&str, Parameter)]) -> InferRequest {
        let mut r = InferRequest::default();
        for (k, v) in params {
            r.parameters.insert((*k).into(), v.clone());
        }
        r
    }

    #[test]
    fn sequence_parameters_parse_like_tritons_frontends() {
        let r = with(&[
            ("sequence_id", Parameter::Int(7)),
            ("sequence_start", Parameter::Bool(true)),
        ]);
        assert_eq!(
            r.sequence().unwrap(),
            SequenceFlags {
                id: Some(CorrelationId::Number(7)),
                start: true,
                end: false
            }
        );
        let r = with(&[
            ("sequence_id", Parameter::String("abc".into())),
            ("sequence_end", Parameter::Bool(true)),
        ]);
        let s = r.sequence().unwrap();
        assert_eq!(s.id, Some(CorrelationId::Text("abc".into())));
        assert!(s.end && !s.start);
        assert_eq!(
            with(&[("sequence_id", Parameter::Int(0))])
                .sequence()
                .unwrap()
                .id,
            None
        );
        assert_eq!(InferRequest::default().sequence().unwrap().id, None);
        assert!(with(&[("sequence_id", Parameter::Double(1.5))])
            .sequence()
            .is_err());
        assert!(with(&[("sequence_id", Parameter::Int(-3))])
            .sequence()
            .is_err());
        assert!(with(&[("sequence_start", Parameter::Int(1))])
            .sequence()
            .is_err());
    }
}
