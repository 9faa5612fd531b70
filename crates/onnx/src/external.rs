//! External data of a model loaded from memory (signed or encrypted models,
//! whose bytes come from their repository agents, never from the file again).
//!
//! An ONNX model over 2 GB keeps its weights in files beside it
//! (`TensorProto.external_data`: `location`, `offset`, `length`). A session
//! built from memory would read them by path, past the agents; instead each
//! external initializer of the main graph is read here through the model's
//! [`FileGate`] (checked, decrypted) and handed to ONNX Runtime as a tensor
//! (`AddExternalInitializers`), so nothing of the model is read from disk
//! unchecked. External data anywhere else (a subgraph's initializer, a
//! `Constant` node's tensor, a sparse initializer) fails the load as
//! unsupported.

use std::collections::HashMap;
use std::path::{Component, Path};
use std::sync::Arc;

use ort::session::builder::SessionBuilder;
use ort::value::{DynValue, Tensor};
use prost::Message;
use tern_core::backend::FileGate;
use tern_core::error::{Error, Result};

/// The parts of `onnx.ModelProto` that locate external data (other fields
/// are skipped by the decoder).
#[derive(Clone, PartialEq, Message)]
struct Model {
    #[prost(message, optional, tag = "7")]
    graph: Option<Graph>,
}

#[derive(Clone, PartialEq, Message)]
struct Graph {
    #[prost(message, repeated, tag = "1")]
    node: Vec<Node>,
    #[prost(message, repeated, tag = "5")]
    initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "15")]
    sparse_initializer: Vec<SparseTensor>,
}

#[derive(Clone, PartialEq, Message)]
struct Node {
    #[prost(message, repeated, tag = "5")]
    attribute: Vec<Attribute>,
}

#[derive(Clone, PartialEq, Message)]
struct Attribute {
    #[prost(message, optional, tag = "5")]
    t: Option<TensorProto>,
    #[prost(message, optional, tag = "6")]
    g: Option<Graph>,
    #[prost(message, repeated, tag = "10")]
    tensors: Vec<TensorProto>,
    #[prost(message, repeated, tag = "11")]
    graphs: Vec<Graph>,
}

#[derive(Clone, PartialEq, Message)]
struct SparseTensor {
    #[prost(message, optional, tag = "1")]
    values: Option<TensorProto>,
    #[prost(message, optional, tag = "2")]
    indices: Option<TensorProto>,
}

#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    #[prost(int64, repeated, tag = "1")]
    dims: Vec<i64>,
    #[prost(int32, tag = "2")]
    data_type: i32,
    #[prost(string, tag = "8")]
    name: String,
    #[prost(message, repeated, tag = "13")]
    external_data: Vec<Entry>,
    #[prost(int32, tag = "14")]
    data_location: i32,
}

#[derive(Clone, PartialEq, Message)]
struct Entry {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "2")]
    value: String,
}

/// `TensorProto.DataLocation.EXTERNAL`.
const EXTERNAL: i32 = 1;

impl TensorProto {
    fn is_external(&self) -> bool {
        self.data_location == EXTERNAL
    }

    fn entry(&self, key: &str) -> Option<&str> {
        self.external_data
            .iter()
            .find(|e| e.key == key)
            .map(|e| e.value.as_str())
    }
}

/// An external initializer of the main graph: where its bytes are and what
/// they hold.
#[derive(Debug, PartialEq)]
struct Initializer {
    name: String,
    location: String,
    offset: usize,
    length: Option<usize>,
    dims: Vec<i64>,
    data_type: i32,
}

