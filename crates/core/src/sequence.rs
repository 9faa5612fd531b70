//! Sequences (stateful models): the correlation id and START/END flags a
//! request carries as Triton's `sequence_id`, `sequence_start` and
//! `sequence_end` parameters (HTTP JSON and gRPC alike), and what the
//! sequence batcher's config declares besides the model's own inputs and
//! outputs — control inputs and implicit state — so that backends feed and
//! fetch them.

use std::fmt;

use crate::config::pb::model_sequence_batching::{
    self, control::Kind, initial_state::StateData, Control, InitialState, State,
    StrategyChoice as Strategy,
};
use crate::config::pb::{model_config::SchedulingChoice, ModelConfig, ModelSequenceBatching};
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

/// Outputs the sequence batcher takes from the model beyond its declared
/// ones: every state's `output_name` that is not also a model `output` (one
/// that is, as Triton allows, is produced once and kept for both).
pub fn extra_outputs(cfg: &ModelConfig) -> Vec<ExtraTensor> {
    batching(cfg)
        .map(|sb| {
            sb.state
                .iter()
                .filter(|s| !cfg.output.iter().any(|o| o.name == s.output_name))
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
    validate_control_inputs(sb, &cfg.name)?;
    validate_strategy(sb, cfg)?;
    validate_states(sb, &cfg.name)?;
    validate_batcher_tensors_not_declared(cfg)
}

/// The failure every sequence batching rule reports: an invalid argument.
fn invalid(msg: String) -> Result<()> {
    Err(Error::invalid_arg(msg))
}

/// Control inputs: every tensor named, and named once; every control of a
/// known kind, and each kind given by one tensor only; each control's values
/// as its kind wants them.
fn validate_control_inputs(sb: &ModelSequenceBatching, m: &str) -> Result<()> {
    let mut names: Vec<&str> = Vec::new();
    let mut kinds: Vec<i32> = Vec::new();
    for ci in &sb.control_input {
        if ci.name.is_empty() {
            return invalid(format!(
                "sequence batching control tensor must have a name for {m}"
            ));
        }
        if names.contains(&ci.name.as_str()) {
            return invalid(format!(
                "sequence batching control tensor '{}' is specified for multiple control kinds for {m}",
                ci.name
            ));
        }
        names.push(&ci.name);
        for c in &ci.control {
            if Kind::try_from(c.kind).is_err() {
                return invalid(format!(
                    "sequence batching control tensor '{}' has unknown control kind {} for {m}",
                    ci.name, c.kind
                ));
            }
            if kinds.contains(&c.kind) {
                return invalid(format!(
                    "sequence batching specifies multiple {} tensors for {m}",
                    kind_name(c.kind)
                ));
            }
            kinds.push(c.kind);
            if c.kind == Kind::ControlSequenceCorrid as i32 {
                validate_corrid_control(c, m)?;
            } else {
                validate_flag_control(c, m)?;
            }
        }
    }
    Ok(())
}

/// The `*_false_true` lists a control gives, as (field, length); empty ones
/// left out.
fn false_true_lists(c: &Control) -> Vec<(&'static str, usize)> {
    [
        ("int32_false_true", c.int32_false_true.len()),
        ("fp32_false_true", c.fp32_false_true.len()),
        ("bool_false_true", c.bool_false_true.len()),
    ]
    .into_iter()
    .filter(|(_, n)| *n > 0)
    .collect()
}

/// A CONTROL_SEQUENCE_CORRID control: no `*_false_true` list, and a
/// `data_type` a correlation id fits in.
fn validate_corrid_control(c: &Control, m: &str) -> Result<()> {
    use crate::config::pb::DataType as T;
    if !false_true_lists(c).is_empty() {
        return invalid(format!(
            "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for CONTROL_SEQUENCE_CORRID for {m}"
        ));
    }
    let allowed = [
        T::TypeUint64,
        T::TypeInt64,
        T::TypeUint32,
        T::TypeInt32,
        T::TypeString,
    ];
    if !allowed.iter().any(|t| *t as i32 == c.data_type) {
        return invalid(format!(
            "unexpected data type for control CONTROL_SEQUENCE_CORRID for {m}. Allowed data types are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"
        ));
    }
    Ok(())
}

/// A START, END or READY control: exactly one `*_false_true` list, holding
/// exactly two entries (the "false" and the "true" value).
fn validate_flag_control(c: &Control, m: &str) -> Result<()> {
    let k = kind_name(c.kind);
    match false_true_lists(c).as_slice() {
        [] => invalid(format!(
            "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for {k} for {m}"
        )),
        [(list, n)] if *n != 2 => invalid(format!(
            "sequence batching control '{list}' must have exactly 2 entries for {k} for {m}"
        )),
        [_] => Ok(()),
        _ => invalid(format!(
            "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and 'bool_false_true' for {k} for {m}"
        )),
    }
}

/// The scheduling strategy: Direct's `minimum_slot_utilization` within
/// [0, 1]; Oldest's `max_candidate_sequences` not negative and each preferred
/// batch size between 1 and `max_batch_size` (1 when the model does not batch).
fn validate_strategy(sb: &ModelSequenceBatching, cfg: &ModelConfig) -> Result<()> {
    let m = &cfg.name;
    match &sb.strategy_choice {
        Some(Strategy::Direct(d)) if !(0.0..=1.0).contains(&d.minimum_slot_utilization) => {
            return invalid(format!(
                "sequence batching minimum slot utilization must be in range (0.0, 1.0] for {m}"
            ));
        }
        Some(Strategy::Direct(_)) | None => {}
        Some(Strategy::Oldest(o)) => {
            if o.max_candidate_sequences < 0 {
                return invalid(format!(
                    "sequence batching max_candidate_sequences must be >= 0 for {m}"
                ));
            }
            for &p in &o.preferred_batch_size {
                if p < 1 {
                    return invalid(format!(
                        "sequence batching preferred batch size must be positive for {m}"
                    ));
                }
                if p > cfg.max_batch_size.max(1) {
                    return invalid(format!(
                        "sequence batching preferred batch size must be <= max batch size for {m}"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Implicit state: every state names its input and its output, no input
/// name is used twice, and each state (and its initial state) is well formed.
fn validate_states(sb: &ModelSequenceBatching, m: &str) -> Result<()> {
    let mut state_inputs: Vec<&str> = Vec::new();
    for s in &sb.state {
        let input = &s.input_name;
        if input.is_empty() || s.output_name.is_empty() {
            return invalid(format!(
                "model '{m}': every sequence batching state must have an input_name and an output_name"
            ));
        }
        if state_inputs.contains(&input.as_str()) {
            return invalid(format!(
                "State input name '{input}' specified more than once."
            ));
        }
        state_inputs.push(input);
        validate_state_tensor(s, m)?;
        if let Some(init) = s.initial_state.first() {
            validate_initial_state(init, s, m)?;
        }
    }
    Ok(())
}

/// One state's own description: a valid data type, non-empty dims each
/// >= 1 or -1, and at most one initial state.
fn validate_state_tensor(s: &State, m: &str) -> Result<()> {
    let input = &s.input_name;
    if crate::DataType::from_config(s.data_type).is_err() {
        return invalid(format!(
            "model '{m}': state '{input}' has data_type {}, which is not valid",
            crate::dtype::config_name(s.data_type)
        ));
    }
    if s.dims.is_empty() || s.dims.iter().any(|&d| d < 1 && d != -1) {
        return invalid(format!(
            "model '{m}': state '{input}' dims {} must be non-empty, each >= 1 or -1",
            crate::tensor::shape_str(&s.dims)
        ));
    }
    if s.initial_state.len() > 1 {
        return invalid(format!(
            "initial_state field for state input '{input}' must contain exactly one or zero element. Found '{}' elements.",
            s.initial_state.len()
        ));
    }
    Ok(())
}

/// A state's initial state: the state's data type, a name, fixed dims of the
/// state's rank that agree with the state's fixed dims, and its data.
fn validate_initial_state(init: &InitialState, s: &State, m: &str) -> Result<()> {
    let input = &s.input_name;
    if init.data_type != s.data_type {
        return invalid(format!(
            "The data type used for 'initial_state' field of state '{input}' does not match the state data type."
        ));
    }
    if init.name.is_empty() {
        return invalid(format!(
            "Field 'name' must be set when using initial_state for state input '{input}'."
        ));
    }
    if init.dims.len() != s.dims.len() {
        return invalid(format!(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input '{input}'. {} != {}",
            init.dims.len(),
            s.dims.len()
        ));
    }
    if init.dims.iter().any(|&d| d < 0) {
        return invalid(format!(
            "'initial_state' field for state input name '{input}' contains variable dimensions."
        ));
    }
    for (&a, &b) in init.dims.iter().zip(&s.dims) {
        if b != -1 && a != b {
            return invalid(format!(
                "'initial_state' dim for input name '{input}' doesn't match 'state' dim description. {a} != {b}"
            ));
        }
    }
    validate_initial_state_data(init, input, m)
}

/// Where an initial state's values come from: `zero_data: true`, or a
/// `data_file` inside the model's `initial_state` folder (a non-empty path of
/// plain components only: no root, no `.` or `..`).
fn validate_initial_state_data(init: &InitialState, input: &str, m: &str) -> Result<()> {
    match &init.state_data {
        None | Some(StateData::ZeroData(false)) => invalid(format!(
            "initial_state setting expects state'{input}' to have state_data set"
        )),
        Some(StateData::DataFile(f)) => {
            let inside = !f.is_empty()
                && std::path::Path::new(f)
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)));
            if inside {
                Ok(())
            } else {
                invalid(format!(
                    "model '{m}': initial_state data_file '{f}' of state '{input}' must be a relative path inside the model's initial_state folder"
                ))
            }
        }
        Some(StateData::ZeroData(true)) => Ok(()),
    }
}

/// The tensors the batcher feeds (control and state inputs) must not also be
/// the model's declared inputs: a client must not be asked for them. (A state
/// output may be a declared output too: the client then gets it as well.)
fn validate_batcher_tensors_not_declared(cfg: &ModelConfig) -> Result<()> {
    let m = &cfg.name;
    for extra in extra_inputs(cfg) {
        if cfg.input.iter().any(|i| i.name == extra.name) {
            return invalid(format!(
                "model '{m}': '{}' is both a model input and a sequence batching control or state input; remove it from 'input'",
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

    #[test]
    fn strategy_pass_bounds_utilization_candidates_and_preferred_sizes() {
        use model_sequence_batching::{StrategyDirect, StrategyOldest};
        let check = |max_batch_size: i32, s: Strategy| {
            let cfg = ModelConfig {
                name: "m".into(),
                max_batch_size,
                ..Default::default()
            };
            let sb = ModelSequenceBatching {
                strategy_choice: Some(s),
                ..Default::default()
            };
            validate_strategy(&sb, &cfg).map_err(|e| e.message)
        };
        let direct = |u: f32| {
            Strategy::Direct(StrategyDirect {
                minimum_slot_utilization: u,
                ..Default::default()
            })
        };
        let oldest = |candidates: i32, preferred: Vec<i32>| {
            Strategy::Oldest(StrategyOldest {
                max_candidate_sequences: candidates,
                preferred_batch_size: preferred,
                ..Default::default()
            })
        };
        assert!(check(4, direct(0.5)).is_ok());
        assert!(check(4, direct(1.5))
            .unwrap_err()
            .contains("minimum slot utilization must be in range (0.0, 1.0] for m"));
        assert!(check(4, oldest(2, vec![1, 4])).is_ok());
        assert!(check(4, oldest(-1, vec![]))
            .unwrap_err()
            .contains("max_candidate_sequences must be >= 0"));
        assert!(check(4, oldest(0, vec![0]))
            .unwrap_err()
            .contains("preferred batch size must be positive"));
        assert!(check(4, oldest(0, vec![5]))
            .unwrap_err()
            .contains("must be <= max batch size"));
        // A model that does not batch still takes a preferred size of 1.
        assert!(check(0, oldest(0, vec![1])).is_ok());
        assert!(check(0, oldest(0, vec![2])).is_err());
    }

    #[test]
    fn initial_state_data_is_zeros_or_a_file_inside_the_folder() {
        let check = |data: Option<StateData>| {
            let init = InitialState {
                state_data: data,
                ..Default::default()
            };
            validate_initial_state_data(&init, "I", "m").map_err(|e| e.message)
        };
        let file = |f: &str| Some(StateData::DataFile(f.into()));
        assert!(check(Some(StateData::ZeroData(true))).is_ok());
        assert!(check(file("init.bin")).is_ok());
        assert!(check(file("sub/init.bin")).is_ok());
        for missing in [None, Some(StateData::ZeroData(false))] {
            assert_eq!(
                check(missing).unwrap_err(),
                "initial_state setting expects state'I' to have state_data set"
            );
        }
        for outside in ["", "/etc/passwd", "../init.bin", "sub/../../init.bin"] {
            assert!(
                check(file(outside))
                    .unwrap_err()
                    .contains("must be a relative path inside the model's initial_state folder"),
                "{outside}"
            );
        }
    }
}
