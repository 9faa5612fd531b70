//! The gRPC frontend: Triton's `inference.GRPCInferenceService` (tonic) and
//! the standard `grpc.health.v1.Health` service. Requests go through the
//! same core as HTTP (`tern_core::validate`, the model's scheduler), so both
//! frontends give the same answers and the same error messages.

mod authority;
pub mod codec;
pub mod deadline;
pub mod listener;
pub mod pings;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::FuturesUnordered;
use futures_util::FutureExt;
use std::panic::AssertUnwindSafe;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status, Streaming};

use super::common::{model_metadata, parse_version, ServerInfo, EXTENSIONS};
use super::restrict::{grpc_category, Restrictions};
use crate::proto::grpc_inference_service_server::{
    GrpcInferenceService, GrpcInferenceServiceServer,
};
use crate::proto::health::health_check_response::ServingStatus;
use crate::proto::health::health_server::{Health, HealthServer};
use crate::proto::health::{HealthCheckRequest, HealthCheckResponse};
use crate::proto::*;
use crate::scheduler::stats::{CountNs, Snapshot};
use tern_core::error::{Code, Error, Result};
use tern_core::request::ControlValue;
use tern_memory::shm::Kind as ShmKind;

/// TLS material for the gRPC server (PEM).
#[derive(Clone)]
pub struct TlsSettings {
    /// Server certificate chain.
    pub cert: Vec<u8>,
    /// Server private key.
    pub key: Vec<u8>,
    /// CA for client certificates; `Some` = mutual TLS (clients must present one).
    pub client_ca: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("mutual", &self.client_ca.is_some())
            .finish_non_exhaustive()
    }
}

/// gRPC server settings from the command line.
#[derive(Debug, Clone)]
pub struct GrpcSettings {
    /// `--grpc-restricted-protocol`.
    pub restrictions: Restrictions,
    /// TLS, when enabled.
    pub tls: Option<TlsSettings>,
    /// `--grpc-keepalive-time` (ms): interval of server keepalive pings.
    pub keepalive_time: Duration,
    /// `--grpc-keepalive-timeout` (ms): how long to wait for a ping ack.
    pub keepalive_timeout: Duration,
    /// Compress responses (gzip) for clients that accept it.
    pub compress_responses: bool,
    /// `--grpc-max-message-size`: the largest message decoded or encoded.
    pub max_message_size: usize,
    /// `--grpc-max-connection-age`: connections older than this are closed (GOAWAY).
    pub max_connection_age: Option<Duration>,
    /// `--grpc-max-connection-age-grace`: time an aged connection gets to finish.
    pub max_connection_age_grace: Option<Duration>,
    /// The HTTP/2 PING rules (`--grpc-keepalive-permit-without-calls`, `--grpc-http2-*`).
    pub pings: pings::PingPolicy,
    /// `--grpc-header-forward-pattern`.
    pub header_forward: Option<super::common::HeaderForward>,
}

/// A gRPC server ready to serve: services, TLS acceptor and PING rules.
pub struct GrpcServer {
    router: tonic::transport::server::Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    pings: pings::PingPolicy,
}

/// The inference service.
pub struct InferenceService {
    info: Arc<ServerInfo>,
    /// `--grpc-header-forward-pattern`.
    header_forward: Option<super::common::HeaderForward>,
}

/// The gRPC status for an error: Triton's mapping, in this one place.
pub fn grpc_status(e: &Error) -> Status {
    let code = match e.code {
        Code::InvalidArg => tonic::Code::InvalidArgument,
        Code::NotFound => tonic::Code::NotFound,
        Code::Unavailable => tonic::Code::Unavailable,
        Code::Unsupported => tonic::Code::Unimplemented,
        Code::AlreadyExists => tonic::Code::AlreadyExists,
        Code::Cancelled => tonic::Code::Cancelled,
        Code::Internal => tonic::Code::Internal,
        Code::Unknown => tonic::Code::Unknown,
    };
    Status::new(code, e.message.clone())
}

