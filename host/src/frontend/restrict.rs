//! Restricted APIs, Triton's only access control: `--http-restricted-api` and
//! `--grpc-restricted-protocol` take `<category>[,<category>...]:<key>=<value>`;
//! a call to an endpoint of a restricted category must carry the header
//! `<key>: <value>` (gRPC, as in Triton: the metadata
//! `triton-grpc-protocol-<key>: <value>`), else it gets HTTP 403 / gRPC
//! UNAVAILABLE. Every
//! endpoint of both frontends, streams included, belongs to exactly one category.

use std::collections::HashMap;

use tern_core::error::{Error, Result};

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

/// The prefix Triton puts before a `--grpc-restricted-protocol` key: the
/// metadata a gRPC call must carry is `triton-grpc-protocol-<key>`.
pub const GRPC_KEY_PREFIX: &str = "triton-grpc-protocol-";

/// One restricted category: the header (gRPC: metadata) it needs.
#[derive(Debug, Clone)]
struct Rule {
    /// The header name as configured (with the gRPC prefix), for messages.
    key: String,
    /// The same, lower case, for the lookup (header names are case-insensitive).
    lookup: String,
    /// The value the header must have.
    value: String,
}

/// The restrictions of one frontend.
#[derive(Debug, Clone, Default)]
pub struct Restrictions {
    rules: HashMap<Category, Rule>,
}

impl Restrictions {
    /// Parses the values of `flag` (each `<categories>:<key>=<value>`).
    /// `--grpc-restricted-protocol` keys get Triton's [`GRPC_KEY_PREFIX`];
    /// `--http-restricted-api` keys are used as given. Errors start with
    /// Triton's wording (`unknown restricted protocol 'x'`, `restricted api
    /// 'x' can not be specified in multiple config groups`).
    pub fn parse(specs: &[String], flag: &str) -> Result<Restrictions> {
        let grpc = flag.contains("grpc");
        let (feature, prefix) = if grpc {
            ("protocol", GRPC_KEY_PREFIX)
        } else {
            ("api", "")
        };
        let mut rules = HashMap::new();
        for spec in specs {
            let bad_format = |why: &str| {
                Error::invalid_arg(format!(
                    "{flag} option format is '<config name>:<setting>=<value>'. Got {spec} \
                     ({why}; expected <category>[,<category>...]:<key>=<value>)"
                ))
            };
            let (cats, kv) = spec
                .split_once(':')
                .ok_or_else(|| bad_format("missing ':'"))?;
            let (key, value) = kv
                .split_once('=')
                .ok_or_else(|| bad_format("missing '='"))?;
            if key.is_empty() {
                return Err(bad_format("empty header name"));
            }
            let key = format!("{prefix}{key}");
            for name in cats.split(',').map(str::trim) {
                let cat = NAMES
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, c)| *c)
                    .ok_or_else(|| {
                        Error::invalid_arg(format!(
                            "unknown restricted {feature} '{name}' ({flag} '{spec}'; categories are {})",
                            NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                        ))
                    })?;
                let rule = Rule {
                    lookup: key.to_ascii_lowercase(),
                    key: key.clone(),
                    value: value.to_string(),
                };
                if rules.insert(cat, rule).is_some() {
                    return Err(Error::invalid_arg(format!(
                        "restricted {feature} '{name}' can not be specified in multiple config groups \
                         ({flag} '{spec}')"
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

    /// Checks a call; `header` is asked for the lower-case header name.
    /// `Err(key)` names the header that was missing or wrong, as configured
    /// (for gRPC with its `triton-grpc-protocol-` prefix).
    pub fn check<'a>(
        &'a self,
        category: Category,
        header: impl Fn(&str) -> Option<&'a str>,
    ) -> std::result::Result<(), &'a str> {
        match self.rules.get(&category) {
            Some(rule) if header(&rule.lookup) != Some(rule.value.as_str()) => Err(&rule.key),
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
            "infer" | "generate" | "generate_stream" => Category::Inference,
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
            "--http-restricted-api",
        )
        .unwrap();
        // HTTP: the key as given (looked up case-insensitively).
        assert_eq!(r.check(Category::Inference, |_| None), Err("X-Key"));
        assert_eq!(
            r.check(Category::Inference, |k| (k == "x-key").then_some("secret")),
            Ok(())
        );
        assert_eq!(
            r.check(Category::Inference, |_| Some("wrong")),
            Err("X-Key")
        );
        assert_eq!(r.check(Category::Statistics, |_| None), Ok(()));
        assert!(Restrictions::parse(&["health:ab".into()], "--x").is_err());
        assert!(Restrictions::parse(&["health=ab".into()], "--x")
            .unwrap_err()
            .message
            .starts_with("--x option format is '<config name>:<setting>=<value>'. Got health=ab"));
    }

    #[test]
    fn grpc_keys_get_tritons_prefix() {
        let r = Restrictions::parse(
            &["inference:infer-key=secret".into()],
            "--grpc-restricted-protocol",
        )
        .unwrap();
        assert_eq!(
            r.check(Category::Inference, |k| (k == "infer-key")
                .then_some("secret")),
            Err("triton-grpc-protocol-infer-key")
        );
        assert_eq!(
            r.check(Category::Inference, |k| {
                (k == "triton-grpc-protocol-infer-key").then_some("secret")
            }),
            Ok(())
        );
    }

    #[test]
    fn parse_errors_use_tritons_wording() {
        for (flag, feature) in [
            ("--http-restricted-api", "api"),
            ("--grpc-restricted-protocol", "protocol"),
        ] {
            let e = Restrictions::parse(&["model-reposit,health:k1=v1".into()], flag)
                .unwrap_err()
                .message;
            assert!(
                e.starts_with(&format!("unknown restricted {feature} 'model-reposit' ")),
                "{e}"
            );
            let e = Restrictions::parse(
                &[
                    "model-repository,health:k1=v1".into(),
                    "metadata,health:k2=v2".into(),
                ],
                flag,
            )
            .unwrap_err()
            .message;
            assert!(
                e.starts_with(&format!(
                    "restricted {feature} 'health' can not be specified in multiple config groups"
                )),
                "{e}"
            );
        }
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
