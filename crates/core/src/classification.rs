//! The classification extension: an output requested with `classification:
//! N` is replaced by a BYTES tensor holding, per batch item, the top N
//! `"<value>:<index>[:<label>]"` strings in descending value order.

use super::{bytes_tensor, DataType, Tensor};
use crate::error::{Error, Result};

/// Reads element `i` of a numeric tensor as f64.
fn value_at(t: &Tensor, i: usize) -> f64 {
    let d = &t.data;
    macro_rules! read {
        ($ty:ty, $n:expr) => {{
            let mut b = [0u8; $n];
            b.copy_from_slice(&d[i * $n..(i + 1) * $n]);
            <$ty>::from_le_bytes(b) as f64
        }};
    }
    if let Some(v) = integer_at(t, i) {
        return v as f64;
    }
    match t.dtype {
        DataType::Fp32 => read!(f32, 4),
        DataType::Fp64 => read!(f64, 8),
        DataType::Fp16 => {
            half::f16::from_bits(u16::from_le_bytes([d[2 * i], d[2 * i + 1]])).to_f64()
        }
        DataType::Bf16 => {
            half::bf16::from_bits(u16::from_le_bytes([d[2 * i], d[2 * i + 1]])).to_f64()
        }
        _ => 0.0,
    }
}

/// Element `i` of an integer (or BOOL) tensor, exactly: `value_at`'s f64
/// rounds 64-bit integers past 2^53, which would misorder and misprint them.
fn integer_at(t: &Tensor, i: usize) -> Option<i128> {
    let d = &t.data;
    macro_rules! read {
        ($ty:ty, $n:expr) => {{
            let mut b = [0u8; $n];
            b.copy_from_slice(&d[i * $n..(i + 1) * $n]);
            i128::from(<$ty>::from_le_bytes(b))
        }};
    }
    Some(match t.dtype {
        DataType::Bool | DataType::Uint8 => i128::from(d[i]),
        DataType::Int8 => i128::from(d[i] as i8),
        DataType::Uint16 => read!(u16, 2),
        DataType::Int16 => read!(i16, 2),
        DataType::Uint32 => read!(u32, 4),
        DataType::Int32 => read!(i32, 4),
        DataType::Uint64 => read!(u64, 8),
        DataType::Int64 => read!(i64, 8),
        _ => return None,
    })
}

/// Orders elements `x` and `y` by value, integers exactly.
fn compare_at(t: &Tensor, x: usize, y: usize) -> std::cmp::Ordering {
    match (integer_at(t, x), integer_at(t, y)) {
        (Some(a), Some(b)) => a.cmp(&b),
        _ => value_at(t, x).total_cmp(&value_at(t, y)),
    }
}

fn is_float(dt: DataType) -> bool {
    matches!(
        dt,
        DataType::Fp16 | DataType::Fp32 | DataType::Fp64 | DataType::Bf16
    )
}

/// The most elements per batch item current Triton classifies (it refuses
/// larger outputs with `classification output tensor too large`).
pub const MAX_CLASSIFIED_ELEMENTS: usize = 1_000_000;