fn status(e: Error) -> Status {
    grpc_status(&e)
}

fn duration(c: &CountNs) -> Option<StatisticDuration> {
    Some(StatisticDuration {
        count: c.count,
        ns: c.ns,
    })
}

fn statistics(name: &str, version: i64, s: &Snapshot) -> ModelStatistics {
    ModelStatistics {
        name: name.to_string(),
        version: version.to_string(),
        last_inference: s.last_inference,
        inference_count: s.inference_count,
        execution_count: s.execution_count,
        inference_stats: Some(InferStatistics {
            success: duration(&s.success),
            fail: duration(&s.fail),
            queue: duration(&s.queue),
            compute_input: duration(&s.compute_input),
            compute_infer: duration(&s.compute_infer),
            compute_output: duration(&s.compute_output),
            cache_hit: duration(&s.cache_hit),
            cache_miss: duration(&s.cache_miss),
        }),
        batch_stats: s
            .batches
            .iter()
            .map(|(size, [i, n, o])| InferBatchStatistics {
                batch_size: *size as u64,
                compute_input: duration(i),
                compute_infer: duration(n),
                compute_output: duration(o),
            })
            .collect(),
        memory_usage: vec![],
        response_stats: HashMap::new(),
    }
}

/// One message of ModelStreamInfer's output stream.
type StreamMsg = std::result::Result<ModelStreamInferResponse, Status>;

/// `triton_final_response`, set on every streamed response as Triton does.
fn final_flag(response: &mut ModelInferResponse, last: bool) {
    response.parameters.insert(
        "triton_final_response".into(),
        InferParameter {
            parameter_choice: Some(infer_parameter::ParameterChoice::BoolParam(last)),
        },
    );
}

/// Takes the request's `triton_enable_empty_final_response` (Triton's only
/// `triton_` request parameter), checking its type.
fn take_empty_final(req: &mut ModelInferRequest) -> Result<bool> {
    use infer_parameter::ParameterChoice as P;
    match req.parameters.remove("triton_enable_empty_final_response") {
        None => Ok(false),
        Some(InferParameter {
            parameter_choice: Some(P::BoolParam(b)),
        }) => Ok(b),
        Some(_) => Err(tern_core::messages::empty_final_response_type()),
    }
}

impl InferenceService {
    /// The metadata `--grpc-header-forward-pattern` forwards as request parameters.
    fn forwarded(&self, metadata: &tonic::metadata::MetadataMap) -> Option<Vec<(String, String)>> {
        let f = self.header_forward.as_ref()?;
        Some(f.matching(metadata.as_ref()))
    }

    async fn infer(
        &self,
        req: ModelInferRequest,
        traceparent: Option<&str>,
        forwarded: Option<Vec<(String, String)>>,
    ) -> Result<ModelInferResponse> {
        let infer = &self.info.infer;
        let trace = received(infer, &req.model_name, traceparent);
        let mut request = codec::decode_request(req, &self.info.shm)?;
        if let Some(headers) = forwarded {
            super::common::forward_headers(&mut request, headers);
        }
        let target = infer
            .resolve(&request.model_name, request.model_version, || {
                crate::infer::request_timeout(&request)
            })
            .await?;
        if target.model().decoupled() {
            return Err(tern_core::messages::grpc_infer_decoupled());
        }
        request.trace = trace.clone();
        let answer = infer.infer(&target, request).await?;
        if let Some(t) = &trace {
            t.timestamp("INFER_RESPONSE_COMPLETE");
            t.timestamp("GRPC_SEND_START");
        }
        let response = codec::encode_response(answer.response, &answer.requested);
        if let Some(t) = &trace {
            t.timestamp("GRPC_SEND_END");
        }
        Ok(response)
    }

