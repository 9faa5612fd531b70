//! Traces as OpenTelemetry spans (`--trace-config mode=opentelemetry`),
//! shaped as Triton shapes them: a request's `InferRequest` span (the
//! frontend's timestamps as events) over a span named for the model
//! (`REQUEST_START`, `QUEUE_START`, `REQUEST_END`; Triton's `triton.*`
//! attributes) over a `compute` span (the `COMPUTE_*` timestamps); an
//! ensemble step's or BLS call's model span sits under its parent's. Spans
//! go to the collector as OTLP/HTTP JSON through the OpenTelemetry SDK's
//! batch span processor (`bsp_*` settings); a client's W3C `traceparent` is
//! continued.

use std::collections::HashMap;
use std::sync::Once;
use std::time::{Duration, Instant, SystemTime};

use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use tern_core::error::{Error, Result};
use tern_core::trace::{Entry, Record, RemoteParent};

use super::clock::Clock;

/// Triton's default collector.
pub const DEFAULT_URL: &str = "http://localhost:4318/v1/traces";

/// The exporter's settings (`--trace-config opentelemetry,<key>=<value>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelConfig {
    /// The collector's OTLP/HTTP traces endpoint.
    pub url: String,
    /// Resource attributes (`resource=<key>=<value>`, repeatable).
    pub resource: Vec<(String, String)>,
    /// `bsp_max_queue_size`: spans held before new ones are dropped.
    pub max_queue_size: u32,
    /// `bsp_schedule_delay`: milliseconds between exports.
    pub schedule_delay_ms: u32,
    /// `bsp_max_export_batch_size`: spans per export.
    pub max_export_batch_size: u32,
}

impl Default for OtelConfig {
    /// Triton's defaults, which the SDK's `OTEL_BSP_*` variables change.
    fn default() -> Self {
        let env = |name: &str, default: u32| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(default)
        };
        OtelConfig {
            url: DEFAULT_URL.into(),
            resource: Vec::new(),
            max_queue_size: env("OTEL_BSP_MAX_QUEUE_SIZE", 2048),
            schedule_delay_ms: env("OTEL_BSP_SCHEDULE_DELAY", 5000),
            max_export_batch_size: env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
        }
    }
}

impl OtelConfig {
    /// The settings from the `opentelemetry,` pairs, in order.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<OtelConfig> {
        let mut c = OtelConfig::default();
        for (key, value) in pairs {
            let number = || {
                value.trim().parse::<u32>().map_err(|_| {
                    Error::invalid_arg(format!(
                        "Bad option: \"--trace-config opentelemetry,{key}\". Invalid option value. Got {value}"
                    ))
                })
            };
            match key.as_str() {
                "url" => c.url = value.clone(),
                "resource" => {
                    let (k, v) = value.split_once('=').unwrap_or((value, ""));
                    c.resource.push((k.to_string(), v.to_string()));
                }
                "bsp_max_queue_size" => c.max_queue_size = number()?,
                "bsp_schedule_delay" => c.schedule_delay_ms = number()?,
                "bsp_max_export_batch_size" => c.max_export_batch_size = number()?,
                _ => {}
            }
        }
        Ok(c)
    }

    /// What the trace extension shows of the mode's settings: the command
    /// line's, then each `bsp_*` setting it did not give, at its value.
    pub fn shown(&self, given: &[(String, String)]) -> Vec<(String, String)> {
        let mut out = given.to_vec();
        for (key, value) in [
            ("bsp_max_export_batch_size", self.max_export_batch_size),
            ("bsp_schedule_delay", self.schedule_delay_ms),
            ("bsp_max_queue_size", self.max_queue_size),
        ] {
            if !given.iter().any(|(k, _)| k == key) {
                out.push((key.to_string(), value.to_string()));
            }
        }
        out
    }
}

