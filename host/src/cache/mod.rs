//! The response cache (Triton's `--cache-config` with per-model
//! `response_cache { enable: true }`): the settings from the command line,
//! the key a request is cached under, and the store behind it. The
//! infer facade (`infer.rs`) looks a request up before it reaches the model's
//! scheduler and inserts what the model answered; a cache that fails only
//! makes a miss, never a failed request.
//!
//! Where Tern differs from Triton on purpose (docs/configuration.md): the key
//! also covers each input's datatype and shape and the requested outputs
//! (Triton hashes names and bytes only, so a reshaped request or one asking
//! for other outputs is answered from the wrong entry), and only successful
//! responses are inserted (Triton also caches error responses).

mod entry;
mod local;
mod redis;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tern_core::error::{Error, Result};
use tern_core::prometheus::Families;
use tern_core::request::InferRequest;
use tern_core::Tensor;

/// A request's cache key: BLAKE3 over the model, version, inputs and requested outputs.
pub type Key = [u8; 32];

/// What a store's operations return.
type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// Where entries are kept.
trait Store: Send + Sync {
    /// The entry under `key`, if there is one.
    fn lookup<'a>(&'a self, key: &'a Key) -> StoreFuture<'a, Option<Bytes>>;
    /// Keeps `entry` under `key`.
    fn insert<'a>(&'a self, key: &'a Key, entry: Vec<u8>) -> StoreFuture<'a, ()>;
    /// The store's own gauges, if it has any.
    fn render(&self, _out: &mut String, _totals: &Totals) {}
}

/// The cache a server runs with, from `--cache-config`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheSettings {
    /// `local,size=<bytes>`.
    Local {
        /// Byte budget.
        size: usize,
    },
    /// `redis,host=...,port=...` and the other keys of Triton's redis cache.
    Redis(redis::RedisSettings),
}

impl CacheSettings {
    /// Reads `--cache-config` (repeatable `<cache>,<key>=<value>`) and the
    /// deprecated `--response-cache-byte-size`; `None` when no cache was asked for.
    pub fn from_flags(
        cache_config: &[String],
        byte_size: Option<&str>,
    ) -> Result<Option<CacheSettings>> {
        if let Some(size) = byte_size {
            if !cache_config.is_empty() {
                return Err(Error::invalid_arg(
                    "Incompatible flags --response-cache-byte-size and --cache-config both provided. \
                     Please provide one or the other.",
                ));
            }
            tracing::warn!(
                "'--response-cache-byte-size' has been deprecated! This will default to the 'local' \
                 cache implementation with the provided byte size for its config. Please use \
                 '--cache-config' instead. The equivalent --cache-config CLI args would be: \
                 '--cache-config=local,size={size}'"
            );
            return local(&[("size".into(), size.into())]).map(Some);
        }
        let mut name: Option<&str> = None;
        let mut pairs = Vec::new();
        for arg in cache_config {
            let (cache, setting) = match arg.split_once(',') {
                Some((c, s)) if !c.is_empty() => (c, s),
                _ => {
                    return Err(Error::invalid_arg(format!(
                        "No cache specified. --cache-config option format is <cache name>,<setting>=<value>. Got {arg}"
                    )))
                }
            };
            let (key, value) = setting
                .split_once('=')
                .filter(|(k, v)| !k.is_empty() && !v.is_empty())
                .ok_or_else(|| {
                    Error::invalid_arg(format!(
                        "--cache-config option format is '<cache name>,<setting>=<value>'. Got {arg}"
                    ))
                })?;
            if name.is_some_and(|n| n != cache) {
                return Err(Error::invalid_arg(
                    "found multiple cache configurations, but only a single cache is currently supported",
                ));
            }
            name = Some(cache);
            pairs.push((key.to_string(), value.to_string()));
        }
        match name {
            None => Ok(None),
            Some("local") => local(&pairs).map(Some),
            Some("redis") => redis::RedisSettings::from_pairs(&pairs)
                .map(CacheSettings::Redis)
                .map(Some),
            Some(other) => Err(Error::invalid_arg(format!(
                "unknown cache '{other}' in --cache-config: Tern's caches are 'local' and 'redis'"
            ))),
        }
    }
}

