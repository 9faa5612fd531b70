//! The `redis` cache: entries in a redis server (shared by every server that
//! points at it), read with Triton's redis cache settings. One multiplexed
//! connection that reconnects by itself; while the server is unreachable
//! every lookup is a miss and every insert a logged failure.

use std::time::Duration;

use bytes::Bytes;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};
use tern_core::error::{Error, Result};

use super::{hex, Key, Store, StoreFuture};

/// How long a connection attempt or a command may take when the settings
/// do not say (Triton's `wait_timeout` default).
const DEFAULT_TIMEOUT: Duration = Duration::from_millis(1000);

/// `--cache-config redis,<key>=<value>` settings (Triton's redis cache keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisSettings {
    /// `host`.
    pub host: String,
    /// `port`.
    pub port: u16,
    /// `user` (or `TRITONCACHE_REDIS_USERNAME`).
    pub user: Option<String>,
    /// `password` (or `TRITONCACHE_REDIS_PASSWORD`).
    pub password: Option<String>,
    /// `db`.
    pub db: i64,
    /// `connect_timeout` in milliseconds.
    pub connect_timeout: Duration,
    /// `socket_timeout` in milliseconds: how long one command may take.
    pub socket_timeout: Duration,
}

impl RedisSettings {
    /// Reads the settings; `host` and `port` are required. `pool_size` and
    /// `wait_timeout` are accepted (one multiplexed connection needs no
    /// pool); TLS is refused.
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<RedisSettings> {
        let get = |k: &str| {
            pairs
                .iter()
                .rev()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        let fail =
            |why: String| Error::invalid_arg(format!("Failed to initialize RedisCache: {why}"));
        let (Some(host), Some(port)) = (get("host"), get("port")) else {
            return Err(Error::invalid_arg(
                "Failed to initialize RedisCache, didn't specify address. Must at a minimum specify \
                 'host' and 'port' in the configuration - e.g. tritonserver --cache-config redis,host=redis \
                 --cache-config redis,port=6379 --model-repository=/models ...",
            ));
        };
        let port = port
            .parse()
            .map_err(|_| fail(format!("'port' must be a port number, got '{port}'")))?;
        let number = |k: &str| -> Result<Option<u64>> {
            get(k)
                .map(|v| {
                    v.parse().map_err(|_| {
                        fail(format!("'{k}' must be a non-negative integer, got '{v}'"))
                    })
                })
                .transpose()
        };
        let millis = |k: &str| -> Result<Duration> {
            Ok(number(k)?
                .filter(|&ms| ms > 0)
                .map_or(DEFAULT_TIMEOUT, Duration::from_millis))
        };
        if get("tls_enabled").as_deref() == Some("true") {
            return Err(Error::unsupported(
                "Failed to initialize RedisCache: TLS to redis (tls_enabled) is not supported by this version of Tern",
            ));
        }
        for (k, _) in pairs {
            let known = [
                "host",
                "port",
                "user",
                "password",
                "db",
                "connect_timeout",
                "socket_timeout",
                "pool_size",
                "wait_timeout",
                "tls_enabled",
                "cert",
                "key",
                "cacert",
                "cacert_dir",
                "sni",
            ];
            if !known.contains(&k.as_str()) {
                tracing::warn!(
                    "--cache-config redis,{k}=...: the redis cache has no such setting; ignored"
                );
            }
        }
        number("pool_size")?;
        number("wait_timeout")?;
        Ok(RedisSettings {
            host,
            port,
            user: get("user").or_else(|| std::env::var("TRITONCACHE_REDIS_USERNAME").ok()),
            password: get("password").or_else(|| std::env::var("TRITONCACHE_REDIS_PASSWORD").ok()),
            db: number("db")?.unwrap_or(0) as i64,
            connect_timeout: millis("connect_timeout")?,
            socket_timeout: millis("socket_timeout")?,
        })
    }
}

/// A redis server holding the entries, each a string value under `tern:<key in hex>`.
pub struct Redis {
    connection: ConnectionManager,
}

impl Redis {
    /// Connects to the server and pings it: a server that cannot be reached
    /// at startup fails the startup, as in Triton.
    pub async fn connect(s: &RedisSettings) -> Result<Redis> {
        let fail = |e: redis::RedisError| {
            Error::internal(format!(
                "Failed to initialize RedisCache: {}:{}: {e}",
                s.host, s.port
            ))
        };
        let mut info = RedisConnectionInfo::default().set_db(s.db);
        if let Some(user) = &s.user {
            info = info.set_username(user);
        }
        if let Some(password) = &s.password {
            info = info.set_password(password);
        }
        let info = ConnectionAddr::Tcp(s.host.clone(), s.port)
            .into_connection_info()
            .map_err(fail)?
            .set_redis_settings(info);
        let client = redis::Client::open(info).map_err(fail)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(s.connect_timeout))
            .set_response_timeout(Some(s.socket_timeout))
            .set_number_of_retries(2);
        let mut connection = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(fail)?;
        let pong: String = redis::cmd("PING")
            .query_async(&mut connection)
            .await
            .map_err(fail)?;
        tracing::info!(
            "response cache: redis at {}:{} db {} ({pong})",
            s.host,
            s.port,
            s.db
        );
        Ok(Redis { connection })
    }
}

