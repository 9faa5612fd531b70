//! Triton's naming rules that tie config inputs and outputs to a TorchScript
//! module: inputs by forward's argument names, by `<name>__<index>`, or by
//! config order; outputs by `<name>__<index>` or by config order; a single
//! `Dict[str, Tensor]` argument takes the inputs by name.

use tern_core::error::{Error, Result};

/// One argument of a TorchScript method: name and type annotation (`Tensor`, `List[str]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Argument {
    /// Argument name in the scripted source.
    pub name: String,
    /// TorchScript type annotation.
    pub ty: String,
}

/// The forward method of a TorchScript file: its arguments after `self` and its return type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// Arguments in order.
    pub arguments: Vec<Argument>,
    /// Return type annotation.
    pub returns: String,
}

/// Parses the shim's "name\ttype" lines ending with "->\treturns".
pub fn parse_signature(text: &str) -> Result<Signature, String> {
    let mut arguments = Vec::new();
    for line in text.lines() {
        let (name, ty) = line
            .split_once('\t')
            .ok_or_else(|| format!("unexpected signature line '{line}'"))?;
        if name == "->" {
            return Ok(Signature {
                arguments,
                returns: ty.to_string(),
            });
        }
        arguments.push(Argument {
            name: name.to_string(),
            ty: ty.to_string(),
        });
    }
    Err("the signature has no return type".into())
}

/// How the config's inputs reach `forward`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputBinding {
    /// Positional arguments: `order[i]` is the input name passed as argument `i`.
    Positional(Vec<String>),
    /// One `Dict[str, Tensor]` argument holding every input under its name.
    Dict,
}

/// The index after the first `__` of `name` when it is all digits (Triton's
/// `<name>__<index>`; an empty suffix counts as 0, as in Triton).
pub fn named_index(name: &str) -> Option<usize> {
    let (_, suffix) = name.split_once("__")?;
    if !suffix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(suffix.parse().unwrap_or(0))
}

/// Binds `inputs` (the config's inputs followed by the sequence batcher's
/// control and state inputs) to forward's arguments as Triton does.
pub fn bind_inputs(model: &str, inputs: &[String], sig: &Signature) -> Result<InputBinding> {
    if inputs.is_empty() {
        return Err(Error::internal(
            "model configuration must contain at least one input, none were specified.",
        ));
    }
    for (i, arg) in sig.arguments.iter().enumerate() {
        if arg.ty.starts_with("Dict[") {
            if i > 0 {
                return Err(Error::internal(
                    "Multiple inputs of kind DictType were detected. Only a single input of type Dict(str, Tensor) is supported.",
                ));
            }
        } else if arg.ty != "Tensor" && !arg.ty.starts_with("List[") {
            return Err(Error::internal(format!(
                "An input of type '{}' was detected in the model. Only a single input of type Dict(str, Tensor) or input(s) of type Tensor are supported.",
                arg.ty
            )));
        }
    }
    if sig.arguments.len() == 1 && sig.arguments[0].ty.starts_with("Dict[") {
        return Ok(InputBinding::Dict);
    }
    if inputs.len() != sig.arguments.len() {
        return Err(Error::invalid_arg(format!(
            "unable to load model '{model}', configuration expects {} inputs, model provides {}",
            inputs.len(),
            sig.arguments.len()
        )));
    }
    let n = inputs.len();
    let mut order: Vec<Option<String>> = vec![None; n];
    let by_argument: Option<Vec<usize>> = inputs
        .iter()
        .map(|name| sig.arguments.iter().position(|a| &a.name == name))
        .collect();
    let indices: Vec<usize> = if let Some(idx) = by_argument {
        idx
    } else if let Some(idx) = inputs
        .iter()
        .map(|name| named_index(name))
        .collect::<Option<Vec<usize>>>()
    {
        idx
    } else {
        if let Some(name) = inputs.iter().find(|n| n.contains("__")) {
            tracing::warn!(
                "input '{name}' or previous input(s) are neither an input argument to the model '{model}' \
                 nor do they follow the <name>__<index> naming convention. Falling back to enforcing strict \
                 ordering from model configuration."
            );
        }
        (0..n).collect()
    };
    for (name, &i) in inputs.iter().zip(&indices) {
        // Triton writes past its argument vector here; Tern names the problem.
        let slot = order.get_mut(i).ok_or_else(|| {
            Error::invalid_arg(format!(
                "input '{name}' names argument index {i}, but forward takes {n} argument(s)"
            ))
            .for_model(model)
        })?;
        if let Some(other) = slot.replace(name.clone()) {
            return Err(Error::invalid_arg(format!(
                "inputs '{other}' and '{name}' both name argument index {i}"
            ))
            .for_model(model));
        }
    }
    Ok(InputBinding::Positional(
        order.into_iter().map(Option::unwrap_or_default).collect(),
    ))
}

