//! A cached response's outputs as one buffer, in the layout Triton's cache
//! entries use (`cache_entry.cc`): `u32` output count, then per output
//! `u64` packed size, `u32`+name, `u32`+datatype, `u32` shape bytes + `i64`
//! dims, `u64`+data, all little-endian. The size the local cache charges is
//! this buffer's length, as Triton's does.

use bytes::{Buf, Bytes};
use tern_core::error::{Error, Result};
use tern_core::{DataType, Tensor};

/// Packs `outputs` into one entry.
pub fn encode(outputs: &[Tensor]) -> Vec<u8> {
    let size: usize = 4 + outputs.iter().map(packed_size).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(outputs.len() as u32).to_le_bytes());
    for t in outputs {
        out.extend_from_slice(&(packed_size(t) as u64 - 8).to_le_bytes());
        put(&mut out, t.name.as_bytes());
        put(&mut out, t.dtype.wire_name().as_bytes());
        out.extend_from_slice(&((t.shape.len() * 8) as u32).to_le_bytes());
        for d in &t.shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&(t.data.len() as u64).to_le_bytes());
        out.extend_from_slice(&t.data);
    }
    out
}

/// The bytes one output takes in an entry, its own size field included.
fn packed_size(t: &Tensor) -> usize {
    8 + 4 + t.name.len() + 4 + t.dtype.wire_name().len() + 4 + 8 * t.shape.len() + 8 + t.data.len()
}

fn put(out: &mut Vec<u8>, field: &[u8]) {
    out.extend_from_slice(&(field.len() as u32).to_le_bytes());
    out.extend_from_slice(field);
}

/// Unpacks an entry; tensor data shares `entry`'s memory.
pub fn decode(mut entry: Bytes) -> Result<Vec<Tensor>> {
    let bad = |what: &str| Error::internal(format!("malformed response cache entry: {what}"));
    let count = take_u32(&mut entry).ok_or_else(|| bad("no output count"))?;
    let mut outputs = Vec::new();
    for _ in 0..count {
        let _packed = take_u64(&mut entry).ok_or_else(|| bad("truncated output"))?;
        let name = take_field(&mut entry).ok_or_else(|| bad("truncated name"))?;
        let name = String::from_utf8(name.to_vec()).map_err(|_| bad("name is not UTF-8"))?;
        let dtype = take_field(&mut entry).ok_or_else(|| bad("truncated datatype"))?;
        let dtype = std::str::from_utf8(&dtype)
            .ok()
            .and_then(DataType::from_wire)
            .ok_or_else(|| bad("unknown datatype"))?;
        let dims = take_field(&mut entry).ok_or_else(|| bad("truncated shape"))?;
        if dims.len() % 8 != 0 {
            return Err(bad("shape size is not a multiple of 8"));
        }
        let shape = dims
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("chunks of 8")))
            .collect();
        let len = take_u64(&mut entry).ok_or_else(|| bad("truncated data size"))?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&n| n <= entry.len())
            .ok_or_else(|| bad("truncated data"))?;
        let data = entry.split_to(len);
        outputs.push(Tensor::new(name, dtype, shape, data));
    }
    if entry.has_remaining() {
        return Err(bad("trailing bytes"));
    }
    Ok(outputs)
}

fn take_u32(b: &mut Bytes) -> Option<u32> {
    (b.len() >= 4).then(|| b.get_u32_le())
}

fn take_u64(b: &mut Bytes) -> Option<u64> {
    (b.len() >= 8).then(|| b.get_u64_le())
}

fn take_field(b: &mut Bytes) -> Option<Bytes> {
    let n = take_u32(b)? as usize;
    (n <= b.len()).then(|| b.split_to(n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outputs() -> Vec<Tensor> {
        vec![
            Tensor::new("OUTPUT0", DataType::Fp32, vec![1, 2], vec![0u8; 8]),
            Tensor::new("OUT", DataType::Bytes, vec![1], b"\x02\0\0\0hi".to_vec()),
        ]
    }

    #[test]
    fn an_entry_decodes_to_the_outputs_it_was_made_of() {
        let entry = encode(&outputs());
        let back = decode(Bytes::from(entry)).unwrap();
        assert_eq!(back.len(), 2);
        for (a, b) in back.iter().zip(outputs()) {
            assert_eq!(
                (&a.name, a.dtype, &a.shape, &a.data),
                (&b.name, b.dtype, &b.shape, &b.data)
            );
        }
    }

    /// Triton charged 1,600,168 bytes for two FP32 [1,200000] outputs and an
    /// INT64 [1] one named OUTPUT0, OUTPUT1 and CALLS: the same formula.
    #[test]
    fn the_size_is_the_one_triton_charges() {
        let outs = vec![
            Tensor::new(
                "OUTPUT0",
                DataType::Fp32,
                vec![1, 200_000],
                vec![0u8; 800_000],
            ),
            Tensor::new(
                "OUTPUT1",
                DataType::Fp32,
                vec![1, 200_000],
                vec![0u8; 800_000],
            ),
            Tensor::new("CALLS", DataType::Int64, vec![1], vec![0u8; 8]),
        ];
        assert_eq!(encode(&outs).len(), 1_600_168);
    }

    #[test]
    fn a_damaged_entry_is_an_error_not_a_panic() {
        let entry = encode(&outputs());
        for cut in 0..entry.len() {
            assert!(
                decode(Bytes::copy_from_slice(&entry[..cut])).is_err(),
                "cut at {cut}"
            );
        }
        let mut longer = entry.clone();
        longer.push(0);
        assert!(decode(Bytes::from(longer)).is_err());
        let mut huge = entry;
        huge[0] = 0xff;
        assert!(decode(Bytes::from(huge)).is_err());
    }
}