fn name(key: &Key) -> String {
    format!("tern:{}", hex(key))
}

impl Store for Redis {
    fn lookup<'a>(&'a self, key: &'a Key) -> StoreFuture<'a, Option<Bytes>> {
        let mut c = self.connection.clone();
        Box::pin(async move {
            let found: Option<Vec<u8>> = redis::cmd("GET")
                .arg(name(key))
                .query_async(&mut c)
                .await
                .map_err(|e| {
                    Error::internal(format!("Failed to retrieve key: {}. {e}", hex(key)))
                })?;
            Ok(found.map(Bytes::from))
        })
    }

    fn insert<'a>(&'a self, key: &'a Key, entry: Vec<u8>) -> StoreFuture<'a, ()> {
        let mut c = self.connection.clone();
        Box::pin(async move {
            redis::cmd("SET")
                .arg(name(key))
                .arg(entry)
                .query_async::<()>(&mut c)
                .await
                .map_err(|e| Error::internal(format!("Failed to insert key: {}. {e}", hex(key))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(s: &[(&str, &str)]) -> Vec<(String, String)> {
        s.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn settings_read_as_tritons_redis_cache_reads_them() {
        let s = RedisSettings::from_pairs(&pairs(&[
            ("host", "cache.local"),
            ("port", "6380"),
            ("user", "u"),
            ("password", "p"),
            ("db", "3"),
            ("socket_timeout", "250"),
            ("pool_size", "4"),
        ]))
        .unwrap();
        assert_eq!((s.host.as_str(), s.port, s.db), ("cache.local", 6380, 3));
        assert_eq!(
            (s.user.as_deref(), s.password.as_deref()),
            (Some("u"), Some("p"))
        );
        assert_eq!(s.socket_timeout, Duration::from_millis(250));
        assert_eq!(s.connect_timeout, DEFAULT_TIMEOUT);
        let e = RedisSettings::from_pairs(&pairs(&[("host", "h")])).unwrap_err();
        assert!(e
            .message
            .starts_with("Failed to initialize RedisCache, didn't specify address."));
        assert!(RedisSettings::from_pairs(&pairs(&[("host", "h"), ("port", "x")])).is_err());
        assert!(
            RedisSettings::from_pairs(&pairs(&[("host", "h"), ("port", "1"), ("db", "-1")]))
                .is_err()
        );
        let tls = RedisSettings::from_pairs(&pairs(&[
            ("host", "h"),
            ("port", "1"),
            ("tls_enabled", "true"),
        ]));
        assert_eq!(tls.unwrap_err().code, tern_core::error::Code::Unsupported);
    }
}
