//! Tensors across the LibTorch boundary: a batch's inputs gathered into
//! LibTorch tensors (BYTES as `List[str]`), forward's result flattened into
//! outputs (a tensor, a tuple or list of tensors and string lists, or a
//! `Dict[str, Tensor]`), and outputs copied back into Tern tensors.

use tch::{Device, IValue, Kind};
use tern_core::error::{Error, Result};
use tern_core::{bytes_tensor, DataType, InferRequest, Tensor};
use tern_memory::pool::Block;

/// The LibTorch element type of a Tern data type (BYTES and the unsigned
/// 16/32/64-bit types have none: LibTorch cannot compute on them).
pub fn kind_of(dt: DataType) -> Option<Kind> {
    Some(match dt {
        DataType::Bool => Kind::Bool,
        DataType::Uint8 => Kind::Uint8,
        DataType::Int8 => Kind::Int8,
        DataType::Int16 => Kind::Int16,
        DataType::Int32 => Kind::Int,
        DataType::Int64 => Kind::Int64,
        DataType::Fp16 => Kind::Half,
        DataType::Bf16 => Kind::BFloat16,
        DataType::Fp32 => Kind::Float,
        DataType::Fp64 => Kind::Double,
        _ => return None,
    })
}

/// The Tern data type of a LibTorch element type.
pub fn dtype_of(kind: Kind) -> Option<DataType> {
    Some(match kind {
        Kind::Bool => DataType::Bool,
        Kind::Uint8 => DataType::Uint8,
        Kind::Int8 => DataType::Int8,
        Kind::Int16 => DataType::Int16,
        Kind::Int => DataType::Int32,
        Kind::Int64 => DataType::Int64,
        Kind::Half => DataType::Fp16,
        Kind::BFloat16 => DataType::Bf16,
        Kind::Float => DataType::Fp32,
        Kind::Double => DataType::Fp64,
        _ => return None,
    })
}

/// Triton's name for a LibTorch element type in messages (`TYPE_FP32`).
fn config_type_name(kind: Kind) -> String {
    dtype_of(kind)
        .map(type_name_of)
        .unwrap_or_else(|| "TYPE_INVALID".into())
}

/// Triton's config spelling of a data type (`TYPE_FP32`, `TYPE_STRING`).
fn type_name_of(dt: DataType) -> String {
    tern_core::dtype::config_name(dt.to_config() as i32)
}