/// A W3C `traceparent` header (`00-<trace id>-<span id>-<flags>`), or
/// `None` when it is not a valid one.
pub fn parse_traceparent(header: &str) -> Option<RemoteParent> {
    let parts: Vec<&str> = header.trim().split('-').collect();
    let [version, trace, span, flags, ..] = parts[..] else {
        return None;
    };
    let hex = |s: &str, n: usize| -> Option<Vec<u8>> {
        if s.len() != 2 * n
            || !s
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return None;
        }
        (0..n)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
            .collect()
    };
    let version = hex(version, 1)?[0];
    if version == 0xff || (version == 0 && parts.len() != 4) {
        return None;
    }
    let trace_id: [u8; 16] = hex(trace, 16)?.try_into().ok()?;
    let span_id: [u8; 8] = hex(span, 8)?.try_into().ok()?;
    if trace_id == [0; 16] || span_id == [0; 8] {
        return None;
    }
    Some(RemoteParent {
        trace_id,
        span_id,
        flags: hex(flags, 1)?[0],
    })
}

/// The SDK's tracer provider with Triton's resource and batch settings.
pub struct Exporter {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Exporter {
    /// Builds the exporter (nothing is sent until spans end).
    pub fn new(config: &OtelConfig) -> Result<Exporter> {
        let uri: axum::http::Uri = config.url.parse().map_err(|e| {
            Error::invalid_arg(format!(
                "--trace-config opentelemetry,url='{}' is not a URL: {e}",
                config.url
            ))
        })?;
        if uri.scheme_str() != Some("http") {
            return Err(Error::unsupported(format!(
                "--trace-config opentelemetry,url='{}': Tern exports to an http:// collector (TLS is not built in; \
                 run the collector or a proxy on the device)",
                config.url
            )));
        }
        let config = config.clone();
        // The exporter's blocking HTTP client must not be made on an async worker.
        std::thread::spawn(move || Exporter::build(&config))
            .join()
            .map_err(|_| Error::internal("building the OpenTelemetry exporter panicked"))?
    }

    fn build(config: &OtelConfig) -> Result<Exporter> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .with_endpoint(config.url.clone())
            .build()
            .map_err(|e| {
                Error::internal(format!("cannot create the OpenTelemetry exporter: {e}"))
            })?;
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(config.max_queue_size.max(1) as usize)
            .with_scheduled_delay(Duration::from_millis(config.schedule_delay_ms.into()))
            .with_max_export_batch_size(config.max_export_batch_size.max(1) as usize)
            .build();
        let mut resource = Resource::builder().with_service_name("triton-inference-server");
        for (k, v) in &config.resource {
            resource = resource.with_attribute(KeyValue::new(k.clone(), v.clone()));
        }
        let provider = SdkTracerProvider::builder()
            .with_span_processor(
                BatchSpanProcessor::builder(exporter)
                    .with_batch_config(batch)
                    .build(),
            )
            .with_sampler(Sampler::AlwaysOn)
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer("triton-server");
        Ok(Exporter { provider, tracer })
    }

