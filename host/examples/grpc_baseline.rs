//! Benchmark baseline for gRPC: a minimal tonic server with the same
//! `inference.GRPCInferenceService` that decodes the request (prost) and
//! answers a fixed `simple` response. It also answers the server's and
//! `simple`'s metadata, readiness and configuration (fixed, from
//! `model_repository/simple/config.pbtxt`) so that perf_analyzer can drive it;
//! every other RPC is UNIMPLEMENTED. Tern's gRPC
//! throughput is reported as a ratio of this one's.
//!
//! Given a model repository it is the bare server *with* the model instead:
//! `ModelInfer` runs `<repository>/simple` through ONNX Runtime on the worker
//! that received the request (one session per worker thread: no lock, queue,
//! hand-off or statistics) and answers the computed outputs: about the most a
//! server running `simple` through ONNX Runtime can serve on the same machine.
//!
//! Usage: `grpc_baseline <port> [<model repository>]`

mod common;

use std::pin::Pin;

use common::SimpleOnnx;

use tern::proto::grpc_inference_service_server::{
    GrpcInferenceService, GrpcInferenceServiceServer,
};
use tern::proto::*;
use tonic::{Request, Response, Status, Streaming};

struct Baseline {
    response: ModelInferResponse,
    model: Option<SimpleOnnx>,
    metadata: ModelMetadataResponse,
    config: ModelConfigResponse,
}

type R<T> = Result<Response<T>, Status>;

fn no<T>() -> R<T> {
    Err(Status::unimplemented("baseline"))
}

#[tonic::async_trait]
impl GrpcInferenceService for Baseline {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> R<ServerLiveResponse> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }
    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> R<ServerReadyResponse> {
        Ok(Response::new(ServerReadyResponse { ready: true }))
    }
    async fn model_ready(&self, _: Request<ModelReadyRequest>) -> R<ModelReadyResponse> {
        Ok(Response::new(ModelReadyResponse { ready: true }))
    }
    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> R<ServerMetadataResponse> {
        Ok(Response::new(ServerMetadataResponse {
            name: "baseline".into(),
            version: "0".into(),
            extensions: Vec::new(),
        }))
    }
    async fn model_metadata(&self, _: Request<ModelMetadataRequest>) -> R<ModelMetadataResponse> {
        Ok(Response::new(self.metadata.clone()))
    }
    async fn model_infer(&self, req: Request<ModelInferRequest>) -> R<ModelInferResponse> {
        let req = req.into_inner();
        let Some(model) = &self.model else {
            std::hint::black_box(req);
            return Ok(Response::new(self.response.clone()));
        };
        let [a, b] = <[_; 2]>::try_from(req.raw_input_contents)
            .map_err(|_| Status::invalid_argument("two raw inputs expected"))?;
        let outputs = model.run(a, b).map_err(Status::internal)?;
        Ok(Response::new(ModelInferResponse {
            raw_output_contents: outputs.into(),
            ..self.response.clone()
        }))
    }
    type ModelStreamInferStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<ModelStreamInferResponse, Status>> + Send>>;
    async fn model_stream_infer(
        &self,
        _: Request<Streaming<ModelInferRequest>>,
    ) -> R<Self::ModelStreamInferStream> {
        no()
    }
    async fn model_config(&self, _: Request<ModelConfigRequest>) -> R<ModelConfigResponse> {
        Ok(Response::new(self.config.clone()))
    }
    async fn model_statistics(
        &self,
        _: Request<ModelStatisticsRequest>,
    ) -> R<ModelStatisticsResponse> {
        no()
    }
    async fn repository_index(
        &self,
        _: Request<RepositoryIndexRequest>,
    ) -> R<RepositoryIndexResponse> {
        no()
    }
    async fn repository_model_load(
        &self,
        _: Request<RepositoryModelLoadRequest>,
    ) -> R<RepositoryModelLoadResponse> {
        no()
    }
    async fn repository_model_unload(
        &self,
        _: Request<RepositoryModelUnloadRequest>,
    ) -> R<RepositoryModelUnloadResponse> {
        no()
    }
    async fn system_shared_memory_status(
        &self,
        _: Request<SystemSharedMemoryStatusRequest>,
    ) -> R<SystemSharedMemoryStatusResponse> {
        no()
    }
    async fn system_shared_memory_register(
        &self,
        _: Request<SystemSharedMemoryRegisterRequest>,
    ) -> R<SystemSharedMemoryRegisterResponse> {
        no()
    }
    async fn system_shared_memory_unregister(
        &self,
        _: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> R<SystemSharedMemoryUnregisterResponse> {
        no()
    }
    async fn cuda_shared_memory_status(
        &self,
        _: Request<CudaSharedMemoryStatusRequest>,
    ) -> R<CudaSharedMemoryStatusResponse> {
        no()
    }
    async fn cuda_shared_memory_register(
        &self,
        _: Request<CudaSharedMemoryRegisterRequest>,
    ) -> R<CudaSharedMemoryRegisterResponse> {
        no()
    }
    async fn cuda_shared_memory_unregister(
        &self,
        _: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> R<CudaSharedMemoryUnregisterResponse> {
        no()
    }
    async fn trace_setting(&self, _: Request<TraceSettingRequest>) -> R<TraceSettingResponse> {
        no()
    }
    async fn log_settings(&self, _: Request<LogSettingsRequest>) -> R<LogSettingsResponse> {
        no()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().and_then(|p| p.parse().ok()).unwrap_or(9001);
    let model = args
        .next()
        .map(|root| SimpleOnnx::load(std::path::Path::new(&root)));
    let out = |name: &str| model_infer_response::InferOutputTensor {
        name: name.into(),
        datatype: "INT32".into(),
        shape: vec![1, 16],
        ..Default::default()
    };
    let data: Vec<u8> = (1..=16i32).flat_map(|v| v.to_le_bytes()).collect();
    let response = ModelInferResponse {
        model_name: "simple".into(),
        model_version: "1".into(),
        outputs: vec![out("OUTPUT0"), out("OUTPUT1")],
        raw_output_contents: vec![data.clone().into(), data.into()],
        ..Default::default()
    };
    let config =
        tern_core::config::parse_pbtxt(include_str!("../../model_repository/simple/config.pbtxt"))?;
    let tensor = |name: &str| model_metadata_response::TensorMetadata {
        name: name.into(),
        datatype: "INT32".into(),
        shape: vec![-1, 16],
    };
    let metadata = ModelMetadataResponse {
        name: "simple".into(),
        versions: vec!["1".into()],
        platform: "onnxruntime_onnx".into(),
        inputs: vec![tensor("INPUT0"), tensor("INPUT1")],
        outputs: vec![tensor("OUTPUT0"), tensor("OUTPUT1")],
    };
    let config = ModelConfigResponse {
        config: Some(config),
    };
    tonic::transport::Server::builder()
        .add_service(GrpcInferenceServiceServer::new(Baseline {
            response,
            model,
            metadata,
            config,
        }))
        .serve(([127, 0, 0, 1], port).into())
        .await?;
    Ok(())
}