    /// Decodes one request of a stream and resolves its model (loading it
    /// on demand): whether it asked for an empty final response, the
    /// request, and the version it runs on.
    async fn start_one(
        &self,
        mut req: ModelInferRequest,
        trace: Option<Arc<tern_core::trace::Trace>>,
        forwarded: Option<Vec<(String, String)>>,
    ) -> Result<(bool, tern_core::request::InferRequest, crate::infer::Target)> {
        let empty_final = take_empty_final(&mut req)?;
        let mut request = codec::decode_request(req, &self.info.shm)?;
        if let Some(headers) = forwarded {
            super::common::forward_headers(&mut request, headers);
        }
        request.trace = trace;
        let target = self
            .info
            .infer
            .resolve(&request.model_name, request.model_version, || {
                crate::infer::request_timeout(&request)
            })
            .await?;
        Ok((empty_final, request, target))
    }

    /// Answers one request of a ModelStreamInfer stream: a decoupled model's
    /// responses as they come (each with `triton_final_response`; a bare
    /// final flag only when the client asked with
    /// `triton_enable_empty_final_response`), another model's one response.
    /// Errors are in-band messages; the stream stays open.
    async fn stream_one(
        &self,
        req: ModelInferRequest,
        tx: &tokio::sync::mpsc::Sender<StreamMsg>,
        traceparent: Option<&str>,
        forwarded: Option<Vec<(String, String)>>,
    ) {
        let (id, model_name, model_version) = (
            req.id.clone(),
            req.model_name.clone(),
            req.model_version.clone(),
        );
        let error = |message: String, last: Option<bool>| {
            let mut response = ModelInferResponse {
                id: id.clone(),
                ..Default::default()
            };
            if let Some(last) = last {
                response.model_name = model_name.clone();
                response.model_version = model_version.clone();
                final_flag(&mut response, last);
            }
            ModelStreamInferResponse {
                error_message: message,
                infer_response: Some(response),
            }
        };
        let infer = &self.info.infer;
        let trace = received(infer, &model_name, traceparent);
        let started = self.start_one(req, trace.clone(), forwarded).await;
        let (empty_final, request, target) = match started {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Ok(error(e.message, None))).await;
                return;
            }
        };
        let mut responses = match infer.stream(&target, request) {
            Ok(s) => s,
            Err(e) => {
                let _ = tx.send(Ok(error(e.message, Some(true)))).await;
                return;
            }
        };
        loop {
            // A client that cancels the stream drops its receiver, and with it
            // `responses`: the request is cancelled (dropped if still queued),
            // as Triton does, and a decoupled model's next send fails.
            let item = tokio::select! {
                item = responses.next() => item,
                _ = tx.closed() => return,
            };
            let Some(item) = item else { return };
            let last = item.last;
            let msg = match item.response {
                Some(Ok(r)) => {
                    let mut response = codec::encode_response(r, responses.requested());
                    final_flag(&mut response, last);
                    Some(ModelStreamInferResponse {
                        error_message: String::new(),
                        infer_response: Some(response),
                    })
                }
                Some(Err(e)) => Some(error(e.message, Some(last))),
                None if empty_final => {
                    let mut response = ModelInferResponse {
                        id: id.clone(),
                        model_name: model_name.clone(),
                        model_version: model_version.clone(),
                        ..Default::default()
                    };
                    final_flag(&mut response, true);
                    Some(ModelStreamInferResponse {
                        error_message: String::new(),
                        infer_response: Some(response),
                    })
                }
                None => None,
            };
            let trace = trace.as_ref().filter(|_| last);
            if let Some(t) = trace {
                t.timestamp("INFER_RESPONSE_COMPLETE");
                t.timestamp("GRPC_SEND_START");
            }
            if let Some(msg) = msg {
                if tx.send(Ok(msg)).await.is_err() {
                    return;
                }
            }
            if last {
                if let Some(t) = trace {
                    t.timestamp("GRPC_SEND_END");
                }
                return;
            }
        }
    }
}