/// The `local` cache's settings: `size` (bytes) is required.
fn local(pairs: &[(String, String)]) -> Result<CacheSettings> {
    let fail = |why: String| Error::invalid_arg(format!("Failed to initialize LocalCache: {why}"));
    let mut size = None;
    for (k, v) in pairs {
        match k.as_str() {
            "size" => {
                let n: usize = v
                    .parse()
                    .map_err(|_| fail(format!("'size' must be a number of bytes, got '{v}'")))?;
                if n == 0 {
                    return Err(fail("'size' must be greater than 0".into()));
                }
                size = Some(n);
            }
            other => tracing::warn!(
                "--cache-config local,{other}=...: the local cache has no such setting; ignored"
            ),
        }
    }
    let size = size.ok_or_else(|| fail("config didn't contain a valid 'size' field.".into()))?;
    Ok(CacheSettings::Local { size })
}

/// Server-wide counts, for the store's gauges.
#[derive(Default)]
pub struct Totals {
    hits: AtomicU64,
    misses: AtomicU64,
    lookup_ns: AtomicU64,
    insert_ns: AtomicU64,
    /// Lookups and inserts the store failed (unreachable redis, ...).
    failures: [AtomicU64; 2],
}

impl Totals {
    fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }
    fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }
    fn lookup_us(&self) -> u64 {
        self.lookup_ns.load(Ordering::Relaxed) / 1000
    }
    fn insert_us(&self) -> u64 {
        self.insert_ns.load(Ordering::Relaxed) / 1000
    }
}

/// The server's response cache.
pub struct ResponseCache {
    store: Box<dyn Store>,
    totals: Totals,
}

impl ResponseCache {
    /// Opens the cache `settings` describe (for redis: connects and pings it).
    pub async fn open(settings: &CacheSettings) -> Result<Arc<ResponseCache>> {
        let store: Box<dyn Store> = match settings {
            CacheSettings::Local { size } => {
                tracing::info!("response cache: local, {size} bytes");
                Box::new(local::Local::new(*size))
            }
            CacheSettings::Redis(r) => Box::new(redis::Redis::connect(r).await?),
        };
        Ok(Arc::new(ResponseCache {
            store,
            totals: Totals::default(),
        }))
    }

    /// The outputs cached under `key`, and how long looking took. A store
    /// that fails or an entry that does not decode is a miss.
    pub async fn lookup(&self, key: &Key) -> (Option<Vec<Tensor>>, Duration) {
        let start = Instant::now();
        let found = match self.store.lookup(key).await {
            Ok(Some(bytes)) => match entry::decode(bytes) {
                Ok(outputs) => Some(outputs),
                Err(e) => {
                    tracing::warn!("response cache entry [{}]: {}", hex(key), e.message);
                    None
                }
            },
            Ok(None) => None,
            Err(e) => {
                self.totals.failures[0].fetch_add(1, Ordering::Relaxed);
                tracing::debug!("response cache lookup [{}]: {}", hex(key), e.message);
                None
            }
        };
        let took = start.elapsed();
        let counter = if found.is_some() {
            &self.totals.hits
        } else {
            &self.totals.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.totals
            .lookup_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        (found, took)
    }

    /// Keeps `outputs` under `key`; a failure is logged and otherwise
    /// ignored (the response goes to the client all the same). Returns how
    /// long it took.
    pub async fn insert(&self, key: &Key, outputs: &[Tensor]) -> Duration {
        let start = Instant::now();
        if let Err(e) = self.store.insert(key, entry::encode(outputs)).await {
            self.totals.failures[1].fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                "Failed to insert key [{}] into response cache: {}",
                hex(key),
                e.message
            );
        }
        let took = start.elapsed();
        self.totals
            .insert_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        took
    }
}

