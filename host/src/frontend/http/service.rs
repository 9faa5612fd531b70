//! The HTTP frontend's hyper service: `POST /v2/models/{model}[/versions/{version}]/infer`
//! goes straight to the inference handler, every other request through the axum router.
//!
//! Inference is the one hot route. Through axum a small request paid ~2 µs of CPU (about an
//! eighth of what Tern's whole path costs it) for the route match, the boxed per-route services and the
//! path-parameter extraction; matching the two inference paths by hand skips them
//! (docs/PERFORMANCE.md, HTTP `simple`). The answers are the same either way: a path this
//! matcher does not take (percent-escapes, an extra segment, another method, an
//! `--http-restricted-api` server) is left to the router, which has the route too.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request};
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;

use super::{answer_infer, router, HttpState};

/// One HTTP connection's service (cloned per connection: two `Arc`s).
#[derive(Clone)]
pub struct HttpService {
    state: Arc<HttpState>,
    router: TowerToHyperService<Router>,
}

impl HttpService {
    /// The service for a frontend with this state.
    pub fn new(state: Arc<HttpState>) -> HttpService {
        HttpService {
            router: TowerToHyperService::new(router(state.clone())),
            state,
        }
    }
}

impl hyper::service::Service<Request<Incoming>> for HttpService {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        // The restriction check is a layer of the router: a restricted server routes all.
        if req.method() == Method::POST && self.state.restrictions.is_empty() {
            if let Some((model, version)) = infer_target(req.uri().path()) {
                let (model, version) = (model.to_owned(), version.map(str::to_owned));
                let state = self.state.clone();
                return Box::pin(async move {
                    let req = req.map(Body::new);
                    Ok(answer_infer(&state, &model, version.as_deref(), req).await)
                });
            }
        }
        Box::pin(hyper::service::Service::call(&self.router, req))
    }
}

/// The model and version segments of an inference path, `/v2/models/{model}/infer` or
/// `/v2/models/{model}/versions/{version}/infer`, when both are non-empty and have no
/// percent-escapes. `None` for any other path: the router then takes it (it also
/// matches empty segments, e.g. `versions//infer` as the default version, and
/// decodes escapes).
fn infer_target(path: &str) -> Option<(&str, Option<&str>)> {
    let rest = path.strip_prefix("/v2/models/")?.strip_suffix("/infer")?;
    let (model, version) = match rest.split_once('/') {
        None => (rest, None),
        Some((model, tail)) => (model, Some(tail.strip_prefix("versions/")?)),
    };
    let plain = |s: &str| !s.is_empty() && !s.contains(['/', '%']);
    (plain(model) && version.is_none_or(plain)).then_some((model, version))
}

#[cfg(test)]
mod tests {
    use super::infer_target;

    #[test]
    fn matches_the_two_inference_paths() {
        assert_eq!(
            infer_target("/v2/models/simple/infer"),
            Some(("simple", None))
        );
        assert_eq!(
            infer_target("/v2/models/simple/versions/3/infer"),
            Some(("simple", Some("3")))
        );
        // A model may be called "versions" or "infer".
        assert_eq!(
            infer_target("/v2/models/versions/infer"),
            Some(("versions", None))
        );
        assert_eq!(
            infer_target("/v2/models/infer/versions/x/infer"),
            Some(("infer", Some("x")))
        );
    }

    #[test]
    fn leaves_everything_else_to_the_router() {
        for path in [
            "/v2/models/simple",
            "/v2/models/simple/infer/",
            "/v2/models//infer",
            "/v2/models/infer",
            "/v2/models/a/b/infer",
            "/v2/models/simple/versions//infer",
            "/v2/models/simple/versions/1/2/infer",
            "/v2/models/simple/version/1/infer",
            "/v2/models/my%20model/infer",
            "/v2/models/simple/versions/%31/infer",
            "/v2/models/simple/generate",
            "//v2/models/simple/infer",
            "/v2/models/simple/stats",
        ] {
            assert_eq!(infer_target(path), None, "{path}");
        }
    }
}
