//! Client deadlines (`grpc-timeout`) end with `DEADLINE_EXCEEDED`, as with
//! tritonserver (whose gRPC runtime answers so). tonic's own deadline layer
//! answers `CANCELLED "Timeout expired"` instead; this wrapper sits inside it
//! and fires first (1 ms earlier), so clients see the status they expect.
//! The dropped call future cancels the work still queued for it.

use std::time::Duration;

use tonic::codegen::http::{HeaderMap, Request, Response};
use tonic::Status;

/// How much earlier than tonic's own deadline layer this one fires.
const AHEAD: Duration = Duration::from_millis(1);

/// Wraps a gRPC service with the client-deadline check.
#[derive(Clone)]
pub struct Deadline<S>(pub S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for Deadline<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tonic::codegen::Service<Request<B>> for Deadline<S>
where
    S: tonic::codegen::Service<
        Request<B>,
        Response = Response<tonic::body::Body>,
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
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let timeout = grpc_timeout(req.headers());
        let call = self.0.call(req);
        match timeout {
            None => Box::pin(call),
            Some(t) => Box::pin(async move {
                match tokio::time::timeout(t.saturating_sub(AHEAD), call).await {
                    Ok(r) => r,
                    Err(_) => Ok(Status::deadline_exceeded("Deadline Exceeded").into_http()),
                }
            }),
        }
    }
}

/// The `grpc-timeout` header (gRPC over HTTP/2: up to 8 digits and a unit
/// `H`, `M`, `S`, `m`, `u` or `n`); `None` when absent or malformed (then
/// there is no deadline, as in tonic).
fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get("grpc-timeout")?.to_str().ok()?;
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: &str) -> Option<Duration> {
        let mut h = HeaderMap::new();
        h.insert("grpc-timeout", v.parse().unwrap());
        grpc_timeout(&h)
    }

    #[test]
    fn parses_the_grpc_timeout_header() {
        assert_eq!(parse("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse("99999999n"), Some(Duration::from_nanos(99_999_999)));
        assert_eq!(parse("123456789S"), None, "more than 8 digits");
        assert_eq!(parse("10x"), None);
        assert_eq!(parse("m"), None);
        assert_eq!(grpc_timeout(&HeaderMap::new()), None);
    }
}