/// The main graph's external initializers in `model` (an ONNX file's
/// bytes); external data anywhere else is refused.
fn initializers(model: &[u8], file: &Path) -> Result<Vec<Initializer>> {
    let bad = |why: String| Error::invalid_arg(format!("'{}': {why}", file.display()));
    let model = Model::decode(model).map_err(|e| bad(format!("not an ONNX model: {e}")))?;
    let Some(graph) = model.graph else {
        return Ok(Vec::new());
    };
    if let Some(elsewhere) = external_outside_initializers(&graph) {
        return Err(Error::unsupported(format!(
            "'{}': tensor '{elsewhere}' keeps its data in an external file outside the main \
             graph's initializers, which a model loaded from memory (under a repository agent) \
             cannot read",
            file.display()
        )));
    }
    let number = |t: &TensorProto, key: &str| -> Result<Option<usize>> {
        t.entry(key)
            .map(|v| {
                v.parse::<usize>().map_err(|_| {
                    bad(format!(
                        "tensor '{}': external data {key} '{v}' is not a number",
                        t.name
                    ))
                })
            })
            .transpose()
    };
    let mut out = Vec::new();
    for t in graph.initializer.iter().filter(|t| t.is_external()) {
        let location = t.entry("location").ok_or_else(|| {
            bad(format!(
                "tensor '{}': external data without a location",
                t.name
            ))
        })?;
        let relative = Path::new(location);
        if location.is_empty()
            || !relative
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(bad(format!(
                "tensor '{}': external data location '{location}' is not a path inside the \
                 model's folder",
                t.name
            )));
        }
        out.push(Initializer {
            name: t.name.clone(),
            location: location.to_string(),
            offset: number(t, "offset")?.unwrap_or(0),
            length: number(t, "length")?,
            dims: t.dims.clone(),
            data_type: t.data_type,
        });
    }
    Ok(out)
}

/// The name of a tensor with external data that is not one of the main
/// graph's initializers (in a subgraph, a node attribute, a sparse tensor).
fn external_outside_initializers(graph: &Graph) -> Option<String> {
    let external = |t: &TensorProto| t.is_external().then(|| t.name.clone());
    for s in &graph.sparse_initializer {
        if let Some(n) = [&s.values, &s.indices]
            .into_iter()
            .flatten()
            .find_map(external)
        {
            return Some(n);
        }
    }
    for a in graph.node.iter().flat_map(|n| &n.attribute) {
        if let Some(n) = a.t.iter().chain(&a.tensors).find_map(external) {
            return Some(n);
        }
        for g in a.g.iter().chain(&a.graphs) {
            if let Some(n) = g.initializer.iter().find_map(external) {
                return Some(n);
            }
            if let Some(n) = external_outside_initializers(g) {
                return Some(n);
            }
        }
    }
    None
}

/// A tensor of `dims` from `bytes` (little-endian elements of ONNX's
/// `data_type`).
fn tensor(init: &Initializer, bytes: &[u8]) -> Result<DynValue> {
    let count: Option<usize> = init
        .dims
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .try_fold(1usize, |n, d| d.and_then(|d| n.checked_mul(d)));
    let size = element_size(init.data_type).ok_or_else(|| {
        Error::unsupported(format!(
            "tensor '{}': external data of ONNX type {} cannot be loaded from memory",
            init.name, init.data_type
        ))
    })?;
    if count.and_then(|c| c.checked_mul(size)) != Some(bytes.len()) {
        return Err(Error::invalid_arg(format!(
            "tensor '{}': {} bytes of external data in '{}' do not hold its shape {:?}",
            init.name,
            bytes.len(),
            init.location,
            init.dims
        )));
    }
    let shape = init.dims.clone();
    let fail = |e: ort::Error| Error::internal(format!("tensor '{}': {e}", init.name));
    macro_rules! make {
        ($t:ty, $from:expr) => {{
            let data: Vec<$t> = bytes.chunks_exact(size).map($from).collect();
            Tensor::from_array((shape, data)).map_err(fail)?.into_dyn()
        }};
    }
    let le2 = |c: &[u8]| [c[0], c[1]];
    let le4 = |c: &[u8]| [c[0], c[1], c[2], c[3]];
    let le8 = |c: &[u8]| [c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]];
    Ok(match init.data_type {
        1 => make!(f32, |c| f32::from_le_bytes(le4(c))),
        2 => make!(u8, |c| c[0]),
        3 => make!(i8, |c| i8::from_le_bytes([c[0]])),
        4 => make!(u16, |c| u16::from_le_bytes(le2(c))),
        5 => make!(i16, |c| i16::from_le_bytes(le2(c))),
        6 => make!(i32, |c| i32::from_le_bytes(le4(c))),
        7 => make!(i64, |c| i64::from_le_bytes(le8(c))),
        9 => make!(bool, |c| c[0] != 0),
        10 => make!(half::f16, |c| half::f16::from_le_bytes(le2(c))),
        11 => make!(f64, |c| f64::from_le_bytes(le8(c))),
        12 => make!(u32, |c| u32::from_le_bytes(le4(c))),
        13 => make!(u64, |c| u64::from_le_bytes(le8(c))),
        16 => make!(half::bf16, |c| half::bf16::from_le_bytes(le2(c))),
        _ => unreachable!("element_size admitted it"),
    })
}

