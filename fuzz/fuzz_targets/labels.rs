//! Label files and the classification extension: a `label_filename` file's
//! text, split into lines as the repository reads it, and an output tensor
//! (any type, shape and values a backend may return, of consistent size)
//! through `tern_core::classification::classify`.
//!
//! Invariants: the result is a BYTES tensor of `min(k, classes)` strings per
//! batch item, each `<value>:<index>[:<label>]` with the index in range, the
//! label that line of the file, the value the element's exact value (integer
//! types) or its six-decimal rendering (floats), in descending order.
#![no_main]

use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;
use tern_core::classification::classify;
use tern_core::{bytes_tensor, DataType, Tensor};

#[derive(Arbitrary, Debug)]
struct Input {
    dtype: u8,
    dims: Vec<u8>,
    batched: bool,
    k: u16,
    data: Vec<u8>,
    labels: String,
}

/// Every numeric data type (the table's, without BYTES).
static DTYPES: std::sync::LazyLock<Vec<DataType>> =
    std::sync::LazyLock::new(|| DataType::all().filter(|d| *d != DataType::Bytes).collect());

/// Element `i` as the exact text Triton writes (`std::to_string` of the
/// integer; floats are checked by order only).
fn exact(t: &Tensor, i: usize) -> Option<String> {
    let size = t.dtype.size()?;
    let b = &t.data[i * size..(i + 1) * size];
    let mut w = [0u8; 8];
    w[..size].copy_from_slice(b);
    Some(match t.dtype {
        DataType::Bool
        | DataType::Uint8
        | DataType::Uint16
        | DataType::Uint32
        | DataType::Uint64 => u64::from_le_bytes(w).to_string(),
        DataType::Int8 => (b[0] as i8).to_string(),
        DataType::Int16 => i16::from_le_bytes([b[0], b[1]]).to_string(),
        DataType::Int32 => i32::from_le_bytes(b.try_into().ok()?).to_string(),
        DataType::Int64 => i64::from_le_bytes(w).to_string(),
        _ => return None,
    })
}

fuzz_target!(|input: Input| {
    let dtype = DTYPES[usize::from(input.dtype) % DTYPES.len()];
    let shape: Vec<i64> = input
        .dims
        .iter()
        .take(3)
        .map(|&d| i64::from(d % 9))
        .collect();
    let count = tern_core::tensor::element_count(&shape);
    let size = dtype.size().expect("fixed size");
    if input.data.is_empty() && count > 0 {
        return;
    }
    let data: Vec<u8> = input
        .data
        .iter()
        .copied()
        .cycle()
        .take(count * size)
        .collect();
    let t = Tensor::new("prob", dtype, shape.clone(), data);
    t.check_size_as("output").expect("consistent");
    // As the repository reads a label file.
    let labels: Vec<String> = input.labels.lines().map(str::to_string).collect();
    let k = usize::from(input.k);
    let out = classify(&t, k, Some(&labels), input.batched).expect("classifies");
    assert_eq!(out.dtype, DataType::Bytes);
    let batch = if input.batched {
        shape.first().copied().unwrap_or(1).max(1) as usize
    } else {
        1
    };
    let per_item = count / batch;
    let k = k.min(per_item);
    let strings = bytes_tensor::decode(&out.data).expect("bytes");
    assert_eq!(strings.len(), batch * k);
    assert_eq!(tern_core::tensor::element_count(&out.shape), strings.len());
    for (j, s) in strings.iter().enumerate() {
        let s = std::str::from_utf8(s).expect("utf-8");
        let mut parts = s.splitn(3, ':');
        let value = parts.next().expect("value");
        let index: usize = parts.next().expect("index").parse().expect("an index");
        assert!(index < per_item, "{s}");
        assert_eq!(parts.next(), labels.get(index).map(String::as_str), "{s}");
        let element = (j / k.max(1)) * per_item + index;
        if let Some(want) = exact(&t, element) {
            assert_eq!(value, want, "{dtype:?} element {element}");
        }
    }
});