/// One of a batch's inputs as forward takes it. Numeric tensors view host memory pushed to
/// `staging`, which must outlive every tensor of the forward call.
pub fn gather(
    batch: &[InferRequest],
    name: &str,
    batched: bool,
    device: Device,
    staging: &mut Vec<Block>,
) -> Result<IValue> {
    let parts: Vec<&Tensor> = batch
        .iter()
        .map(|r| {
            r.input(name)
                .ok_or_else(|| Error::invalid_arg(format!("input '{name}' is missing")))
        })
        .collect::<Result<_>>()?;
    let first = parts[0];
    let mut shape = first.shape.clone();
    if batched && parts.len() > 1 {
        shape[0] = parts
            .iter()
            .map(|t| t.shape.first().copied().unwrap_or(1))
            .sum();
    }
    if first.dtype == DataType::Bytes {
        if shape.len() != 1 {
            return Err(Error::internal(format!(
                "Triton only supports 1 dimensional List of String as input for '{name}' (its shape is {})",
                tern_core::tensor::shape_str(&shape)
            )));
        }
        let mut strings = Vec::new();
        for t in &parts {
            for (i, s) in bytes_tensor::decode(&t.data)?.into_iter().enumerate() {
                strings.push(String::from_utf8(s.to_vec()).map_err(|_| {
                    Error::invalid_arg(format!(
                        "input '{name}': element {i} is not valid UTF-8 (TorchScript strings are UTF-8)"
                    ))
                })?);
            }
        }
        return Ok(IValue::StringList(strings));
    }
    let kind = kind_of(first.dtype).ok_or_else(|| {
        Error::invalid_arg(format!(
            "input '{name}' has data type {}, which LibTorch does not support",
            first.dtype
        ))
    })?;
    // One copy of every request's bytes into a recycled host block that the tensor views (the
    // block stays in `staging` until the outputs are copied out). A model may write to its
    // inputs in place: it writes to Tern's copy, never to a request buffer or a client's
    // shared memory. When the pool cannot serve, LibTorch gets its own copy instead.
    let total: usize = parts.iter().map(|t| t.data.len()).sum();
    let pools = tern_memory::pool::pools();
    let host = match device {
        Device::Cpu => &pools.host,
        _ => pools.pinned.as_ref().unwrap_or(&pools.host),
    };
    let mut block = host.take(total)?;
    let buf = block.as_mut_slice();
    let mut at = 0;
    for t in &parts {
        buf[at..at + t.data.len()].copy_from_slice(&t.data);
        at += t.data.len();
    }
    let pooled = block.pooled();
    let tensor = if pooled {
        // SAFETY: the block holds exactly `shape`'s elements (validated sizes), is aligned for
        // every element type, and outlives the tensor: it is kept in `staging` until the batch's
        // outputs are copied out, and pool memory is recycled, never freed.
        let t = unsafe {
            tch::Tensor::f_from_blob(block.ptr() as *const u8, &shape, &[], kind, Device::Cpu)
        };
        staging.push(block);
        t
    } else {
        tch::Tensor::f_from_data_size(&block.as_mut_slice()[..total], &shape, kind)
    }
    .map_err(|e| Error::internal(format!("input '{name}': {e}")))?;
    let tensor = if device == Device::Cpu {
        tensor
    } else {
        tensor
            .f_to_device(device)
            .map_err(|e| Error::internal(format!("input '{name}': copy to {device:?}: {e}")))?
    };
    Ok(IValue::Tensor(tensor))
}

/// One value of forward's result.
#[derive(Debug)]
pub enum Value {
    /// A tensor.
    Tensor(tch::Tensor),
    /// A `List[str]`.
    Strings(Vec<String>),
}

/// Forward's result: values by position, or by name for a dictionary.
#[derive(Debug)]
pub enum Outputs {
    /// A tensor, a tuple, or a list.
    Positional(Vec<Value>),
    /// A `Dict[str, Tensor]`.
    Named(Vec<(String, Value)>),
}

const SHAPES: &str =
    "output must be of type Tensor, List[str] or Tuple containing one of these two types. \
                      It should not be a List / Dictionary of Tensors or a Scalar";

/// The strings of a list whose items are all strings (tch returns `List[str]` as a generic list).
fn strings(items: &[IValue]) -> Option<Vec<String>> {
    items
        .iter()
        .map(|v| match v {
            IValue::String(s) => Some(s.clone()),
            _ => None,
        })
        .collect()
}

fn element(v: IValue, at: usize) -> Result<Value> {
    match v {
        IValue::Tensor(t) => Ok(Value::Tensor(t)),
        IValue::StringList(s) => Ok(Value::Strings(s)),
        IValue::GenericList(items) => strings(&items).map(Value::Strings).ok_or_else(|| {
            Error::internal(format!(
                "output at index {at} must be of type Tensor or List[str], received List"
            ))
        }),
        other => Err(Error::internal(format!(
            "output at index {at} must be of type Tensor or List[str], received {}",
            type_name(&other)
        ))),
    }
}

fn type_name(v: &IValue) -> &'static str {
    match v {
        IValue::None => "None",
        IValue::Tensor(_) => "Tensor",
        IValue::Double(_) => "float",
        IValue::Int(_) => "int",
        IValue::Bool(_) => "bool",
        IValue::Tuple(_) => "Tuple",
        IValue::IntList(_) => "List[int]",
        IValue::DoubleList(_) => "List[float]",
        IValue::BoolList(_) => "List[bool]",
        IValue::String(_) => "str",
        IValue::StringList(_) => "List[str]",
        IValue::TensorList(_) => "List[Tensor]",
        IValue::GenericList(_) => "List",
        IValue::GenericDict(_) => "Dict",
        IValue::Object(_) => "Object",
        IValue::Device(_) => "Device",
        _ => "an unsupported value",
    }
}