/// Replaces `t` by its top-`k` classification strings. `batched` says whether
/// the first dimension is the batch dimension.
pub fn classify(t: &Tensor, k: usize, labels: Option<&[String]>, batched: bool) -> Result<Tensor> {
    if t.dtype == DataType::Bytes {
        return Err(Error::invalid_arg(format!(
            "classification is not supported for BYTES output '{}'",
            t.name
        )));
    }
    let total = t.element_count();
    let batch = if batched {
        t.shape.first().copied().unwrap_or(1).max(1) as usize
    } else {
        1
    };
    let per_item = total.checked_div(batch).unwrap_or(0);
    if per_item > MAX_CLASSIFIED_ELEMENTS {
        return Err(Error::invalid_arg("classification output tensor too large"));
    }
    let k = k.min(per_item);
    let mut out = Vec::new();
    for b in 0..batch {
        let base = b * per_item;
        let mut idx: Vec<usize> = (0..per_item).collect();
        idx.sort_by(|&x, &y| compare_at(t, base + y, base + x).then(x.cmp(&y)));
        for &i in idx.iter().take(k) {
            // As Triton's `std::to_string` of the element: six decimals for
            // floats, integers exactly.
            let mut s = match integer_at(t, base + i) {
                Some(n) if !is_float(t.dtype) => format!("{n}:{i}"),
                _ => format!("{:.6}:{i}", value_at(t, base + i)),
            };
            if let Some(label) = labels.and_then(|l| l.get(i)) {
                s.push(':');
                s.push_str(label);
            }
            bytes_tensor::push(&mut out, s.as_bytes());
        }
    }
    let shape = if batched {
        vec![batch as i64, k as i64]
    } else {
        vec![k as i64]
    };
    Ok(Tensor::new(t.name.clone(), DataType::Bytes, shape, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_with_labels() {
        let vals: Vec<u8> = [0.1f32, 0.7, 0.2, 0.9, 0.0, 0.5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let t = Tensor::new("prob", DataType::Fp32, vec![2, 3], vals);
        let labels: Vec<String> = ["cat", "dog", "fox"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let c = classify(&t, 2, Some(&labels), true).unwrap();
        assert_eq!(c.shape, vec![2, 2]);
        let got: Vec<String> = bytes_tensor::decode(&c.data)
            .unwrap()
            .iter()
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
            .collect();
        assert_eq!(
            got,
            [
                "0.700000:1:dog",
                "0.200000:2:fox",
                "0.900000:0:cat",
                "0.500000:2:fox"
            ]
        );
    }

    /// Found by the `labels` fuzz target: 64-bit integers were read through
    /// f64, so 217020518514230019 printed as 217020518514230016 and values
    /// that differ past 2^53 tied.
    #[test]
    fn large_integers_are_exact_and_ordered() {
        let vals: Vec<u8> = [217020518514230019i64, 217020518514230020, -1]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let t = Tensor::new("score", DataType::Int64, vec![3], vals);
        let c = classify(&t, 3, None, false).unwrap();
        let got: Vec<&[u8]> = bytes_tensor::decode(&c.data).unwrap();
        assert_eq!(
            got,
            [
                &b"217020518514230020:1"[..],
                b"217020518514230019:0",
                b"-1:2"
            ]
        );
        let t = Tensor::new(
            "u",
            DataType::Uint64,
            vec![1],
            u64::MAX.to_le_bytes().to_vec(),
        );
        let c = classify(&t, 1, None, false).unwrap();
        assert_eq!(
            bytes_tensor::decode(&c.data).unwrap(),
            [&b"18446744073709551615:0"[..]]
        );
    }

    #[test]
    fn outputs_past_a_million_elements_per_item_are_refused_as_tritons() {
        let at = |n: usize, batched| {
            let t = Tensor::new("big", DataType::Uint8, vec![2, n as i64], vec![0u8; 2 * n]);
            classify(&t, 1, None, batched)
        };
        assert!(at(MAX_CLASSIFIED_ELEMENTS, true).is_ok());
        let e = at(MAX_CLASSIFIED_ELEMENTS + 1, true).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                crate::Code::InvalidArg,
                "classification output tensor too large"
            )
        );
        assert!(
            at(MAX_CLASSIFIED_ELEMENTS / 2 + 1, false).is_err(),
            "unbatched: the whole tensor is one item"
        );
    }

    #[test]
    fn ints_unbatched_without_labels() {
        let vals: Vec<u8> = [3i32, 9, -1].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = Tensor::new("o", DataType::Int32, vec![3], vals);
        let c = classify(&t, 5, None, false).unwrap();
        assert_eq!(c.shape, vec![3]);
        let got: Vec<&[u8]> = bytes_tensor::decode(&c.data).unwrap();
        assert_eq!(got, [&b"9:1"[..], b"3:0", b"-1:2"]);
    }
}
