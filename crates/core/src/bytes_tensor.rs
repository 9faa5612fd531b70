//! Triton's BYTES tensor encoding: each element is a 4-byte little-endian
//! length followed by that many bytes. Tern keeps BYTES tensors in this form
//! everywhere so they cross protocols and backends without re-encoding.

use crate::error::{Error, Result};

/// Appends one element to an encoded buffer.
pub fn push(buf: &mut Vec<u8>, element: &[u8]) {
    buf.extend_from_slice(&(element.len() as u32).to_le_bytes());
    buf.extend_from_slice(element);
}

/// Encodes a list of elements.
pub fn encode<I, B>(elements: I) -> Vec<u8>
where
    I: IntoIterator<Item = B>,
    B: AsRef<[u8]>,
{
    let mut buf = Vec::new();
    for e in elements {
        push(&mut buf, e.as_ref());
    }
    buf
}

/// Splits an encoded buffer into its elements, checking every length prefix.
pub fn decode(buf: &[u8]) -> Result<Vec<&[u8]>> {
    let mut out = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        if rest.len() < 4 {
            return Err(Error::invalid_arg(format!(
                "BYTES element {} is truncated: {} byte(s) left where a 4-byte length prefix was expected",
                out.len(),
                rest.len()
            )));
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        rest = &rest[4..];
        if rest.len() < len {
            return Err(Error::invalid_arg(format!(
                "BYTES element {} claims {} byte(s) but only {} remain",
                out.len(),
                len,
                rest.len()
            )));
        }
        out.push(&rest[..len]);
        rest = &rest[len..];
    }
    Ok(out)
}

/// Counts the elements of an encoded buffer, validating it.
pub fn count(buf: &[u8]) -> Result<usize> {
    decode(buf).map(|v| v.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let enc = encode(["ab", "", "xyz"]);
        assert_eq!(enc.len(), 4 * 3 + 5);
        let dec = decode(&enc).unwrap();
        assert_eq!(dec, vec![&b"ab"[..], b"", b"xyz"]);
        assert_eq!(count(&enc).unwrap(), 3);
        assert_eq!(count(&[]).unwrap(), 0);
    }

    #[test]
    fn rejects_truncation() {
        let mut enc = encode(["hello"]);
        enc.pop();
        assert!(decode(&enc).unwrap_err().message.contains("claims 5"));
        assert!(decode(&[1, 0])
            .unwrap_err()
            .message
            .contains("length prefix"));
    }
}
