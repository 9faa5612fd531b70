//! HTTP body compression: `Content-Encoding: gzip|deflate` on requests and
//! `Accept-Encoding` on responses (deflate is the zlib format, as
//! `tritonclient` sends it). Decompression is bounded by the input size limit
//! (`--http-max-input-size`), with current Triton's error.

use std::io::{Read, Write};

use flate2::read::{GzDecoder, ZlibDecoder};
use flate2::write::{GzEncoder, ZlibEncoder};
use flate2::Compression;

use tern_core::error::{Error, Result};

/// A supported content coding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// RFC 1952 gzip.
    Gzip,
    /// RFC 1950 zlib ("deflate" in HTTP).
    Deflate,
}

/// Parses a `Content-Encoding` value; `None` = identity.
pub fn content_coding(value: Option<&str>) -> Result<Option<Coding>> {
    match value.map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(None),
        Some(v) if v.is_empty() || v == "identity" => Ok(None),
        Some(v) if v == "gzip" => Ok(Some(Coding::Gzip)),
        Some(v) if v == "deflate" => Ok(Some(Coding::Deflate)),
        Some(v) => Err(Error::unsupported(format!(
            "unsupported Content-Encoding '{v}' (supported: gzip, deflate)"
        ))),
    }
}

/// Picks a response coding from `Accept-Encoding` (first supported one listed, ignoring q=0).
pub fn accepted_coding(value: Option<&str>) -> Option<Coding> {
    value?.split(',').find_map(|part| {
        let mut it = part.split(';');
        let name = it.next()?.trim().to_ascii_lowercase();
        if it.any(|p| p.trim().replace(' ', "") == "q=0") {
            return None;
        }
        match name.as_str() {
            "gzip" => Some(Coding::Gzip),
            "deflate" => Some(Coding::Deflate),
            _ => None,
        }
    })
}

/// Decompresses `data`, failing when the result would exceed `limit` bytes.
pub fn decompress(coding: Coding, data: &[u8], limit: usize) -> Result<Vec<u8>> {
    let reader: Box<dyn Read> = match coding {
        Coding::Gzip => Box::new(GzDecoder::new(data)),
        Coding::Deflate => Box::new(ZlibDecoder::new(data)),
    };
    let mut out = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| {
            Error::invalid_arg(
                format!("failed to decompress the {coding:?} request body: {e}").to_lowercase(),
            )
        })?;
    if out.len() > limit {
        return Err(tern_core::messages::decompressed_too_large(limit));
    }
    Ok(out)
}

/// Compresses a response body given as consecutive parts.
pub fn compress<T: AsRef<[u8]>>(coding: Coding, parts: &[T]) -> Vec<u8> {
    fn all<W: Write>(mut w: W, parts: &[impl AsRef<[u8]>]) -> W {
        for p in parts {
            w.write_all(p.as_ref())
                .expect("writing to a Vec cannot fail");
        }
        w
    }
    let level = Compression::fast();
    let done = "writing to a Vec cannot fail";
    match coding {
        Coding::Gzip => all(GzEncoder::new(Vec::new(), level), parts)
            .finish()
            .expect(done),
        Coding::Deflate => all(ZlibEncoder::new(Vec::new(), level), parts)
            .finish()
            .expect(done),
    }
}

impl Coding {
    /// The header token.
    pub fn as_str(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_limits() {
        for c in [Coding::Gzip, Coding::Deflate] {
            let z = compress(c, &[&b"hello hello"[..], b" hello"]);
            assert_eq!(decompress(c, &z, 100).unwrap(), b"hello hello hello");
            assert_eq!(
                decompress(c, &z, 5).unwrap_err().message,
                "Decompressed data size exceeds the maximum allowed value of 5 bytes. \
                 Use --http-max-input-size to increase the limit."
            );
            assert!(decompress(c, b"garbage", 100).is_err());
        }
        assert_eq!(
            accepted_coding(Some("br, deflate;q=0.5, gzip")),
            Some(Coding::Deflate)
        );
        assert_eq!(accepted_coding(Some("gzip;q=0, identity")), None);
        assert!(content_coding(Some("br")).is_err());
        assert_eq!(content_coding(Some("GZIP")).unwrap(), Some(Coding::Gzip));
    }
}
