//! `bert_tokenizer`: BERT WordPiece tokenisation as a plugin. `TEXT` (BYTES,
//! one string per batch row) → `input_ids`, `attention_mask`,
//! `token_type_ids` (INT64 `[rows, length]`), every request of a batch padded
//! to the longest text of the batch so that the next model can batch them.
//! Reads `vocab.txt` from its version folder; `parameters`: `max_length`
//! (default 256, truncation keeps `[CLS]`/`[SEP]`) and `lowercase` (default
//! `true`).

use tern_plugin::{export_model, Error, Model, ModelContext, Request, Response, Tensor};
use wordpiece::Tokenizer;

struct BertTokenizer {
    tokenizer: Tokenizer,
    max_length: usize,
}

impl Model for BertTokenizer {
    fn initialize(ctx: ModelContext) -> Result<Self, Error> {
        let vocab = ctx.read_file("vocab.txt")?;
        let vocab = String::from_utf8(vocab)
            .map_err(|_| Error::invalid_arg("vocab.txt is not UTF-8".to_string()))?;
        let lowercase = ctx.parameter("lowercase").is_none_or(|v| v != "false");
        let max_length = match ctx.parameter("max_length") {
            None => 256,
            Some(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 2)
                .ok_or_else(|| {
                    Error::invalid_arg(format!(
                        "parameter 'max_length' must be an integer >= 2, got '{v}'"
                    ))
                })?,
        };
        let tokenizer = Tokenizer::from_vocab(&vocab, lowercase).map_err(Error::invalid_arg)?;
        Ok(BertTokenizer {
            tokenizer,
            max_length,
        })
    }

    fn execute(&mut self, requests: Vec<Request>) -> Vec<Result<Response, Error>> {
        let encoded: Vec<Result<Vec<Vec<i64>>, Error>> = requests
            .iter()
            .map(|r| {
                let texts = r.input("TEXT")?.strings()?;
                Ok(texts
                    .iter()
                    .map(|t| match std::str::from_utf8(t) {
                        Ok(t) => self.tokenizer.encode(t, self.max_length),
                        Err(_) => self
                            .tokenizer
                            .encode(&String::from_utf8_lossy(t), self.max_length),
                    })
                    .collect())
            })
            .collect();
        let width = encoded
            .iter()
            .flatten()
            .flatten()
            .map(Vec::len)
            .max()
            .unwrap_or(2);
        let pad = self.tokenizer.pad_id();
        encoded
            .into_iter()
            .map(|rows| {
                let rows = rows?;
                let shape = vec![rows.len() as i64, width as i64];
                let mut ids = Vec::with_capacity(rows.len() * width);
                let mut mask = Vec::with_capacity(rows.len() * width);
                for row in &rows {
                    ids.extend_from_slice(row);
                    ids.resize(ids.len() + width - row.len(), pad);
                    mask.extend(std::iter::repeat_n(1i64, row.len()));
                    mask.extend(std::iter::repeat_n(0i64, width - row.len()));
                }
                let types = vec![0i64; ids.len()];
                Ok(Response::new(vec![
                    Tensor::from_vec("input_ids", shape.clone(), ids),
                    Tensor::from_vec("attention_mask", shape.clone(), mask),
                    Tensor::from_vec("token_type_ids", shape, types),
                ]))
            })
            .collect()
    }
}

export_model!(BertTokenizer);