/// A trace for a request to `model` when the tracer samples it, with the
/// time its message was read (tonic hands the handler a decoded message).
fn received(
    infer: &crate::infer::Infer,
    model: &str,
    traceparent: Option<&str>,
) -> Option<Arc<tern_core::trace::Trace>> {
    let trace = infer.tracer().sample(model, traceparent)?;
    trace.timestamp("GRPC_WAITREAD_START");
    trace.timestamp("GRPC_WAITREAD_END");
    Some(trace)
}

/// A `TraceSetting` request's update (`None`: no settings, a read): an
/// empty value list clears the value, more than one is refused but for
/// `trace_level`.
fn trace_update(
    settings: &HashMap<String, trace_setting_request::SettingValue>,
) -> Result<Option<crate::trace::Update>> {
    if settings.is_empty() {
        return Ok(None);
    }
    let mut entries = Vec::new();
    for (key, v) in settings {
        if key != "trace_level" && v.value.len() > 1 {
            return Err(Error::invalid_arg(format!(
                "expect only 1 value for '{key}'"
            )));
        }
        entries.push((key.as_str(), (!v.value.is_empty()).then(|| v.value.clone())));
    }
    crate::trace::Update::parse(entries, " ").map(Some)
}

/// Repository request parameters in protocol-neutral form.
fn control_values(
    params: HashMap<String, ModelRepositoryParameter>,
) -> impl Iterator<Item = (String, ControlValue)> {
    use model_repository_parameter::ParameterChoice as P;
    let mut params: Vec<_> = params.into_iter().collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    params.into_iter().map(|(k, p)| {
        let value = match p.parameter_choice {
            Some(P::BoolParam(b)) => ControlValue::Bool(b),
            Some(P::StringParam(s)) => ControlValue::String(s),
            Some(P::BytesParam(b)) => ControlValue::Bytes(b.to_vec()),
            Some(P::Int64Param(i)) => {
                u64::try_from(i).map_or(ControlValue::Other, ControlValue::Uint)
            }
            None => ControlValue::Other,
        };
        (k, value)
    })
}

fn log_settings_response(s: &crate::logging::Settings) -> LogSettingsResponse {
    use log_settings_response::setting_value::ParameterChoice as P;
    use log_settings_response::SettingValue as V;
    let v = |p: P| V {
        parameter_choice: Some(p),
    };
    let mut settings = HashMap::new();
    settings.insert("log_file".into(), v(P::StringParam(s.log_file.clone())));
    settings.insert("log_info".into(), v(P::BoolParam(s.log_info)));
    settings.insert("log_warning".into(), v(P::BoolParam(s.log_warning)));
    settings.insert("log_error".into(), v(P::BoolParam(s.log_error)));
    settings.insert(
        "log_verbose_level".into(),
        v(P::Uint32Param(s.log_verbose_level)),
    );
    settings.insert("log_format".into(), v(P::StringParam(s.log_format.clone())));
    LogSettingsResponse { settings }
}

type StreamOut = Pin<
    Box<dyn Stream<Item = std::result::Result<ModelStreamInferResponse, Status>> + Send + 'static>,
