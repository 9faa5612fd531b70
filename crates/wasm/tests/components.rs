//! Real plugin components (built from `plugins/` by `tern-test-components`)
//! loaded and executed through the `wasm` backend, without a server: the
//! backend, the sandbox and BLS calls through a [`ModelRouter`].

use std::path::Path;
use std::sync::{Arc, Mutex};

use tern_core::backend::{
    Backend, BackendSettings, DeviceKind, ExecTiming, Instance, InstanceSpec, LoadContext,
};
use tern_core::config::parse_pbtxt;
use tern_core::router::{unrouted, InferFuture, ModelRouter};
use tern_core::{DataType, InferRequest, InferResponse, Result, Tensor};
use tern_wasm::backend::WasmBackend;

/// One instance of `component` serving `config` (its file named by `default_model_filename`).
fn instance(
    component: &str,
    config: &str,
    router: std::sync::Weak<dyn ModelRouter>,
) -> Box<dyn Instance> {
    let path = Path::new(component);
    let file = path.file_name().unwrap().to_str().unwrap();
    let cfg = parse_pbtxt(&format!("{config} default_model_filename: \"{file}\"")).unwrap();
    let model = WasmBackend::default()
        .load(&LoadContext {
            config: &cfg,
            version: 1,
            version_dir: path.parent().unwrap(),
            settings: &BackendSettings::default(),
            models: router,
            progress: &Default::default(),
            gate: &tern_core::backend::plain_files(),
        })
        .unwrap();
    let spec = InstanceSpec {
        name: format!("{}_0", cfg.name),
        device: DeviceKind::Cpu,
    };
    model.create_instance(&spec).unwrap()
}

fn run(instance: &mut Box<dyn Instance>, batch: &[InferRequest]) -> Vec<Result<InferResponse>> {
    instance.execute(batch, &mut ExecTiming::default())
}

fn f32s(name: &str, v: &[f32]) -> Tensor {
    let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Tensor::new(name, DataType::Fp32, vec![1, v.len() as i64], data)
}

fn i32s(name: &str, v: &[i32]) -> Tensor {
    let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Tensor::new(name, DataType::Int32, vec![1, v.len() as i64], data)
}

fn text(name: &str, s: &str, shape: Vec<i64>) -> Tensor {
    let mut data = (s.len() as u32).to_le_bytes().to_vec();
    data.extend_from_slice(s.as_bytes());
    Tensor::new(name, DataType::Bytes, shape, data)
}

fn request(model: &str, inputs: Vec<Tensor>) -> InferRequest {
    InferRequest {
        model_name: model.into(),
        inputs,
        ..Default::default()
    }
}

fn floats(t: &Tensor) -> Vec<f32> {
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

const ADD_SUB: &str = r#"name: "add_sub" backend: "wasm" max_batch_size: 8
    input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [4] }]
    output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [4] }]"#;

#[test]
fn add_sub_computes_each_request_of_a_batch() {
    let mut add_sub = instance(tern_test_components::ADD_SUB, ADD_SUB, unrouted());
    let batch = [
        request(
            "add_sub",
            vec![
                f32s("INPUT0", &[1., 2., 3., 4.]),
                f32s("INPUT1", &[1., 1., 1., 1.]),
            ],
        ),
        request(
            "add_sub",
            vec![f32s("INPUT0", &[0.5; 4]), f32s("INPUT1", &[2.; 4])],
        ),
    ];
    let results = run(&mut add_sub, &batch);
    assert_eq!(results.len(), 2);
    let first = results[0].as_ref().unwrap();
    let out = |r: &InferResponse, n: &str| floats(r.outputs.iter().find(|t| t.name == n).unwrap());
    assert_eq!(out(first, "OUTPUT0"), [2., 3., 4., 5.]);
    assert_eq!(out(first, "OUTPUT1"), [0., 1., 2., 3.]);
    let second = results[1].as_ref().unwrap();
    assert_eq!(out(second, "OUTPUT0"), [2.5; 4]);
    assert_eq!(out(second, "OUTPUT1"), [-1.5; 4]);
}