/// Flattens forward's result. Beyond Triton, a top-level `List[Tensor]` is
/// taken like a tuple and a `Dict[str, Tensor]` by output name.
pub fn flatten(result: IValue) -> Result<Outputs> {
    Ok(Outputs::Positional(match result {
        IValue::Tensor(t) => vec![Value::Tensor(t)],
        IValue::StringList(s) => vec![Value::Strings(s)],
        IValue::GenericList(items) if !items.is_empty() && strings(&items).is_some() => {
            vec![Value::Strings(strings(&items).unwrap_or_default())]
        }
        IValue::Tuple(items) | IValue::GenericList(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| element(v, i))
            .collect::<Result<_>>()?,
        IValue::TensorList(ts) => ts.into_iter().map(Value::Tensor).collect(),
        IValue::GenericDict(entries) => {
            let mut named = Vec::with_capacity(entries.len());
            for (k, v) in entries {
                let IValue::String(key) = k else {
                    return Err(Error::internal(format!(
                        "a dictionary output must have string keys, got {}",
                        type_name(&k)
                    )));
                };
                let value = element(v, named.len())?;
                named.push((key, value));
            }
            return Ok(Outputs::Named(named));
        }
        _ => return Err(Error::internal(SHAPES)),
    }))
}

impl Outputs {
    /// Takes the value for config output `name` (`index` for positional results).
    pub fn take(&mut self, name: &str, index: usize) -> Result<Value> {
        match self {
            Outputs::Positional(values) => {
                let count = values.len();
                let slot = values.get_mut(index).ok_or_else(|| {
                    Error::invalid_arg(format!(
                        "The output {name} in the model configuration refers to an output index which doesn't exist. \
                         This model has {count} outputs"
                    ))
                })?;
                Ok(std::mem::replace(slot, Value::Strings(Vec::new())))
            }
            Outputs::Named(entries) => {
                let pos = entries.iter().position(|(k, _)| k == name).ok_or_else(|| {
                    let keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).collect();
                    Error::invalid_arg(format!(
                        "output '{name}' is not in the dictionary forward returned (keys: {})",
                        keys.join(", ")
                    ))
                })?;
                Ok(entries.swap_remove(pos).1)
            }
        }
    }
}