>;

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(
        &self,
        _: Request<ServerLiveRequest>,
    ) -> std::result::Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse {
            live: self.info.live(),
        }))
    }

    async fn server_ready(
        &self,
        _: Request<ServerReadyRequest>,
    ) -> std::result::Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse {
            ready: self.info.ready(),
        }))
    }

    async fn model_ready(
        &self,
        req: Request<ModelReadyRequest>,
    ) -> std::result::Result<Response<ModelReadyResponse>, Status> {
        let r = req.into_inner();
        let version = parse_version(&r.version).map_err(status)?;
        Ok(Response::new(ModelReadyResponse {
            ready: self.info.repository.get(&r.name, version).is_ok(),
        }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> std::result::Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: self.info.server_id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        req: Request<ModelMetadataRequest>,
    ) -> std::result::Result<Response<ModelMetadataResponse>, Status> {
        let r = req.into_inner();
        let version = parse_version(&r.version).map_err(status)?;
        let m = model_metadata(&self.info.repository, &r.name, version).map_err(status)?;
        let meta = |t: super::common::TensorMeta| model_metadata_response::TensorMetadata {
            name: t.name,
            datatype: t.datatype.to_string(),
            shape: t.shape,
        };
        Ok(Response::new(ModelMetadataResponse {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: m.inputs.into_iter().map(meta).collect(),
            outputs: m.outputs.into_iter().map(meta).collect(),
        }))
    }

    async fn model_infer(
        &self,
        req: Request<ModelInferRequest>,
    ) -> std::result::Result<Response<ModelInferResponse>, Status> {
        let traceparent = super::common::traceparent(req.metadata().as_ref()).map(str::to_string);
        let forwarded = self.forwarded(req.metadata());
        self.infer(req.into_inner(), traceparent.as_deref(), forwarded)
            .await
            .map(Response::new)
            .map_err(status)
    }

    type ModelStreamInferStream = StreamOut;

    async fn model_stream_infer(
        &self,
        req: Request<Streaming<ModelInferRequest>>,
    ) -> std::result::Result<Response<Self::ModelStreamInferStream>, Status> {
        let traceparent = super::common::traceparent(req.metadata().as_ref()).map(str::to_string);
        let forwarded = self.forwarded(req.metadata());
        let mut incoming = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let service = InferenceService {
            info: self.info.clone(),
            header_forward: None,
        };
        let service = Arc::new(service);
        tokio::spawn(async move {
            // Each request runs concurrently, all on this one task: its
            // responses go out in the order they complete (a sequence's in
            // the order it runs, as Triton sends them), which separate tasks
            // per request would not keep. The output stream ends when the
            // client has half-closed and every outstanding response was sent.
            let mut running = FuturesUnordered::new();
            let mut reading = true;
            loop {
                tokio::select! {
                    biased;
                    Some(()) = running.next(), if !running.is_empty() => {}
                    next = incoming.next(), if reading => {
                        let req = match next {
                            Some(Ok(r)) => r,
                            Some(Err(e)) => {
                                let _ = tx.send(Err(e)).await;
                                reading = false;
                                continue;
                            }
                            None => {
                                reading = false;
                                continue;
                            }
                        };
                        let (tx, service) = (tx.clone(), service.clone());
                        let (traceparent, forwarded) = (traceparent.clone(), forwarded.clone());
                        let mut one = Box::pin(async move {
                            service
                                .stream_one(req, &tx, traceparent.as_deref(), forwarded)
                                .await
                        });
                        // Its first poll decodes the request and hands it to its
                        // model's scheduler: done before the next message is read,
                        // so the requests of one stream reach their models in the
                        // order they were sent (a sequence's next request right
                        // behind its START, as Triton queues them).
                        let pending = std::future::poll_fn(|cx| {
                            std::task::Poll::Ready(std::future::Future::poll(one.as_mut(), cx).is_pending())
                        })
                        .await;
                        if pending {
                            // A request whose handling panics is logged and
                            // dropped alone, as on its own task: the stream
                            // and its other requests go on.
                            running.push(AssertUnwindSafe(one).catch_unwind().map(|r| {
                                if r.is_err() {
                                    tracing::error!("a request of a gRPC stream panicked");
                                }
                            }));
                        }
                    }
                    else => break,
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx)) as StreamOut))
    }

    async fn model_config(
        &self,
        req: Request<ModelConfigRequest>,
    ) -> std::result::Result<Response<ModelConfigResponse>, Status> {
        let r = req.into_inner();
        let version = parse_version(&r.version).map_err(status)?;
        let cfg = self
            .info
            .repository
            .config(&r.name, version)
            .map_err(status)?;
        Ok(Response::new(ModelConfigResponse {
            config: Some((*cfg).clone()),
        }))
    }

    async fn model_statistics(
        &self,
        req: Request<ModelStatisticsRequest>,
    ) -> std::result::Result<Response<ModelStatisticsResponse>, Status> {
        let r = req.into_inner();
        let version = parse_version(&r.version).map_err(status)?;
        let name = (!r.name.is_empty()).then_some(r.name.as_str());
        let handles = self
            .info
            .repository
            .handles(name, version)
            .map_err(status)?;
        let model_stats = handles
            .iter()
            .map(|h| statistics(&h.config.name, h.version, &h.stats()))
            .collect();
        Ok(Response::new(ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(
        &self,
        req: Request<RepositoryIndexRequest>,
    ) -> std::result::Result<Response<RepositoryIndexResponse>, Status> {
        let req = req.into_inner();
        if !req.repository_name.is_empty() {
            return Err(status(super::common::repository_name_unsupported()));
        }
        let ready_only = req.ready;
        let models = self
            .info
            .repository
            .index_with_unloaded()
            .into_iter()
            .filter(|e| !ready_only || e.state == crate::repository::State::Ready)
            .map(|e| repository_index_response::ModelIndex {
                name: e.name,
                version: e.version.map(|v| v.to_string()).unwrap_or_default(),
                state: e.state.as_str().to_string(),
                reason: e.reason,
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        req: Request<RepositoryModelLoadRequest>,
    ) -> std::result::Result<Response<RepositoryModelLoadResponse>, Status> {
        let r = req.into_inner();
        if !r.repository_name.is_empty() {
            return Err(status(super::common::repository_name_unsupported()));
        }
        let overrides =
            crate::repository::control::LoadOverride::from_parameters(control_values(r.parameters))
                .map_err(status)?;
        crate::frontend::common::load_model(&self.info, r.model_name, overrides)
            .await
            .map_err(status)?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        req: Request<RepositoryModelUnloadRequest>,
    ) -> std::result::Result<Response<RepositoryModelUnloadResponse>, Status> {
        let r = req.into_inner();
        if !r.repository_name.is_empty() {
            return Err(status(super::common::repository_name_unsupported()));
        }
        let dependents =
            crate::repository::control::unload_dependents(control_values(r.parameters))
                .map_err(status)?;
        crate::frontend::common::unload_model(&self.info, r.model_name, dependents)
            .await
            .map_err(status)?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        r: Request<SystemSharedMemoryStatusRequest>,
    ) -> std::result::Result<Response<SystemSharedMemoryStatusResponse>, Status> {
        let r = r.into_inner();
        let regions = self
            .info
            .shm
            .status(ShmKind::System, non_empty(&r.name))
            .map_err(status)?
            .into_iter()
            .map(|s| {
                let region = system_shared_memory_status_response::RegionStatus {
                    name: s.name.clone(),
                    key: s.key,
                    offset: s.offset,
                    byte_size: s.byte_size,
                };
                (s.name, region)
            })
            .collect();
        Ok(Response::new(SystemSharedMemoryStatusResponse { regions }))
    }

    async fn system_shared_memory_register(
        &self,
        r: Request<SystemSharedMemoryRegisterRequest>,
    ) -> std::result::Result<Response<SystemSharedMemoryRegisterResponse>, Status> {
        let r = r.into_inner();
        self.info
            .shm
            .register_system(&r.name, &r.key, r.offset, r.byte_size)
            .map_err(status)?;
        Ok(Response::new(SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_unregister(
        &self,
        r: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> std::result::Result<Response<SystemSharedMemoryUnregisterResponse>, Status> {
        let r = r.into_inner();
        self.info
            .shm
            .unregister(ShmKind::System, non_empty(&r.name))
            .map_err(status)?;
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }

    async fn cuda_shared_memory_status(
        &self,
        r: Request<CudaSharedMemoryStatusRequest>,
    ) -> std::result::Result<Response<CudaSharedMemoryStatusResponse>, Status> {
        let r = r.into_inner();
        let regions = self
            .info
            .shm
            .status(ShmKind::Cuda, non_empty(&r.name))
            .map_err(status)?
            .into_iter()
            .map(|s| {
                let region = cuda_shared_memory_status_response::RegionStatus {
                    name: s.name.clone(),
                    device_id: s.device_id as u64,
                    byte_size: s.byte_size,
                };
                (s.name, region)
            })
            .collect();
        Ok(Response::new(CudaSharedMemoryStatusResponse { regions }))
    }

    async fn cuda_shared_memory_register(
        &self,
        r: Request<CudaSharedMemoryRegisterRequest>,
    ) -> std::result::Result<Response<CudaSharedMemoryRegisterResponse>, Status> {
        let r = r.into_inner();
        let shm = self.info.shm.clone();
        tokio::task::spawn_blocking(move || {
            shm.register_cuda(&r.name, &r.raw_handle, r.device_id, r.byte_size)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(status)?;
        Ok(Response::new(CudaSharedMemoryRegisterResponse {}))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        r: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> std::result::Result<Response<CudaSharedMemoryUnregisterResponse>, Status> {
        let r = r.into_inner();
        self.info
            .shm
            .unregister(ShmKind::Cuda, non_empty(&r.name))
            .map_err(status)?;
        Ok(Response::new(CudaSharedMemoryUnregisterResponse {}))
    }

    async fn trace_setting(
        &self,
        req: Request<TraceSettingRequest>,
    ) -> std::result::Result<Response<TraceSettingResponse>, Status> {
        let req = req.into_inner();
        let model = (!req.model_name.is_empty()).then_some(req.model_name.as_str());
        let setting = super::common::trace_model_known(&self.info, model)
            .and_then(|()| trace_update(&req.settings))
            .and_then(|u| super::common::trace_setting(&self.info, model, u.as_ref()))
            .map_err(status)?;
        let mut settings = HashMap::new();
        for (key, value) in setting {
            // A repeated key (OpenTelemetry `resource`) keeps its values together.
            let entry: &mut trace_setting_response::SettingValue = settings.entry(key).or_default();
            entry.value.extend(value);
        }
        Ok(Response::new(TraceSettingResponse { settings }))
    }

    async fn log_settings(
        &self,
        req: Request<LogSettingsRequest>,
    ) -> std::result::Result<Response<LogSettingsResponse>, Status> {
        use log_settings_request::setting_value::ParameterChoice as P;
        let settings = req.into_inner().settings;
        if settings.is_empty() {
            return Ok(Response::new(log_settings_response(
                &crate::logging::settings(),
            )));
        }
        use ControlValue as V;
        // As Triton: log_file present at all (with or without a value) is refused first.
        if settings.contains_key("log_file") {
            return Err(status(tern_core::messages::log_file_unsupported()));
        }
        let mut changes = Vec::with_capacity(settings.len());
        for (k, v) in settings {
            let value = match v.parameter_choice {
                Some(P::BoolParam(b)) => V::Bool(b),
                Some(P::Uint32Param(u)) => V::Uint(u.into()),
                Some(P::StringParam(s)) => V::String(s),
                None => {
                    return Err(grpc_status(&Error::invalid_arg(format!(
                        "log setting '{k}' has no value"
                    ))))
                }
            };
            changes.push((k, value));
        }
        // In name order, as HTTP's JSON object is read: the same request gets
        // the same error whichever setting is wrong first.
        changes.sort_by(|a, b| a.0.cmp(&b.0));
        let updated = crate::logging::update(&changes).map_err(status)?;
        Ok(Response::new(log_settings_response(&updated)))
    }
}

/// `grpc.health.v1.Health`: SERVING when the server is ready.
pub struct HealthService {
    info: Arc<ServerInfo>,
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(
        &self,
        _: Request<HealthCheckRequest>,
    ) -> std::result::Result<Response<HealthCheckResponse>, Status> {
        let status = if self.info.ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        Ok(Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    }
}

/// Builds the gRPC server (services, limits, keepalive, TLS). Bad TLS
/// material is an error here, at startup.
pub fn build(info: Arc<ServerInfo>, settings: &GrpcSettings) -> Result<GrpcServer> {
    let mut inference = GrpcInferenceServiceServer::new(InferenceService {
        info: info.clone(),
        header_forward: settings.header_forward.clone(),
    })
    .accept_compressed(CompressionEncoding::Gzip)
    .accept_compressed(CompressionEncoding::Deflate)
    .max_decoding_message_size(settings.max_message_size)
    .max_encoding_message_size(settings.max_message_size);
    if settings.compress_responses {
        inference = inference.send_compressed(CompressionEncoding::Gzip);
    }
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(settings.keepalive_time))
        .http2_keepalive_timeout(Some(settings.keepalive_timeout));
    let tls = settings
        .tls
        .as_ref()
        .map(listener::tls_acceptor)
        .transpose()?;
    if let Some(age) = settings.max_connection_age {
        builder = builder.max_connection_age(age);
    }
    if let Some(grace) = settings.max_connection_age_grace {
        builder = builder.max_connection_age_grace(grace);
    }
    let rules = Arc::new(settings.restrictions.clone());
    let router = builder
        .add_service(Restricted {
            inner: inference,
            rules: rules.clone(),
        })
        .add_service(Restricted {
            inner: HealthServer::new(HealthService { info }),
            rules,
        });
    Ok(GrpcServer {
        router,
        tls,
        pings: settings.pings,
    })
}

/// Wraps a gRPC service with the `--grpc-restricted-protocol` check, which
/// runs before the call reaches the service (unary and streaming alike), and
/// with the client deadline ([`deadline`]).
#[derive(Clone)]
pub struct Restricted<S> {
    inner: S,
    rules: Arc<Restrictions>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Restricted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for Restricted<S>
where
    S: tonic::codegen::Service<
        tonic::codegen::http::Request<B>,
        Response = tonic::codegen::http::Response<tonic::body::Body>,
        Error = std::convert::Infallible,
    >,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::result::Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        if let Some(category) = grpc_category(req.uri().path()) {
            let headers = req.headers();
            if let Err(key) = self
                .rules
                .check(category, |k| headers.get(k).and_then(|v| v.to_str().ok()))
            {
                let status = Status::unavailable(format!(
                    "This protocol is restricted, expecting header '{key}'"
                ));
                return Box::pin(async move { Ok(status.into_http()) });
            }
        }
        let timeout = deadline::grpc_timeout(req.headers());
        deadline::bounded(self.inner.call(req), timeout)
    }
}

/// Serves a built gRPC server on its listeners until `shutdown` resolves (in-flight calls finish first).
pub async fn serve(
    server: GrpcServer,
    listeners: Vec<crate::frontend::listen::Listener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::result::Result<(), tonic::transport::Error> {
    let incoming = listener::accept(listeners, server.tls, server.pings);
    server
        .router
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}

/// An empty name means "all regions" in the shared-memory RPCs.
fn non_empty(name: &str) -> Option<&str> {
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_mapping_follows_triton() {
        let c = |e: Error| grpc_status(&e).code();
        assert_eq!(c(Error::invalid_arg("x")), tonic::Code::InvalidArgument);
        assert_eq!(c(Error::not_found("x")), tonic::Code::NotFound);
        assert_eq!(c(Error::unavailable("x")), tonic::Code::Unavailable);
        assert_eq!(c(Error::unsupported("x")), tonic::Code::Unimplemented);
        assert_eq!(grpc_status(&Error::internal("x")).message(), "x");
    }
}
