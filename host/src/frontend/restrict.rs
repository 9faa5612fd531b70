//! Restricted APIs, Triton's only access control: `--http-restricted-api` and
//! `--grpc-restricted-protocol` take `<category>[,<category>...]:<key>=<value>`;
//! a call to an endpoint of a restricted category must carry the header (gRPC:
//! metadata) `<key>: <value>`, else it gets HTTP 403 / gRPC UNAVAILABLE. Every
//! endpoint of both frontends, streams included, belongs to exactly one category.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// Triton's API categories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    Health,
    Metadata,
    Inference,
    SharedMemory,
    ModelConfig,
    ModelRepository,
    Statistics,
    Trace,
    Logging,
}

const NAMES: &[(&str, Category)] = &[
    ("health", Category::Health),
    ("metadata", Category::Metadata),
    ("inference", Category::Inference),
    ("shared-memory", Category::SharedMemory),
    ("model-config", Category::ModelConfig),
    ("model-repository", Category::ModelRepository),
    ("statistics", Category::Statistics),
    ("trace", Category::Trace),
    ("logging", Category::Logging),
];

/// The restrictions of one frontend.
#[derive(Debug, Clone, Default)]
pub struct Restrictions {
    rules: HashMap<Category, (String, String)>,
}

impl Restrictions {
    /// Parses the values of `flag` (each `<categories>:<key>=<value>`).
    pub fn parse(specs: &[String], flag: &str) -> Result<Restrictions> {
        let mut rules = HashMap::new();
        for spec in specs {
            let bad = |why: &str| {
                Error::invalid_arg(format!(
                    "{flag} '{spec}': {why} (expected <category>[,<category>...]:<key>=<value>)"
                ))
            };
            let (cats, kv) = spec.split_once(':').ok_or_else(|| bad("missing ':'"))?;
            let (key, value) = kv.split_once('=').ok_or_else(|| bad("missing '='"))?;
            if key.is_empty() {
                return Err(bad("empty header name"));
            }
            for name in cats.split(',').map(str::trim) {
                let cat = NAMES
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, c)| *c)
                    .ok_or_else(|| {
                        bad(&format!(
                            "unknown category '{name}'; categories are {}",
                            NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                        ))
                    })?;
                if rules
                    .insert(cat, (key.to_ascii_lowercase(), value.to_string()))
                    .is_some()
                {
                    return Err(bad(&format!(
                        "category '{name}' is restricted more than once"
                    )));
                }
            }
        }
        Ok(Restrictions { rules })
    }

    /// Whether anything is restricted.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Checks a call; `Err(key)` names the header that was missing or wrong.
    pub fn check<'a>(
        &'a self,
        category: Category,
        header: impl Fn(&str) -> Option<&'a str>,
    ) -> std::result::Result<(), &'a str> {
        match self.rules.get(&category) {
            Some((key, value)) if header(key) != Some(value.as_str()) => Err(key),
            _ => Ok(()),
        }
    }
}

/// The category of an HTTP endpoint (`None` for unknown paths, which get 404 anyway).
pub fn http_category(path: &str) -> Option<Category> {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    Some(match parts.as_slice() {
        ["v2"] => Category::Metadata,
        ["v2", "health", ..] => Category::Health,
        ["v2", "logging"] => Category::Logging,
        ["v2", "trace", ..] => Category::Trace,
        ["v2", "repository", ..] => Category::ModelRepository,
        ["v2", "systemsharedmemory", ..] | ["v2", "cudasharedmemory", ..] => Category::SharedMemory,
        ["v2", "models", "stats"] => Category::Statistics,
        ["v2", "models", .., last] => match *last {
            "ready" => Category::Health,
            "config" => Category::ModelConfig,
            "infer" => Category::Inference,
            "stats" => Category::Statistics,
            "trace" => Category::Trace,
            _ => Category::Metadata,
        },
        _ => return None,
    })
}

/// The category of a gRPC method path (`/package.Service/Method`).
pub fn grpc_category(path: &str) -> Option<Category> {
    let method = path.rsplit('/').next()?;
    Some(match method {
        "ServerLive" | "ServerReady" | "ModelReady" | "Check" => Category::Health,
        "ServerMetadata" | "ModelMetadata" => Category::Metadata,
        "ModelInfer" | "ModelStreamInfer" => Category::Inference,
        "ModelConfig" => Category::ModelConfig,
        "ModelStatistics" => Category::Statistics,
        "RepositoryIndex" | "RepositoryModelLoad" | "RepositoryModelUnload" => {
            Category::ModelRepository
        }
        m if m.contains("SharedMemory") => Category::SharedMemory,
        "TraceSetting" => Category::Trace,
        "LogSettings" => Category::Logging,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_check() {
        let r = Restrictions::parse(
            &[
                "inference,model-config:X-Key=secret".into(),
                "health:a=b".into(),
            ],
            "--x",
        )
        .unwrap();
        assert_eq!(r.check(Category::Inference, |_| None), Err("x-key"));
        assert_eq!(
            r.check(Category::Inference, |k| (k == "x-key").then_some("secret")),
            Ok(())
        );
        assert_eq!(
            r.check(Category::Inference, |_| Some("wrong")),
            Err("x-key")
        );
        assert_eq!(r.check(Category::Statistics, |_| None), Ok(()));
        assert!(Restrictions::parse(&["bogus:a=b".into()], "--x")
            .unwrap_err()
            .message
            .contains("unknown category 'bogus'"));
        assert!(
            Restrictions::parse(&["health:a=b".into(), "health:c=d".into()], "--x")
                .unwrap_err()
                .message
                .contains("more than once")
        );
        assert!(Restrictions::parse(&["health:ab".into()], "--x").is_err());
    }

    #[test]
    fn every_endpoint_has_a_category() {
        for (path, cat) in [
            ("/v2", Category::Metadata),
            ("/v2/health/live", Category::Health),
            ("/v2/models/m", Category::Metadata),
            ("/v2/models/m/versions/2", Category::Metadata),
            ("/v2/models/m/ready", Category::Health),
            ("/v2/models/m/versions/2/config", Category::ModelConfig),
            ("/v2/models/m/infer", Category::Inference),
            ("/v2/models/stats", Category::Statistics),
            ("/v2/models/m/versions/1/stats", Category::Statistics),
            ("/v2/repository/index", Category::ModelRepository),
            ("/v2/logging", Category::Logging),
        ] {
            assert_eq!(http_category(path), Some(cat), "{path}");
        }
        for (m, cat) in [
            (
                "/inference.GRPCInferenceService/ModelStreamInfer",
                Category::Inference,
            ),
            (
                "/inference.GRPCInferenceService/CudaSharedMemoryRegister",
                Category::SharedMemory,
            ),
            ("/grpc.health.v1.Health/Check", Category::Health),
            (
                "/inference.GRPCInferenceService/LogSettings",
                Category::Logging,
            ),
        ] {
            assert_eq!(grpc_category(m), Some(cat), "{m}");
        }
    }
}