const MISBEHAVE: &str = r#"name: "misbehave" backend: "wasm" max_batch_size: 0
    input [{ name: "MODE" data_type: TYPE_STRING dims: [1] }]
    output [{ name: "OUTPUT0" data_type: TYPE_STRING dims: [1] }]
    parameters [{ key: "execution_timeout_ms" value: { string_value: "300" } },
                { key: "max_memory_bytes" value: { string_value: "33554432" } }]"#;

#[test]
fn the_sandbox_stops_a_runaway_plugin_and_the_instance_recovers() {
    let mut m = instance(tern_test_components::MISBEHAVE, MISBEHAVE, unrouted());
    let mode = |s: &str| [request("misbehave", vec![text("MODE", s, vec![1])])];
    let e = run(&mut m, &mode("loop")).pop().unwrap().unwrap_err();
    assert!(e.message.contains("execution deadline of 300 ms"), "{e}");
    let e = run(&mut m, &mode("memory")).pop().unwrap().unwrap_err();
    assert!(e.message.contains("memory cap of 33554432 bytes"), "{e}");
    // Nothing outside the model folder exists for the plugin.
    let denied = run(&mut m, &mode("read_outside")).pop().unwrap().unwrap();
    let answer = String::from_utf8_lossy(&denied.outputs[0].data[4..]).to_string();
    assert!(answer.starts_with("denied"), "{answer}");
    let ok = run(&mut m, &mode("ok")).pop().unwrap().unwrap();
    assert_eq!(&ok.outputs[0].data[4..], b"ok");
}

/// Answers every request itself and remembers what it was asked.
#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<(String, Vec<String>)>>,
}

impl ModelRouter for Recorder {
    fn infer(&self, request: InferRequest) -> Result<InferFuture> {
        self.seen
            .lock()
            .unwrap()
            .push((request.model_name.clone(), request.callers.clone()));
        let mut outputs = request.inputs.clone();
        for (t, name) in outputs.iter_mut().zip(["OUTPUT0", "OUTPUT1"]) {
            t.name = name.into();
        }
        Ok(Box::pin(std::future::ready(Ok(InferResponse {
            model_name: request.model_name,
            outputs,
            ..Default::default()
        }))))
    }

    fn infer_stream(
        &self,
        request: InferRequest,
    ) -> Result<Box<dyn tern_core::router::ResponseStream>> {
        Err(tern_core::Error::unsupported(format!(
            "the test router does not stream ('{}')",
            request.model_name
        )))
    }
}

const BLS: &str = r#"name: "bls_caller" backend: "wasm" max_batch_size: 8
    input [{ name: "ROUTE" data_type: TYPE_STRING dims: [1] },
           { name: "INPUT0" data_type: TYPE_INT32 dims: [16] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [16] }]
    output [{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [16] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [16] }]"#;

#[test]
fn bls_calls_go_through_the_router() {
    let router = Arc::new(Recorder::default());
    let weak = Arc::downgrade(&router) as std::sync::Weak<dyn ModelRouter>;
    let mut bls = instance(tern_test_components::BLS_CALLER, BLS, weak);
    let a: Vec<i32> = (0..16).collect();
    let b: Vec<i32> = (100..116).collect();
    let req = request(
        "bls_caller",
        vec![
            text("ROUTE", "simple", vec![1, 1]),
            i32s("INPUT0", &a),
            i32s("INPUT1", &b),
        ],
    );
    let r = run(&mut bls, std::slice::from_ref(&req))
        .pop()
        .unwrap()
        .unwrap();
    assert_eq!(r.outputs[0].data, i32s("x", &a).data);
    assert_eq!(r.outputs[1].data, i32s("x", &b).data);
    let seen = router.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![("simple".to_string(), vec!["bls_caller".to_string()])]
    );

    // Without a router (the server is gone), the call fails cleanly.
    let mut alone = instance(tern_test_components::BLS_CALLER, BLS, unrouted());
    let e = run(&mut alone, &[req]).pop().unwrap().unwrap_err();
    assert!(e.message.contains("shutting down"), "{e}");
}
