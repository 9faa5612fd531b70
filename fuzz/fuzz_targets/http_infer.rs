//! HTTP inference request bodies (KServe v2 JSON, the binary tensor data
//! extension, the raw-binary form) through the server's
//! `frontend::http::codec::decode_request`, then the checks the server runs
//! next (`validate_request`) and its response encoder.
//!
//! Input: byte 0 picks the model config (bits 0-1) and the
//! `Inference-Header-Content-Length` (bits 2-3: none, 0 = raw body, or the
//! next two bytes little-endian); the rest is the body.
//!
//! Invariants: a request that decodes re-encodes (JSON header, every input in
//! the binary section) to a body that decodes to an equivalent request; its
//! inputs, encoded by `encode_response` as outputs, decode back to the same
//! tensors.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use tern::frontend::http::codec::{decode_request, encode_response, HttpOptions};
use tern_core::validate::validate_request;
use tern_core::{InferRequest, InferResponse, Parameter, RequestedOutput};
use tern_fuzz::{configs, http_body, same_request, same_tensor, shm, take_u16};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let cfg = &configs()[usize::from(mode & 3)];
    let (header_len, body) = match (mode >> 2) & 3 {
        0 => (None, rest),
        1 => (Some(0), rest),
        _ => {
            let (n, body) = take_u16(rest);
            (Some(usize::from(n)), body)
        }
    };
    let decoded = decode_request(
        "m",
        None,
        Bytes::copy_from_slice(body),
        header_len,
        cfg,
        shm(),
    );
    let Ok((req, opts)) = decoded else { return };
    let _ = validate_request(cfg, &req);
    round_trip(&req, &opts);
    response_round_trip(&req);
});

/// Whether the request holds both a NUL character in a string and a
/// non-finite double parameter: such a body cannot be read (Triton's bare
/// NaN tokens are rewritten only where no string could hold a sentinel).
fn unreadable(req: &InferRequest) -> bool {
    let nul = req.id.contains('\0')
        || req.parameters.iter().any(|(k, v)| {
            k.contains('\0') || matches!(v, Parameter::String(s) if s.contains('\0'))
        })
        || req.inputs.iter().any(|t| t.name.contains('\0'))
        || req.outputs.iter().any(|o| o.name.contains('\0'));
    let nonfinite = req
        .parameters
        .values()
        .any(|v| matches!(v, Parameter::Double(d) if !d.is_finite()));
    nul && nonfinite
}

fn round_trip(req: &InferRequest, opts: &HttpOptions) {
    let (body, header_len) = http_body(req, opts.binary_default);
    let again = decode_request(
        "m",
        None,
        Bytes::from(body.clone()),
        Some(header_len),
        &configs()[0],
        shm(),
    );
    match again {
        Ok((again, again_opts)) => {
            assert!(
                same_request(req, &again),
                "re-encoded request differs:\n{req:?}\n{again:?}\nbody {:?}",
                String::from_utf8_lossy(&body)
            );
            assert_eq!(opts.binary_default, again_opts.binary_default);
        }
        Err(e) => assert!(
            unreadable(req),
            "re-encoded request fails to decode: {e}\n{req:?}\nbody {:?}",
            String::from_utf8_lossy(&body)
        ),
    }
}

/// The inputs as a response's outputs: `encode_response`'s JSON header,
/// read as a request (`outputs` renamed `inputs`), gives the same tensors.
/// Only inputs whose data fits their shape (`validate_request` refuses the
/// others; a model's outputs are checked the same way) can be outputs.
fn response_round_trip(req: &InferRequest) {
    let mut req = req.clone();
    req.inputs.retain(|t| t.check_data_size().is_ok());
    let req = &req;
    let requested: Vec<RequestedOutput> = req
        .outputs
        .iter()
        .filter(|o| o.shm.is_none())
        .cloned()
        .collect();
    let resp = InferResponse {
        model_name: "m".into(),
        model_version: 1,
        outputs: req.inputs.clone(),
        ..Default::default()
    };
    let binary_default = req.inputs.len() % 2 == 1;
    let encoded = encode_response(&resp, &requested, &HttpOptions { binary_default });
    let json_len = encoded.json_len;
    let mut body: Vec<u8> = encoded
        .parts
        .iter()
        .flat_map(|p| p.iter().copied())
        .collect();
    let header = json_len.unwrap_or(body.len());
    assert!(header <= body.len());
    assert!(
        serde_json::from_slice::<serde_json::Value>(&body[..header]).is_ok()
            || std::str::from_utf8(&body[..header])
                .is_ok_and(|s| s.contains("NaN") || s.contains("Infinity")),
        "response header is not JSON: {:?}",
        String::from_utf8_lossy(&body[..header])
    );
    let at = find(&body[..header], b",\"outputs\":[").expect("outputs in the response");
    body.splice(at..at + 12, b",\"inputs\":[".iter().copied());
    let header = header - 1;
    let (back, _) = decode_request(
        "m",
        None,
        Bytes::from(body.clone()),
        json_len.map(|_| header),
        &configs()[0],
        shm(),
    )
    .unwrap_or_else(|e| {
        panic!(
            "response does not read back: {e}\n{:?}\n{:?}",
            req.inputs,
            String::from_utf8_lossy(&body)
        )
    });
    assert_eq!(back.inputs.len(), req.inputs.len());
    for (a, b) in req.inputs.iter().zip(&back.inputs) {
        assert!(same_tensor(a, b), "response data differs:\n{a:?}\n{b:?}");
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}
