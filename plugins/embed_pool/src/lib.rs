//! `embed_pool`: sentence-embedding postprocessing as sentence-transformers
//! does it for all-MiniLM-L6-v2: mean of `token_embeddings` (FP32
//! `[rows, tokens, dim]`) over the tokens where `attention_mask` (INT64
//! `[rows, tokens]`) is 1, then L2 normalisation → `EMBEDDING` (FP32
//! `[rows, dim]`).

use tern_plugin::{export_model, Error, Model, ModelContext, Request, Response, Tensor};

struct EmbedPool;

fn pool(r: &Request) -> Result<Response, Error> {
    let emb = r.input("token_embeddings")?;
    let mask = r.input("attention_mask")?;
    let [rows, tokens, dim] = emb.shape[..] else {
        return Err(Error::invalid_arg(format!(
            "token_embeddings must be [rows, tokens, dim], got {:?}",
            emb.shape
        )));
    };
    if mask.shape[..] != [rows, tokens] {
        return Err(Error::invalid_arg(format!(
            "attention_mask shape {:?} does not match token_embeddings {:?}",
            mask.shape, emb.shape
        )));
    }
    let (rows, tokens, dim) = (rows as usize, tokens as usize, dim as usize);
    let values = emb.as_slice::<f32>()?;
    let mask = mask.as_slice::<i64>()?;
    let mut out = vec![0f32; rows * dim];
    for row in 0..rows {
        let acc = &mut out[row * dim..(row + 1) * dim];
        let mut count = 0f32;
        for t in 0..tokens {
            if mask[row * tokens + t] == 0 {
                continue;
            }
            count += 1.0;
            let v = &values[(row * tokens + t) * dim..(row * tokens + t + 1) * dim];
            for (a, x) in acc.iter_mut().zip(v) {
                *a += x;
            }
        }
        let count = count.max(1e-9);
        acc.iter_mut().for_each(|a| *a /= count);
        let norm = acc.iter().map(|a| a * a).sum::<f32>().sqrt().max(1e-12);
        acc.iter_mut().for_each(|a| *a /= norm);
    }
    Ok(Response::new(vec![Tensor::from_vec(
        "EMBEDDING",
        vec![rows as i64, dim as i64],
        out,
    )]))
}

impl Model for EmbedPool {
    fn initialize(_ctx: ModelContext) -> Result<Self, Error> {
        Ok(EmbedPool)
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        requests.iter().map(pool).collect()
    }
}

export_model!(EmbedPool);
