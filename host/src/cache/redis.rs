//! The `redis` cache's settings, as Triton's redis cache reads them.

use tern_core::error::{Error, Result};

use super::{Key, Store};

/// `--cache-config redis,<key>=<value>` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// `host`.
    pub host: String,
    /// `port`.
    pub port: u16,
}

impl RedisSettings {
    /// Reads the settings; `host` and `port` are required.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<RedisSettings> {
        let get = |k: &str| pairs.iter().rev().find(|(key, _)| key == k).map(|(_, v)| v);
        let (Some(host), Some(port)) = (get("host"), get("port")) else {
            return Err(Error::invalid_arg(
                "Failed to initialize RedisCache, didn't specify address. Must at a minimum specify \
                 'host' and 'port' in the configuration - e.g. tritonserver --cache-config redis,host=redis \
                 --cache-config redis,port=6379 --model-repository=/models ...",
            ));
        };
        let port = port.parse().map_err(|_| {
            Error::invalid_arg(format!(
                "Failed to initialize RedisCache: 'port' must be a port number, got '{port}'"
            ))
        })?;
        Ok(RedisSettings {
            host: host.clone(),
            port,
        })
    }
}

/// A redis server holding the entries.
pub struct Redis;

impl Redis {
    /// Connects to the server the settings name.
    pub fn connect(_settings: &RedisSettings) -> Result<Redis> {
        Err(Error::unsupported(
            "the 'redis' response cache is not supported by this version of Tern (use --cache-config=local,size=<bytes>)",
        ))
    }
}

impl Store for Redis {
    fn lookup(&self, _key: &Key) -> Result<Option<bytes::Bytes>> {
        Ok(None)
    }
    fn insert(&self, _key: &Key, _entry: Vec<u8>) -> Result<()> {
        Ok(())
    }
}
