//! `prep_rust`: the example preprocessing job in Rust, the reference the
//! Python, JavaScript and C versions (`plugins/prep_*`) are compared with.
//!
//! OUTPUT0 = INPUT0 + INPUT1 and OUTPUT1 = INPUT0 - INPUT1 (FP32 [4], the
//! `add_sub` twin); TEXT (one string) is normalised to NORMALIZED (ASCII
//! lower-case, runs of ASCII whitespace collapsed to one space, trimmed)
//! and its words hashed to TOKEN_IDS (FNV-1a 32 mod 30000 + 1, the first 8
//! words, 0-padded).

use tern_plugin::{
    export_model, gather, per_request, Error, Model, ModelContext, Request, Response, Tensor,
};

const MAX_TOKENS: usize = 8;
const VOCAB: u32 = 30000;

fn fnv1a(word: &[u8]) -> u32 {
    word.iter().fold(0x811c_9dc5, |h, &b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
}

/// The normalised text and its word ids.
fn normalize(text: &[u8]) -> (Vec<u8>, Vec<i32>) {
    let lower = text.to_ascii_lowercase();
    let words: Vec<&[u8]> = lower
        .split(|b| b" \t\n\r\x0b\x0c".contains(b))
        .filter(|w| !w.is_empty())
        .collect();
    let mut ids: Vec<i32> = words
        .iter()
        .take(MAX_TOKENS)
        .map(|w| (fnv1a(w) % VOCAB + 1) as i32)
        .collect();
    ids.resize(MAX_TOKENS, 0);
    (words.join(&b' '), ids)
}

struct Prep;

impl Model for Prep {
    fn initialize(_ctx: ModelContext) -> Result<Self, Error> {
        Ok(Prep)
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        let run = || -> Result<Vec<Response>, Error> {
            let a = gather::<f32>(&requests, "INPUT0")?;
            let b = gather::<f32>(&requests, "INPUT1")?;
            let sum = a.data.iter().zip(&b.data).map(|(x, y)| x + y).collect();
            let diff = a.data.iter().zip(&b.data).map(|(x, y)| x - y).collect();
            let sums = a.split("OUTPUT0", sum, &a.inner)?;
            let diffs = a.split("OUTPUT1", diff, &a.inner)?;
            let mut out = Vec::with_capacity(requests.len());
            for ((r, s), d) in requests.iter().zip(sums).zip(diffs) {
                let rows: Vec<_> = r
                    .input("TEXT")?
                    .strings()?
                    .into_iter()
                    .map(normalize)
                    .collect();
                let n = rows.len() as i64;
                let texts: Vec<&[u8]> = rows.iter().map(|(t, _)| t.as_slice()).collect();
                let ids: Vec<i32> = rows.iter().flat_map(|(_, i)| i.iter().copied()).collect();
                out.push(Response::new(vec![
                    s,
                    d,
                    Tensor::from_strings("NORMALIZED", vec![n, 1], &texts),
                    Tensor::from_vec("TOKEN_IDS", vec![n, MAX_TOKENS as i64], ids),
                ]));
            }
            Ok(out)
        };
        per_request(requests.len(), run())
    }
}

export_model!(Prep);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_and_hashes() {
        let (t, ids) = normalize(b"  Hello\tWORLD \n");
        assert_eq!(t, b"hello world");
        assert_eq!(ids[0], (fnv1a(b"hello") % VOCAB + 1) as i32);
        assert_eq!(&ids[2..], &[0; 6]);
        // FNV-1a 32 test vector.
        assert_eq!(fnv1a(b"a"), 0xe40c292c);
    }
}