/// Bytes per element of the ONNX types a tensor can be made of here.
fn element_size(data_type: i32) -> Option<usize> {
    Some(match data_type {
        2 | 3 | 9 => 1,
        4 | 5 | 10 | 16 => 2,
        1 | 6 | 12 => 4,
        7 | 11 | 13 => 8,
        _ => return None,
    })
}

/// Adds the external initializers of `model` (the bytes of the file at
/// `path`), read through `gate`, to `builder`. A model without external data
/// leaves it as it is.
pub fn add_initializers(
    mut builder: SessionBuilder,
    model: &[u8],
    path: &Path,
    gate: &Arc<dyn FileGate>,
) -> Result<SessionBuilder> {
    let folder = path.parent().unwrap_or(Path::new("."));
    let mut files: HashMap<String, Vec<u8>> = HashMap::new();
    for init in initializers(model, path)? {
        if !files.contains_key(&init.location) {
            let bytes = gate.read(&folder.join(&init.location))?;
            files.insert(init.location.clone(), bytes);
        }
        let file = &files[&init.location];
        let end = match init.length {
            Some(length) => init.offset.checked_add(length),
            None => Some(file.len()),
        };
        let bytes = end
            .and_then(|end| file.get(init.offset..end))
            .ok_or_else(|| {
                Error::invalid_arg(format!(
                    "tensor '{}': offset {} and length {:?} lie outside '{}' ({} bytes)",
                    init.name,
                    init.offset,
                    init.length,
                    init.location,
                    file.len()
                ))
            })?;
        let value = tensor(&init, bytes)?;
        builder = builder
            .with_external_initializer(&init.name, value)
            .map_err(|e| {
                Error::invalid_arg(format!("external initializer '{}': {e}", init.name))
            })?;
    }
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor_proto(name: &str, entries: &[(&str, &str)]) -> TensorProto {
        TensorProto {
            dims: vec![2, 2],
            data_type: 1,
            name: name.into(),
            external_data: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            data_location: EXTERNAL,
        }
    }

    fn model(graph: Graph) -> Vec<u8> {
        Model { graph: Some(graph) }.encode_to_vec()
    }

    #[test]
    fn the_main_graph_s_external_initializers_are_found() {
        let bytes = model(Graph {
            initializer: vec![
                tensor_proto(
                    "w",
                    &[
                        ("location", "weights.bin"),
                        ("offset", "16"),
                        ("length", "16"),
                    ],
                ),
                TensorProto {
                    name: "inline".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        let found = initializers(&bytes, Path::new("1/model.onnx")).unwrap();
        assert_eq!(
            found,
            vec![Initializer {
                name: "w".into(),
                location: "weights.bin".into(),
                offset: 16,
                length: Some(16),
                dims: vec![2, 2],
                data_type: 1,
            }]
        );
    }

    #[test]
    fn locations_outside_the_folder_and_external_data_elsewhere_are_refused() {
        for location in ["../secret", "/etc/passwd", ""] {
            let bytes = model(Graph {
                initializer: vec![tensor_proto("w", &[("location", location)])],
                ..Default::default()
            });
            let e = initializers(&bytes, Path::new("m.onnx")).unwrap_err();
            assert!(
                e.message.contains("is not a path inside"),
                "{location}: {e}"
            );
        }
        let bytes = model(Graph {
            node: vec![Node {
                attribute: vec![Attribute {
                    t: Some(tensor_proto("c", &[("location", "c.bin")])),
                    ..Default::default()
                }],
            }],
            ..Default::default()
        });
        let e = initializers(&bytes, Path::new("m.onnx")).unwrap_err();
        assert!(e.message.contains("tensor 'c' keeps its data"), "{e}");
        assert!(initializers(b"\xff\xff\xff", Path::new("m.onnx")).is_err());
    }

    #[test]
    fn a_tensor_is_made_only_from_bytes_that_fit_its_shape() {
        let init = Initializer {
            name: "w".into(),
            location: "w.bin".into(),
            offset: 0,
            length: None,
            dims: vec![2, 2],
            data_type: 1,
        };
        assert!(tensor(&init, &[0; 12]).is_err());
        let strings = Initializer {
            data_type: 8,
            ..init
        };
        assert!(tensor(&strings, &[0; 16]).is_err());
    }
}
