//! gRPC `ModelInferRequest` messages: the protobuf bytes decoded as tonic
//! decodes them (prost), then the server's
//! `frontend::grpc::codec::decode_request` (typed `contents`,
//! `raw_input_contents`, parameters, shared memory), `validate_request` and
//! `encode_response`.
//!
//! Input: byte 0 picks the model config (bits 0-1); the rest is the message.
//!
//! Invariants: a request that decodes, re-encoded with every input in
//! `raw_input_contents`, decodes to an equivalent request; the response
//! encoder carries each output's data unchanged (empty for outputs written
//! to shared memory).
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tern::frontend::grpc::codec::{decode_request, encode_response};
use tern::proto::{ModelInferRequest, ModelInferResponse};
use tern_core::validate::validate_request;
use tern_core::InferResponse;
use tern_fuzz::{configs, grpc_request, same_request, shm};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, message)) = data.split_first() else {
        return;
    };
    let cfg = &configs()[usize::from(mode & 3)];
    let Ok(wire) = ModelInferRequest::decode(message) else {
        return;
    };
    let Ok(req) = decode_request(wire, shm()) else {
        return;
    };
    let _ = validate_request(cfg, &req);

    let again = grpc_request(&req).encode_to_vec();
    let again = ModelInferRequest::decode(&again[..]).expect("prost round trip");
    let again = decode_request(again, shm())
        .unwrap_or_else(|e| panic!("re-encoded request fails to decode: {e}\n{req:?}"));
    assert!(
        same_request(&req, &again),
        "re-encoded request differs:\n{req:?}\n{again:?}"
    );

    let resp = InferResponse {
        model_name: req.model_name.clone(),
        model_version: req.model_version.unwrap_or(1),
        id: req.id.clone(),
        outputs: req.inputs.clone(),
        parameters: req.parameters.clone(),
        ..Default::default()
    };
    let encoded = encode_response(resp, &req.outputs);
    assert_eq!(encoded.outputs.len(), req.inputs.len());
    assert_eq!(encoded.raw_output_contents.len(), req.inputs.len());
    for ((t, out), raw) in req
        .inputs
        .iter()
        .zip(&encoded.outputs)
        .zip(&encoded.raw_output_contents)
    {
        let in_shm = req
            .outputs
            .iter()
            .any(|o| o.name == t.name && o.shm.is_some());
        assert_eq!(out.name, t.name);
        assert_eq!(out.shape, t.shape);
        assert_eq!(out.datatype, t.dtype.wire_name());
        assert!(if in_shm {
            raw.is_empty()
        } else {
            *raw == t.data
        });
    }
    let bytes = encoded.encode_to_vec();
    let decoded = ModelInferResponse::decode(&bytes[..]).expect("response decodes");
    assert_eq!(decoded.raw_output_contents, encoded.raw_output_contents);
});