    /// Turns a finished trace tree into spans; the batch processor sends them.
    pub fn export(&self, mut tree: Vec<Record>, clock: &Clock) {
        // A child's id is always above its parent's: parents' spans exist first.
        tree.sort_by_key(|r| r.id);
        let time = |at: Instant| clock.system_time(at);
        let mut model_spans: HashMap<u64, Context> = HashMap::new();
        let mut to_end: Vec<(Context, SystemTime)> = Vec::new();
        for r in &tree {
            if r.entries.iter().any(|e| matches!(e, Entry::Tensor(..))) {
                static ONCE: Once = Once::new();
                ONCE.call_once(|| {
                    tracing::error!(
                        "Tensor level tracing is not supported by the mode: opentelemetry"
                    );
                });
            }
            let stamps: Vec<(&'static str, SystemTime)> = r
                .entries
                .iter()
                .filter_map(|e| match e {
                    Entry::Timestamp(name, at) => Some((*name, time(*at))),
                    Entry::Tensor(..) => None,
                })
                .collect();
            let started = r.started.map(time).unwrap_or_else(SystemTime::now);
            let ended = r.ended.map(time).unwrap_or_else(SystemTime::now);
            let parent = if r.parent_id != 0 {
                model_spans.get(&r.parent_id).cloned().unwrap_or_default()
            } else {
                let remote = match r.remote_parent {
                    Some(p) => Context::new().with_remote_span_context(SpanContext::new(
                        TraceId::from_bytes(p.trace_id),
                        SpanId::from_bytes(p.span_id),
                        TraceFlags::new(p.flags),
                        true,
                        TraceState::default(),
                    )),
                    None => Context::new(),
                };
                let events = stamps.iter().filter(|(n, _)| is_frontend(n));
                let cx = self.span("InferRequest", started, &remote, events, Vec::new());
                to_end.push((cx.clone(), ended));
                cx
            };
            let at = |name: &str| stamps.iter().find(|(n, _)| *n == name).map(|(_, t)| *t);
            let mut attributes = vec![
                KeyValue::new("triton.model_name", r.model_name.clone()),
                KeyValue::new("triton.model_version", r.model_version),
                KeyValue::new("triton.trace_id", r.id as i64),
                KeyValue::new("triton.trace_parent_id", r.parent_id as i64),
            ];
            if !r.request_id.is_empty() {
                attributes.push(KeyValue::new("triton.request_id", r.request_id.clone()));
            }
            let model_events = stamps
                .iter()
                .filter(|(n, _)| !is_frontend(n) && !n.starts_with("COMPUTE_"));
            let model_start = at("REQUEST_START").unwrap_or(started);
            let model_end = at("REQUEST_END").unwrap_or(ended);
            let model = self.span(
                r.model_name.clone(),
                model_start,
                &parent,
                model_events,
                attributes,
            );
            if let Some(start) = at("COMPUTE_START") {
                let events = stamps.iter().filter(|(n, _)| n.starts_with("COMPUTE_"));
                let compute = self.span("compute", start, &model, events, Vec::new());
                to_end.push((compute, at("COMPUTE_END").unwrap_or(model_end)));
            }
            model_spans.insert(r.id, model.clone());
            to_end.push((model, model_end));
        }
        // Innermost first, as Triton ends them.
        for (cx, at) in to_end.into_iter().rev() {
            cx.span().end_with_timestamp(at);
        }
    }

    fn span<'a>(
        &self,
        name: impl Into<std::borrow::Cow<'static, str>>,
        start: SystemTime,
        parent: &Context,
        events: impl Iterator<Item = &'a (&'static str, SystemTime)>,
        attributes: Vec<KeyValue>,
    ) -> Context {
        let mut span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_start_time(start)
            .with_attributes(attributes)
            .start_with_context(&self.tracer, parent);
        for (name, at) in events {
            span.add_event_with_timestamp(*name, *at, Vec::new());
        }
        parent.with_span(span)
    }

    /// Sends what the batch processor holds and stops it.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!("OpenTelemetry exporter shutdown: {e}");
        }
    }
}

/// The frontend's timestamps, which belong to the `InferRequest` span.
fn is_frontend(name: &str) -> bool {
    name.starts_with("HTTP_") || name.starts_with("GRPC_") || name == "INFER_RESPONSE_COMPLETE"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_headers() {
        let p =
            parse_traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").unwrap();
        assert_eq!(p.trace_id[0], 0x0a);
        assert_eq!(p.span_id[7], 0x31);
        assert_eq!(p.flags, 1);
        for bad in [
            "zz-bad",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad}");
        }
    }

    #[test]
    fn settings_and_what_the_extension_shows() {
        let pairs = [
            ("url".to_string(), "http://c:4318/v1/traces".to_string()),
            ("resource".to_string(), "service.name=edge".to_string()),
            ("bsp_schedule_delay".to_string(), "100".to_string()),
        ];
        let c = OtelConfig::from_pairs(&pairs).unwrap();
        assert_eq!(c.url, "http://c:4318/v1/traces");
        assert_eq!(
            c.resource,
            [("service.name".to_string(), "edge".to_string())]
        );
        assert_eq!(c.schedule_delay_ms, 100);
        let keys: Vec<String> = c.shown(&pairs).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys,
            [
                "url",
                "resource",
                "bsp_schedule_delay",
                "bsp_max_export_batch_size",
                "bsp_max_queue_size"
            ]
        );
        let bad = [("bsp_max_queue_size".to_string(), "abc".to_string())];
        assert!(OtelConfig::from_pairs(&bad)
            .unwrap_err()
            .message
            .contains("Invalid option value. Got abc"));
        assert_eq!(
            Exporter::new(&OtelConfig {
                url: "https://c/v1/traces".into(),
                ..Default::default()
            })
            .err()
            .unwrap()
            .code,
            tern_core::Code::Unsupported
        );
    }
}