/// Copies one output value into a Tern tensor, checking it against the config's data type.
pub fn output(name: &str, value: Value, expected: DataType) -> Result<Tensor> {
    match value {
        Value::Strings(s) => {
            if expected != DataType::Bytes {
                return Err(Error::invalid_arg(format!(
                    "configuration expects datatype {} for output '{name}', model provides List[str]",
                    type_name_of(expected)
                )));
            }
            Ok(Tensor::new(
                name,
                DataType::Bytes,
                vec![s.len() as i64],
                bytes_tensor::encode(s.iter().map(String::as_bytes)),
            ))
        }
        Value::Tensor(t) => {
            if t.dim() == 0 {
                return Err(Error::invalid_arg(format!(
                    "output '{name}' is a scalar which is not supported."
                )));
            }
            let kind = t.kind();
            let dt = dtype_of(kind).filter(|d| *d == expected).ok_or_else(|| {
                Error::invalid_arg(format!(
                    "configuration expects datatype {} for output '{name}', model provides {}",
                    type_name_of(expected),
                    config_type_name(kind)
                ))
            })?;
            let t = t
                .f_to_device(Device::Cpu)
                .and_then(|t| t.f_contiguous())
                .map_err(|e| Error::internal(format!("output '{name}': {e}")))?;
            let shape = t.size();
            let n = t.numel();
            let size = dt.size().unwrap_or(1);
            let mut data = vec![0u8; n * size];
            t.f_copy_data_u8(&mut data, n)
                .map_err(|e| Error::internal(format!("output '{name}': {e}")))?;
            Ok(Tensor::new(name, dt, shape, data))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_tables_agree() {
        for dt in DataType::all() {
            if let Some(k) = kind_of(dt) {
                assert_eq!(dtype_of(k), Some(dt));
            }
        }
        assert_eq!(kind_of(DataType::Uint32), None);
        assert_eq!(kind_of(DataType::Bytes), None);
    }

    #[test]
    fn inputs_gather_and_outputs_come_back() {
        let req = |v: &[f32]| InferRequest {
            inputs: vec![Tensor::new(
                "x",
                DataType::Fp32,
                vec![1, v.len() as i64],
                v.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>(),
            )],
            ..Default::default()
        };
        let batch = [req(&[1.0, 2.0]), req(&[3.0, 4.0])];
        let mut staging = Vec::new();
        let IValue::Tensor(t) = gather(&batch, "x", true, Device::Cpu, &mut staging).unwrap()
        else {
            panic!("not a tensor")
        };
        assert_eq!(t.size(), vec![2, 2]);
        let out = output("y", Value::Tensor(t * 2.0), DataType::Fp32).unwrap();
        assert_eq!(out.shape, vec![2, 2]);
        assert_eq!(&out.data[..4], &2.0f32.to_le_bytes());
        let e = output(
            "y",
            Value::Tensor(tch::Tensor::from_slice(&[1i64])),
            DataType::Fp32,
        )
        .unwrap_err();
        assert_eq!(
            e.message,
            "configuration expects datatype TYPE_FP32 for output 'y', model provides TYPE_INT64"
        );
        let e = output(
            "y",
            Value::Tensor(tch::Tensor::from(1.0f32)),
            DataType::Fp32,
        )
        .unwrap_err();
        assert_eq!(e.message, "output 'y' is a scalar which is not supported.");
    }

    #[test]
    fn strings_go_in_as_lists_and_refuse_bad_utf8() {
        let req = |s: &[&[u8]]| InferRequest {
            inputs: vec![Tensor::new(
                "s",
                DataType::Bytes,
                vec![s.len() as i64],
                bytes_tensor::encode(s),
            )],
            ..Default::default()
        };
        let v = gather(
            &[req(&[b"ab", b"c"])],
            "s",
            false,
            Device::Cpu,
            &mut Vec::new(),
        )
        .unwrap();
        assert!(matches!(v, IValue::StringList(ref s) if s == &["ab", "c"]));
        let e = gather(&[req(&[b"\xff"])], "s", false, Device::Cpu, &mut Vec::new()).unwrap_err();
        assert!(e.message.contains("not valid UTF-8"), "{}", e.message);
    }

    #[test]
    fn results_flatten_like_triton() {
        let t = || IValue::Tensor(tch::Tensor::from_slice(&[1.0f32]));
        let mut o = flatten(IValue::Tuple(vec![
            t(),
            IValue::StringList(vec!["a".into()]),
        ]))
        .unwrap();
        assert!(matches!(o.take("b", 1).unwrap(), Value::Strings(_)));
        let e = o.take("c", 2).unwrap_err();
        assert!(
            e.message.contains("This model has 2 outputs"),
            "{}",
            e.message
        );
        assert!(flatten(IValue::Int(3)).is_err());
        let e = flatten(IValue::Tuple(vec![IValue::Int(1)])).unwrap_err();
        assert_eq!(
            e.message,
            "output at index 0 must be of type Tensor or List[str], received int"
        );
        let mut d = flatten(IValue::GenericDict(vec![(IValue::String("k".into()), t())])).unwrap();
        assert!(matches!(d.take("k", 0).unwrap(), Value::Tensor(_)));
        assert!(d
            .take("z", 0)
            .unwrap_err()
            .message
            .contains("not in the dictionary"));
    }
}
