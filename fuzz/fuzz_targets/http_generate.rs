//! Bodies of Triton's generate extension (`POST .../generate`) through the
//! server's `frontend::http::generate::decode`, then `validate_request` and
//! the generate response writer (`response_json`).
//!
//! Input: byte 0 picks the model config (bits 0-1); the rest is the body.
//!
//! Invariant: a body that decodes, answered with its own inputs as outputs,
//! gives a response that decodes (as a generate body) to the same inputs and
//! id (finite values; see fuzz/README.md for non-finite ones).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tern::frontend::http::generate::{decode, response_json};
use tern_core::validate::validate_request;
use tern_core::{DataType, InferResponse};
use tern_fuzz::{configs, same_tensor};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let cfg = &configs()[usize::from(mode & 3)];
    let Ok(req) = decode("m", None, cfg, body) else {
        return;
    };
    let _ = validate_request(cfg, &req);
    let resp = InferResponse {
        model_name: "m".into(),
        model_version: 1,
        id: req.id.clone(),
        outputs: req.inputs.clone(),
        ..Default::default()
    };
    let text = response_json(&resp).to_string();
    let finite = req.inputs.iter().all(|t| match t.dtype {
        DataType::Fp32 => t
            .data
            .chunks_exact(4)
            .all(|c| f32::from_le_bytes(c.try_into().expect("4")).is_finite()),
        DataType::Fp64 => t
            .data
            .chunks_exact(8)
            .all(|c| f64::from_le_bytes(c.try_into().expect("8")).is_finite()),
        _ => true,
    });
    if !finite {
        return;
    }
    let back = decode("m", None, cfg, text.as_bytes())
        .unwrap_or_else(|e| panic!("response does not read back: {e}\n{req:?}\n{text}"));
    assert_eq!(back.id, req.id, "{text}");
    assert_eq!(back.inputs.len(), req.inputs.len(), "{req:?}\n{text}");
    for (a, b) in req.inputs.iter().zip(&back.inputs) {
        assert!(
            same_tensor(a, b),
            "generate response differs:\n{a:?}\n{b:?}\n{text}"
        );
    }
});