impl Families for ResponseCache {
    fn render(&self, out: &mut String) {
        self.store.render(out, &self.totals);
        let name = "tern_response_cache_failures_total";
        tern_core::prometheus::header(
            out,
            name,
            "counter",
            "Response cache lookups and inserts that failed (each answered as a miss)",
        );
        for (i, op) in ["lookup", "insert"].iter().enumerate() {
            let l = tern_core::prometheus::labels(&[("operation", op)]);
            let n = self.totals.failures[i].load(Ordering::Relaxed);
            tern_core::prometheus::sample(out, name, &l, n as f64);
        }
    }
}

/// The key `request` is cached under on `model` version `version`: the
/// model, the version, every input (sorted by name) with its datatype,
/// shape and bytes, and the requested output names with their
/// classification counts. Request id, parameters, priority and timeout are
/// not part of it (as in Triton).
pub fn key(model: &str, version: i64, request: &InferRequest) -> Key {
    let mut h = blake3::Hasher::new();
    let field = |h: &mut blake3::Hasher, b: &[u8]| {
        h.update(&(b.len() as u64).to_le_bytes());
        h.update(b);
    };
    field(&mut h, model.as_bytes());
    h.update(&version.to_le_bytes());
    let mut inputs: Vec<&Tensor> = request.inputs.iter().collect();
    inputs.sort_by(|a, b| a.name.cmp(&b.name));
    h.update(&(inputs.len() as u64).to_le_bytes());
    for t in inputs {
        field(&mut h, t.name.as_bytes());
        field(&mut h, t.dtype.wire_name().as_bytes());
        h.update(&(t.shape.len() as u64).to_le_bytes());
        for d in &t.shape {
            h.update(&d.to_le_bytes());
        }
        field(&mut h, &t.data);
    }
    let mut outputs: Vec<(&str, u64)> = request
        .outputs
        .iter()
        .map(|o| {
            (
                o.name.as_str(),
                o.classification.map_or(0, |n| n as u64 + 1),
            )
        })
        .collect();
    outputs.sort();
    h.update(&(outputs.len() as u64).to_le_bytes());
    for (name, class) in outputs {
        field(&mut h, name.as_bytes());
        h.update(&class.to_le_bytes());
    }
    *h.finalize().as_bytes()
}