/// The index into the model's flattened result for each config output
/// (`<name>__<index>` when every output follows it, else config order).
pub fn bind_outputs(model: &str, outputs: &[String]) -> Result<Vec<usize>> {
    if outputs.is_empty() {
        return Err(Error::internal(
            "model configuration must contain at least one output, none were specified.",
        ));
    }
    if let Some(idx) = outputs
        .iter()
        .map(|n| named_index(n))
        .collect::<Option<Vec<usize>>>()
    {
        return Ok(idx);
    }
    if let Some(name) = outputs.iter().find(|n| named_index(n).is_none()) {
        tracing::warn!(
            "output '{name}' or previous output(s) of the model '{model}' do not follow the <name>__<index> \
             naming convention. Falling back to enforcing strict ordering from model configuration."
        );
    }
    Ok((0..outputs.len()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn signatures_parse() {
        let s =
            parse_signature("x\tTensor\nnames\tList[str]\n->\tTuple[Tensor, Tensor]\n").unwrap();
        assert_eq!(s.arguments.len(), 2);
        assert_eq!(s.arguments[1].name, "names");
        assert_eq!(s.arguments[1].ty, "List[str]");
        assert_eq!(s.returns, "Tuple[Tensor, Tensor]");
        assert!(parse_signature("x\tTensor\n").is_err());
    }

    #[test]
    fn named_indices_follow_triton() {
        assert_eq!(named_index("INPUT__0"), Some(0));
        assert_eq!(named_index("x__12"), Some(12));
        assert_eq!(named_index("X__"), Some(0));
        assert_eq!(named_index("a__b__1"), None);
        assert_eq!(named_index("INPUT0"), None);
    }

    #[test]
    fn inputs_bind_by_argument_name_then_index_then_order() {
        let sig = parse_signature("a\tTensor\nb\tTensor\n->\tTensor\n").unwrap();
        let by_name = bind_inputs("m", &names(&["b", "a"]), &sig).unwrap();
        assert_eq!(by_name, InputBinding::Positional(names(&["a", "b"])));
        let by_index = bind_inputs("m", &names(&["IN__1", "IN__0"]), &sig).unwrap();
        assert_eq!(
            by_index,
            InputBinding::Positional(names(&["IN__0", "IN__1"]))
        );
        let by_order = bind_inputs("m", &names(&["y", "x"]), &sig).unwrap();
        assert_eq!(by_order, InputBinding::Positional(names(&["y", "x"])));
        let e = bind_inputs("m", &names(&["a"]), &sig).unwrap_err();
        assert_eq!(
            e.message,
            "unable to load model 'm', configuration expects 1 inputs, model provides 2"
        );
        let e = bind_inputs("m", &names(&["IN__0", "IN__5"]), &sig).unwrap_err();
        assert!(e.message.contains("argument index 5"), "{}", e.message);
        let e = bind_inputs("m", &names(&["IN__0", "X__0"]), &sig).unwrap_err();
        assert!(
            e.message.contains("both name argument index 0"),
            "{}",
            e.message
        );
    }

    #[test]
    fn dict_and_unsupported_arguments() {
        let sig = parse_signature("d\tDict[str, Tensor]\n->\tTensor\n").unwrap();
        assert_eq!(
            bind_inputs("m", &names(&["p", "q", "r"]), &sig).unwrap(),
            InputBinding::Dict
        );
        let sig = parse_signature("x\tTensor\nd\tDict[str, Tensor]\n->\tTensor\n").unwrap();
        assert!(bind_inputs("m", &names(&["x", "d"]), &sig)
            .unwrap_err()
            .message
            .starts_with("Multiple inputs of kind DictType"));
        let sig = parse_signature("x\tint\n->\tTensor\n").unwrap();
        assert!(bind_inputs("m", &names(&["x"]), &sig)
            .unwrap_err()
            .message
            .contains("An input of type 'int' was detected"));
        let sig = parse_signature("->\tTensor\n").unwrap();
        assert!(bind_inputs("m", &[], &sig)
            .unwrap_err()
            .message
            .starts_with("model configuration must contain at least one input"));
    }

    #[test]
    fn outputs_bind_by_index_or_order() {
        assert_eq!(
            bind_outputs("m", &names(&["OUT__1", "OUT__0"])).unwrap(),
            vec![1, 0]
        );
        assert_eq!(bind_outputs("m", &names(&["b", "a"])).unwrap(), vec![0, 1]);
        assert!(bind_outputs("m", &[]).is_err());
    }
}
