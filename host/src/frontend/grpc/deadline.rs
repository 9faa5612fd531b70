//! Client deadlines (`grpc-timeout`) end with `DEADLINE_EXCEEDED`, as with
//! tritonserver (whose gRPC runtime answers so). tonic's own deadline layer
//! answers `CANCELLED "Timeout expired"` instead; the service wrapper
//! (`Restricted`) runs each call through [`bounded`], inside tonic's layer,
//! which fires first (1 ms earlier), so clients see the status they expect.
//! The dropped call future cancels the work still queued for it.

use std::future::Future;
use std::time::Duration;

use tonic::body::Body;
use tonic::codegen::http::{HeaderMap, Response};
use tonic::codegen::BoxFuture;
use tonic::Status;

/// How much earlier than tonic's own deadline layer this one fires.
const AHEAD: Duration = Duration::from_millis(1);

/// Runs a call, ending it with `DEADLINE_EXCEEDED` when `timeout` passes
/// first (dropping the call future cancels its queued work).
pub fn bounded<F, E>(call: F, timeout: Option<Duration>) -> BoxFuture<Response<Body>, E>
where
    F: Future<Output = Result<Response<Body>, E>> + Send + 'static,
{
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

/// The `grpc-timeout` header (gRPC over HTTP/2: up to 8 digits and a unit
/// `H`, `M`, `S`, `m`, `u` or `n`); `None` when absent or malformed (then
/// there is no deadline, as in tonic).
pub fn grpc_timeout(headers: &HeaderMap) -> Option<Duration> {
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