/// A key as logs and redis name it.
fn hex(key: &Key) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::request::RequestedOutput;
    use tern_core::DataType;

    fn flags(args: &[&str]) -> Result<Option<CacheSettings>> {
        let v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        CacheSettings::from_flags(&v, None)
    }

    #[test]
    fn cache_config_reads_as_triton_reads_it() {
        assert_eq!(flags(&[]).unwrap(), None);
        assert_eq!(
            flags(&["local,size=1048576"]).unwrap(),
            Some(CacheSettings::Local { size: 1048576 })
        );
        let no_cache = "No cache specified. --cache-config option format is <cache name>,<setting>=<value>. Got local";
        assert_eq!(flags(&["local"]).unwrap_err().message, no_cache);
        assert!(flags(&[",size=5"])
            .unwrap_err()
            .message
            .starts_with("No cache specified."));
        assert_eq!(
            flags(&["local,size="]).unwrap_err().message,
            "--cache-config option format is '<cache name>,<setting>=<value>'. Got local,size="
        );
        assert_eq!(
            flags(&["local,foo=1"]).unwrap_err().message,
            "Failed to initialize LocalCache: config didn't contain a valid 'size' field."
        );
        assert!(flags(&["local,size=abc"])
            .unwrap_err()
            .message
            .contains("'abc'"));
        assert!(flags(&["local,size=-5"]).is_err());
        assert!(flags(&["local,size=0"]).is_err());
        assert_eq!(
            flags(&["local,size=10", "redis,host=x"])
                .unwrap_err()
                .message,
            "found multiple cache configurations, but only a single cache is currently supported"
        );
        assert!(flags(&["foo,size=1"])
            .unwrap_err()
            .message
            .contains("'foo'"));
    }

    #[test]
    fn the_deprecated_byte_size_flag_is_a_local_cache() {
        assert_eq!(
            CacheSettings::from_flags(&[], Some("4096")).unwrap(),
            Some(CacheSettings::Local { size: 4096 })
        );
        assert!(CacheSettings::from_flags(&[], Some("0")).is_err());
        let both = CacheSettings::from_flags(&["local,size=1".into()], Some("5")).unwrap_err();
        assert!(both.message.starts_with("Incompatible flags"));
    }

    fn request(shape: Vec<i64>, outputs: &[&str]) -> InferRequest {
        InferRequest {
            model_name: "m".into(),
            id: "a".into(),
            inputs: vec![
                Tensor::new("B", DataType::Int32, shape.clone(), vec![1u8; 16]),
                Tensor::new("A", DataType::Int32, shape, vec![2u8; 16]),
            ],
            outputs: outputs
                .iter()
                .map(|n| RequestedOutput {
                    name: n.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_key_covers_what_changes_the_answer_and_nothing_else() {
        let base = key("m", 1, &request(vec![1, 4], &[]));
        let mut other_id = request(vec![1, 4], &[]);
        other_id.id = "b".into();
        other_id.inputs.reverse();
        other_id
            .parameters
            .insert("p".into(), tern_core::request::Parameter::Bool(true));
        assert_eq!(key("m", 1, &other_id), base, "id, input order, parameters");
        assert_ne!(key("m", 2, &request(vec![1, 4], &[])), base, "version");
        assert_ne!(key("n", 1, &request(vec![1, 4], &[])), base, "model");
        assert_ne!(key("m", 1, &request(vec![4, 1], &[])), base, "shape");
        assert_ne!(key("m", 1, &request(vec![1, 4], &["Y"])), base, "outputs");
        let mut bytes = request(vec![1, 4], &[]);
        bytes.inputs[0] = Tensor::new("B", DataType::Int32, vec![1, 4], vec![3u8; 16]);
        assert_ne!(key("m", 1, &bytes), base, "data");
        let mut dtype = request(vec![1, 4], &[]);
        dtype.inputs[0].dtype = DataType::Uint32;
        assert_ne!(key("m", 1, &dtype), base, "datatype");
        assert_eq!(
            key("m", 1, &request(vec![1, 4], &["X", "Y"])),
            key("m", 1, &request(vec![1, 4], &["Y", "X"])),
            "output order"
        );
    }

    fn block<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_lookup_after_an_insert_hits_and_counts() {
        let cache = block(ResponseCache::open(&CacheSettings::Local { size: 1 << 20 })).unwrap();
        let k = key("m", 1, &request(vec![1, 4], &[]));
        assert!(block(cache.lookup(&k)).0.is_none());
        let out = vec![Tensor::new(
            "Y",
            DataType::Fp32,
            vec![1],
            vec![0, 0, 128, 63],
        )];
        block(cache.insert(&k, &out));
        let (hit, _) = block(cache.lookup(&k));
        assert_eq!(hit.unwrap()[0].data, out[0].data);
        assert_eq!((cache.totals.hits(), cache.totals.misses()), (1, 1));
        let mut page = String::new();
        cache.render(&mut page);
        assert!(page.contains("nv_cache_num_hits 1\n"), "{page}");
        assert!(
            page.contains("tern_response_cache_failures_total{operation=\"insert\"} 0\n"),
            "{page}"
        );
    }

    /// A redis that is not there fails the startup, clearly.
    #[test]
    fn an_unreachable_redis_fails_to_open() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let settings = CacheSettings::from_flags(
            &[
                "redis,host=127.0.0.1".to_string(),
                format!("redis,port={port}"),
                "redis,connect_timeout=200".into(),
            ],
            None,
        )
        .unwrap()
        .unwrap();
        let e = block(ResponseCache::open(&settings)).err().unwrap();
        assert!(
            e.message
                .starts_with("Failed to initialize RedisCache: 127.0.0.1:"),
            "{e}"
        );
    }
}
