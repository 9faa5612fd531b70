//! Remote model repositories (`s3://`, `gs://`, `as://`, as Triton spells
//! them), served from a local cache. The repository never reads the object
//! store directly: each model is downloaded into the cache folder, checked
//! (every file whole, its size as listed; the signed manifest where
//! `--model-trust-key` is given), and only then swapped in — the cache's
//! `models/<name>` is a link to a complete snapshot, replaced by one
//! rename. The repository serves `models/` like any local folder, so a
//! device that starts without network serves the snapshots it last
//! verified, and a download interrupted at any point (power loss included)
//! leaves the previous snapshot in place; the next sync resumes it, file by
//! file.
//!
//! Cache layout (`<cache dir>/<repository id>/`): `models/<name>` → link to
//! `snapshots/<name>.<generation>` (a generation is a digest of the
//! listing: paths, sizes, ETags); `partial/<name>.<generation>/` holds a
//! download in progress, `partial/*.download` the file being written;
//! `last-sync` the time of the last complete sync.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectMeta, ObjectStore, RetryConfig};
use tern_core::error::{Error, Result};

use super::manifest;

/// Whether a `--model-repository` value names a remote repository.
pub fn is_remote(root: &Path) -> bool {
    root.to_str()
        .is_some_and(|s| ["s3://", "gs://", "as://"].iter().any(|p| s.starts_with(p)))
}

/// Where a remote repository is: the store and the path inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Location {
    S3 {
        /// `http(s)://host:port` of an S3-compatible server; `None`: AWS.
        endpoint: Option<String>,
        bucket: String,
        prefix: String,
    },
    Gcs {
        bucket: String,
        prefix: String,
    },
    Azure {
        account: String,
        container: String,
        prefix: String,
    },
}

/// Parses Triton's spellings: `s3://[http(s)://host:port/]bucket/path`
/// (`s3://host:port/bucket/path` = plain HTTP, as Triton), `gs://bucket/path`,
/// `as://account/container/path`.
fn parse(url: &str) -> Result<Location> {
    let bad = |why: &str| Error::invalid_arg(format!("model repository '{url}': {why}"));
    let split = |rest: &str| -> (String, String) {
        let rest = rest.trim_matches('/');
        match rest.split_once('/') {
            Some((first, more)) => (first.to_string(), more.trim_matches('/').to_string()),
            None => (rest.to_string(), String::new()),
        }
    };
    if let Some(rest) = url.strip_prefix("s3://") {
        let (scheme, rest) = if let Some(r) = rest.strip_prefix("https://") {
            ("https", r)
        } else if let Some(r) = rest.strip_prefix("http://") {
            ("http", r)
        } else {
            ("http", rest)
        };
        let (first, more) = split(rest);
        let (endpoint, bucket, prefix) = if first.contains(':') {
            let (bucket, prefix) = split(&more);
            (Some(format!("{scheme}://{first}")), bucket, prefix)
        } else {
            (None, first, more)
        };
        if bucket.is_empty() {
            return Err(bad("no bucket (s3://[host:port/]bucket/path)"));
        }
        return Ok(Location::S3 {
            endpoint,
            bucket,
            prefix,
        });
    }
    if let Some(rest) = url.strip_prefix("gs://") {
        let (bucket, prefix) = split(rest);
        if bucket.is_empty() {
            return Err(bad("no bucket (gs://bucket/path)"));
        }
        return Ok(Location::Gcs { bucket, prefix });
    }
    if let Some(rest) = url.strip_prefix("as://") {
        let (account, rest) = split(rest);
        let (container, prefix) = split(&rest);
        if account.is_empty() || container.is_empty() {
            return Err(bad("no account or container (as://account/container/path)"));
        }
        return Ok(Location::Azure {
            account,
            container,
            prefix,
        });
    }
    Err(bad("not an s3://, gs:// or as:// address"))
}

/// The credentials `TRITON_CLOUD_CREDENTIAL_PATH` gives `url` (the entry
/// with the longest matching key; `""` matches every address), as Triton
/// reads that file: `{"s3": {"<prefix>": {"key_id", "secret_key",
/// "region", "session_token"}}, "gs": {"<prefix>": "<credentials file>"},
/// "as": {"<prefix>": {"account_str", "account_key"}}}`.
fn credential_entry(url: &str, scheme: &str) -> Result<Option<serde_json::Value>> {
    let Some(path) = std::env::var_os("TRITON_CLOUD_CREDENTIAL_PATH") else {
        return Ok(None);
    };
    let what = format!(
        "TRITON_CLOUD_CREDENTIAL_PATH '{}'",
        Path::new(&path).display()
    );
    let text =
        std::fs::read_to_string(&path).map_err(|e| Error::invalid_arg(format!("{what}: {e}")))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::invalid_arg(format!("{what}: {e}")))?;
    let Some(entries) = json.get(scheme).and_then(|v| v.as_object()) else {
        return Ok(None);
    };
    Ok(entries
        .iter()
        .filter(|(prefix, _)| url.starts_with(prefix.as_str()))
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, v)| v.clone()))
}

fn field(entry: &Option<serde_json::Value>, key: &str) -> Option<String> {
    entry
        .as_ref()
        .and_then(|e| e.get(key))
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// Bounded retries: a device without network serves its cache after
/// seconds, not after the client's default minutes of retrying.
fn client_options() -> (ClientOptions, RetryConfig) {
    let options = ClientOptions::new()
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(300));
    let retry = RetryConfig {
        max_retries: 3,
        retry_timeout: Duration::from_secs(20),
        ..Default::default()
    };
    (options, retry)
}

/// The object store and path prefix of `url`.
fn open_store(url: &str) -> Result<(Arc<dyn ObjectStore>, String)> {
    let failed =
        |e: object_store::Error| Error::invalid_arg(format!("model repository '{url}': {e}"));
    let (options, retry) = client_options();
    Ok(match parse(url)? {
        Location::S3 {
            endpoint,
            bucket,
            prefix,
        } => {
            let creds = credential_entry(url, "s3")?;
            let mut b = object_store::aws::AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry);
            if let Some(region) = field(&creds, "region")
                .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
                .or_else(|| std::env::var("AWS_REGION").ok())
            {
                b = b.with_region(region);
            }
            if let (Some(id), Some(secret)) = (field(&creds, "key_id"), field(&creds, "secret_key"))
            {
                b = b.with_access_key_id(id).with_secret_access_key(secret);
                if let Some(token) = field(&creds, "session_token") {
                    b = b.with_token(token);
                }
            }
            let options = match endpoint {
                Some(endpoint) => {
                    b = b.with_endpoint(endpoint.clone());
                    options.with_allow_http(endpoint.starts_with("http://"))
                }
                None => options,
            };
            (
                Arc::new(b.with_client_options(options).build().map_err(failed)?),
                prefix,
            )
        }
        Location::Gcs { bucket, prefix } => {
            let creds = credential_entry(url, "gs")?;
            let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry);
            let file = creds
                .as_ref()
                .and_then(|v| v.as_str())
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .or_else(|| std::env::var("GOOGLE_APPLICATION_CREDENTIALS").ok());
            if let Some(file) = file {
                // A service account key (what GOOGLE_APPLICATION_CREDENTIALS
                // names on servers) is read as one, with its private-endpoint
                // fields (`gcs_base_url`, `disable_oauth`); a user's
                // credentials as application default credentials.
                let service_account = std::fs::read(&file)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                    .is_some_and(|v| {
                        v.get("type").and_then(|t| t.as_str()) == Some("service_account")
                    });
                b = if service_account {
                    b.with_service_account_path(file)
                } else {
                    b.with_application_credentials(file)
                };
            }
            (
                Arc::new(
                    b.with_client_options(options.with_allow_http(true))
                        .build()
                        .map_err(failed)?,
                ),
                prefix,
            )
        }
        Location::Azure {
            account,
            container,
            prefix,
        } => {
            let creds = credential_entry(url, "as")?;
            let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_account(field(&creds, "account_str").unwrap_or(account))
                .with_container_name(container)
                .with_retry(retry);
            if let Some(key) =
                field(&creds, "account_key").or_else(|| std::env::var("AZURE_STORAGE_KEY").ok())
            {
                b = b.with_access_key(key);
            }
            let emulator = std::env::var("AZURE_STORAGE_USE_EMULATOR")
                .is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
            (
                Arc::new(
                    b.with_client_options(options.with_allow_http(emulator))
                        .build()
                        .map_err(failed)?,
                ),
                prefix,
            )
        }
    })
}

/// The cache folder when `--model-cache-dir` is not given: Triton's
/// `TRITON_{AWS,GCS,AZURE}_MOUNT_DIRECTORY` for the address's scheme, else
/// the service's state folder (`$STATE_DIRECTORY/model-cache`, systemd's),
/// else `$XDG_STATE_HOME/tern/model-cache` or `~/.local/state/tern/model-cache`.
pub fn default_cache_dir(url: &str) -> Result<PathBuf> {
    let mount = match url.get(..5) {
        Some("s3://") => "TRITON_AWS_MOUNT_DIRECTORY",
        Some("gs://") => "TRITON_GCS_MOUNT_DIRECTORY",
        _ => "TRITON_AZURE_MOUNT_DIRECTORY",
    };
    let var = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(dir) = var(mount) {
        return Ok(dir);
    }
    if let Some(dir) = var("STATE_DIRECTORY") {
        // systemd may list several, separated by ':'.
        let first = dir
            .to_string_lossy()
            .split(':')
            .next()
            .unwrap_or("")
            .to_string();
        return Ok(PathBuf::from(first).join("model-cache"));
    }
    if let Some(dir) = var("XDG_STATE_HOME") {
        return Ok(dir.join("tern").join("model-cache"));
    }
    if let Some(home) = var("HOME") {
        return Ok(home.join(".local/state/tern/model-cache"));
    }
    Err(Error::invalid_arg(format!(
        "model repository '{url}': no folder for its local cache: give --model-cache-dir"
    )))
}

/// What a remote repository's syncs have done, for the metrics and the index.
#[derive(Debug, Default)]
struct Stats {
    bytes: u64,
    failures: u64,
    last_success: Option<SystemTime>,
    /// Model → (bytes fetched, bytes to fetch) of a download in progress.
    downloading: BTreeMap<String, (u64, u64)>,
    /// Model → why its last update failed (cleared by a successful one).
    failed: BTreeMap<String, String>,
    /// The models the store had at its last listing (for the index).
    listed: Vec<String>,
}

/// One remote repository and its local cache.
pub struct Remote {
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: String,
    dir: PathBuf,
    trust_keys: Vec<ed25519_dalek::VerifyingKey>,
    runtime: tokio::runtime::Handle,
    stats: Mutex<Stats>,
    /// One sync at a time (the poller and API loads may ask together).
    syncing: tokio::sync::Mutex<()>,
    /// Set at shutdown: syncs stop at the next chunk.
    cancelled: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Remote({} cached in {})", self.url, self.dir.display())
    }
}

impl Remote {
    /// Opens the remote repository `url`, cached under `cache_dir` (each
    /// repository in its own folder there). Downloads nothing yet.
    pub fn open(
        url: &str,
        cache_dir: &Path,
        trust_keys: Vec<ed25519_dalek::VerifyingKey>,
        runtime: tokio::runtime::Handle,
    ) -> Result<Remote> {
        let (store, prefix) = open_store(url)?;
        let id = blake3::hash(url.as_bytes()).to_hex();
        let dir = cache_dir.join(&id[..16]);
        for sub in ["models", "snapshots", "partial"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| {
                Error::invalid_arg(format!(
                    "model repository '{url}': cannot create its cache folder '{}': {e}",
                    dir.join(sub).display()
                ))
            })?;
        }
        // What the folder caches, for whoever looks into it.
        let _ = std::fs::write(dir.join("repository"), format!("{url}\n"));
        let last_success = std::fs::read_to_string(dir.join("last-sync"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s));
        Ok(Remote {
            url: url.to_string(),
            store,
            prefix,
            dir,
            trust_keys,
            runtime,
            stats: Mutex::new(Stats {
                last_success,
                ..Default::default()
            }),
            syncing: tokio::sync::Mutex::new(()),
            cancelled: Default::default(),
        })
    }

    /// Stops syncs: a download in progress stops at its next chunk, and no
    /// new one starts.
    pub fn cancel(&self) {
        self.cancelled
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn check_cancelled(&self) -> Result<()> {
        if self.cancelled.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Error::unavailable("the server is shutting down"));
        }
        Ok(())
    }

    /// The address as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The local folder the repository serves (links to verified snapshots).
    pub fn root(&self) -> PathBuf {
        self.dir.join("models")
    }

    fn stats(&self) -> std::sync::MutexGuard<'_, Stats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Brings the cache up to date with the store: every model (`None`) or
    /// one. Blocks; call it from a thread that may block. On failure the
    /// cache keeps what it had (and the error says why).
    pub fn sync(&self, only: Option<&str>, in_use: &HashSet<PathBuf>) -> Result<()> {
        self.runtime.block_on(self.sync_async(only, in_use))
    }

    async fn sync_async(&self, only: Option<&str>, in_use: &HashSet<PathBuf>) -> Result<()> {
        let _one = self.syncing.lock().await;
        self.check_cancelled()?;
        let result = self.sync_listed(only, in_use).await;
        let mut stats = self.stats();
        match &result {
            Ok(()) => {
                let now = SystemTime::now();
                if only.is_none() {
                    stats.last_success = Some(now);
                    if let Ok(d) = now.duration_since(SystemTime::UNIX_EPOCH) {
                        let _ = manifest::write_whole(
                            &self.dir.join("last-sync"),
                            format!("{}\n", d.as_secs()).as_bytes(),
                        );
                    }
                }
            }
            Err(_) => stats.failures += 1,
        }
        result
    }

    /// A failed listing of the store, said as the log and the index say it.
    fn list_failed(&self, e: object_store::Error) -> Error {
        Error::unavailable(format!(
            "model repository '{}': cannot list it: {e}",
            self.url
        ))
    }

    /// The object path of the repository (or of one model in it).
    fn object_prefix(&self, model: Option<&str>) -> Option<ObjectPath> {
        let mut parts: Vec<&str> = self.prefix.split('/').filter(|p| !p.is_empty()).collect();
        if let Some(m) = model {
            parts.push(m);
        }
        (!parts.is_empty()).then(|| ObjectPath::from_iter(parts))
    }

    async fn sync_listed(&self, only: Option<&str>, in_use: &HashSet<PathBuf>) -> Result<()> {
        let prefix = self.object_prefix(only);
        let listing: Vec<ObjectMeta> = self
            .store
            .list(prefix.as_ref())
            .try_collect()
            .await
            .map_err(|e| self.list_failed(e))?;
        let base = self.prefix.split('/').filter(|p| !p.is_empty()).count();
        let mut models: BTreeMap<String, Vec<(String, ObjectMeta)>> = BTreeMap::new();
        for meta in listing {
            let parts: Vec<String> = meta
                .location
                .parts()
                .map(|p| p.as_ref().to_string())
                .collect();
            if parts.len() < base + 2 {
                continue; // a file beside the model folders
            }
            let model = parts[base].clone();
            if only.is_some_and(|m| m != model) {
                continue;
            }
            let relative = parts[base + 1..].join("/");
            models.entry(model).or_default().push((relative, meta));
        }
        for files in models.values_mut() {
            drop_folder_markers(files);
        }
        if only.is_none() {
            self.stats().listed = models.keys().cloned().collect();
        }
        let mut first_error = None;
        for (name, files) in &models {
            if name.starts_with('.') {
                tracing::warn!(repository = %self.url, "'{name}' is not a model name: skipped");
                continue;
            }
            match self.sync_model(name, files, in_use).await {
                Ok(true) => {
                    tracing::info!(repository = %self.url, model = %name, "new snapshot of the model downloaded and verified")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(repository = %self.url, model = %name, "cannot update the model: {e}; its cached snapshot (if any) stays");
                    self.stats().failed.insert(name.clone(), e.message.clone());
                    first_error.get_or_insert(e);
                    continue;
                }
            }
            self.stats().failed.remove(name);
        }
        // Models gone from the store leave the cache (the poller unloads them).
        let wanted: Vec<String> = match only {
            Some(m) => vec![m.to_string()],
            None => std::fs::read_dir(self.root())
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| !n.starts_with('.'))
                .collect(),
        };
        for name in wanted.iter().filter(|n| !models.contains_key(*n)) {
            if std::fs::symlink_metadata(self.root().join(name)).is_ok() {
                tracing::info!(repository = %self.url, model = %name, "the model is gone from the repository: removed from the cache");
                let _ = std::fs::remove_file(self.root().join(name));
                self.stats().failed.remove(name);
                self.collect_snapshots(name, None, in_use);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Brings one model's snapshot up to date. `Ok(true)`: a new one was swapped in.
    async fn sync_model(
        &self,
        name: &str,
        files: &[(String, ObjectMeta)],
        in_use: &HashSet<PathBuf>,
    ) -> Result<bool> {
        for (relative, _) in files {
            if relative
                .split('/')
                .any(|p| p.is_empty() || p == "." || p == "..")
            {
                return Err(Error::invalid_arg(format!(
                    "object '{name}/{relative}' is not a usable file path"
                )));
            }
        }
        let generation = generation(files);
        let snapshot_name = format!("{name}.{generation}");
        let snapshot = self.dir.join("snapshots").join(&snapshot_name);
        let link = self.root().join(name);
        let target = Path::new("..").join("snapshots").join(&snapshot_name);
        if snapshot.is_dir() && std::fs::read_link(&link).is_ok_and(|t| t == target) {
            return Ok(false);
        }
        let rejected = self
            .dir
            .join("partial")
            .join(format!("{snapshot_name}.rejected"));
        if let Ok(why) = std::fs::read_to_string(&rejected) {
            // Refused once: not fetched again until the store's files change.
            return Err(Error::invalid_arg(why));
        }
        if !snapshot.is_dir() {
            // Only this generation's partial download is worth resuming.
            self.collect_partials(name, Some(&snapshot_name));
            let staging = self.dir.join("partial").join(&snapshot_name);
            let result = self
                .fetch_snapshot(name, files, &staging, &snapshot, &link)
                .await;
            if let Err(e) = result {
                // No room: what was downloaded goes, so the space is back
                // for the models serving (the next sync starts over).
                if out_of_room(&e) {
                    let _ = std::fs::remove_dir_all(&staging);
                    let _ = std::fs::remove_file(listing_path(&snapshot));
                    self.collect_partials(name, None);
                }
                return Err(e);
            }
        }
        // The swap: a new link renamed over the old one.
        let swap = self.root().join(format!(".{name}.swap"));
        let _ = std::fs::remove_file(&swap);
        std::os::unix::fs::symlink(&target, &swap).map_err(|e| io_error(&swap, e))?;
        let previous = std::fs::read_link(&link).ok();
        std::fs::rename(&swap, &link).map_err(|e| io_error(&link, e))?;
        sync_dir(&self.root())?;
        // The snapshot before keeps its files for a version still being read from it.
        let previous = previous
            .as_deref()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str());
        self.collect_snapshots(name, previous, in_use);
        Ok(true)
    }

    /// Downloads a model's files into `staging`, checks its signed manifest
    /// (with trust keys), syncs it and renames it into `snapshot`.
    async fn fetch_snapshot(
        &self,
        name: &str,
        files: &[(String, ObjectMeta)],
        staging: &Path,
        snapshot: &Path,
        link: &Path,
    ) -> Result<()> {
        let linked = std::fs::read_link(link)
            .ok()
            .and_then(|t| t.file_name().map(|n| self.dir.join("snapshots").join(n)));
        let result = self.download(name, files, staging, linked.as_deref()).await;
        self.stats().downloading.remove(name);
        result?;
        if !self.trust_keys.is_empty() {
            // Never swap in what the server would refuse to load: the
            // snapshot it has keeps serving.
            if let Err(e) = manifest::verify(staging, name, &self.trust_keys) {
                let _ = std::fs::remove_dir_all(staging);
                let mut rejected = staging.as_os_str().to_os_string();
                rejected.push(".rejected");
                let _ = manifest::write_whole(Path::new(&rejected), e.message.as_bytes());
                return Err(e);
            }
        }
        sync_tree(staging)?;
        // What each file was listed as, so the next snapshot can reuse it.
        let listed: BTreeMap<&str, (u64, String)> = files
            .iter()
            .map(|(rel, m)| (rel.as_str(), (m.size, tag(m))))
            .collect();
        let listed = serde_json::to_vec(&listed)
            .map_err(|e| Error::internal(format!("cannot record the listing: {e}")))?;
        manifest::write_whole(&listing_path(snapshot), &listed)?;
        std::fs::rename(staging, snapshot).map_err(|e| io_error(snapshot, e))?;
        sync_dir(&snapshot.with_file_name(""))
    }

    /// Downloads `files` into `staging`, resuming: a file there already
    /// whole (its listed size) is kept. Each file is written beside the
    /// folder, synced, checked for size and renamed into place.
    async fn download(
        &self,
        name: &str,
        files: &[(String, ObjectMeta)],
        staging: &Path,
        previous: Option<&Path>,
    ) -> Result<()> {
        std::fs::create_dir_all(staging).map_err(|e| io_error(staging, e))?;
        // Files the snapshot in use has as listed now are linked, not fetched.
        let before: BTreeMap<String, (u64, String)> = previous
            .and_then(|p| std::fs::read(listing_path(p)).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        for (relative, meta) in files {
            let (dest, source) = (staging.join(relative), previous.map(|p| p.join(relative)));
            if before.get(relative) == Some(&(meta.size, tag(meta))) && !dest.exists() {
                if let (Some(source), Some(parent)) = (source, dest.parent()) {
                    let _ = std::fs::create_dir_all(parent);
                    if std::fs::metadata(&source).is_ok_and(|m| m.len() == meta.size) {
                        let _ = std::fs::hard_link(&source, &dest);
                    }
                }
            }
        }
        let total: u64 = files.iter().map(|(_, m)| m.size).sum();
        let mut fetched: u64 = files
            .iter()
            .filter(|(rel, m)| {
                std::fs::metadata(staging.join(rel)).is_ok_and(|f| f.len() == m.size)
            })
            .map(|(_, m)| m.size)
            .sum();
        self.stats()
            .downloading
            .insert(name.to_string(), (fetched, total));
        // `partial/<name>.<generation>.download`: collected with the model's partials.
        let mut part = staging.as_os_str().to_os_string();
        part.push(".download");
        let part = PathBuf::from(part);
        for (relative, meta) in files {
            let dest = staging.join(relative);
            if std::fs::metadata(&dest).is_ok_and(|f| f.len() == meta.size) {
                continue;
            }
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io_error(parent, e))?;
            }
            let mut out = std::fs::File::create(&part).map_err(|e| io_error(&part, e))?;
            let fetch_failed = |e: object_store::Error| {
                Error::unavailable(format!("cannot download '{name}/{relative}': {e}"))
            };
            let mut stream = self
                .store
                .get(&meta.location)
                .await
                .map_err(fetch_failed)?
                .into_stream();
            let mut written = 0u64;
            while let Some(chunk) = stream.next().await {
                self.check_cancelled()?;
                let chunk = chunk.map_err(fetch_failed)?;
                out.write_all(&chunk).map_err(|e| io_error(&part, e))?;
                written += chunk.len() as u64;
                fetched += chunk.len() as u64;
                let mut stats = self.stats();
                stats.bytes += chunk.len() as u64;
                stats.downloading.insert(name.to_string(), (fetched, total));
            }
            out.sync_all().map_err(|e| io_error(&part, e))?;
            if written != meta.size {
                return Err(Error::unavailable(format!(
                    "'{name}/{relative}': downloaded {written} bytes of {}",
                    meta.size
                )));
            }
            std::fs::rename(&part, &dest).map_err(|e| io_error(&dest, e))?;
        }
        Ok(())
    }

    /// Removes a model's snapshots but the one linked and `keep`, and its
    /// abandoned partial downloads.
    fn collect_snapshots(&self, name: &str, keep: Option<&str>, in_use: &HashSet<PathBuf>) {
        let linked = std::fs::read_link(self.root().join(name))
            .ok()
            .and_then(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string));
        for entry in std::fs::read_dir(self.dir.join("snapshots"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = entry.file_name().to_string_lossy().to_string();
            let stem = n.strip_suffix(".listing").unwrap_or(&n);
            let used = in_use.contains(&self.dir.join("snapshots").join(stem));
            if is_snapshot_of(stem, name)
                && !used
                && Some(stem) != linked.as_deref()
                && Some(stem) != keep
            {
                let _ = if entry.path().is_dir() {
                    std::fs::remove_dir_all(entry.path())
                } else {
                    std::fs::remove_file(entry.path())
                };
            }
        }
        self.collect_partials(name, None);
    }

    /// Removes a model's partial downloads (folders, the file being
    /// written, refusal markers) but those of the snapshot `keep`.
    fn collect_partials(&self, name: &str, keep: Option<&str>) {
        for entry in std::fs::read_dir(self.dir.join("partial"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let n = entry.file_name().to_string_lossy().to_string();
            let stem = n
                .strip_suffix(".download")
                .or_else(|| n.strip_suffix(".rejected"))
                .unwrap_or(&n);
            if is_snapshot_of(stem, name) && Some(stem) != keep {
                let _ = if entry.path().is_dir() {
                    std::fs::remove_dir_all(entry.path())
                } else {
                    std::fs::remove_file(entry.path())
                };
            }
        }
    }

    /// What the index says of `model` while it downloads or after its update failed.
    pub fn status(&self, model: &str) -> Option<String> {
        let stats = self.stats();
        if let Some((fetched, total)) = stats.downloading.get(model) {
            return Some(format!(
                "downloading from {}: {:.1} of {:.1} MB",
                self.url,
                *fetched as f64 / 1e6,
                *total as f64 / 1e6
            ));
        }
        stats
            .failed
            .get(model)
            .map(|why| format!("update from {} failed: {why}", self.url))
    }

    /// Lists the models the store has, without fetching any (explicit mode's
    /// startup, so the index can name them). Blocks.
    pub fn list_models(&self) -> Result<()> {
        self.runtime.block_on(async {
            let listed = self
                .store
                .list_with_delimiter(self.object_prefix(None).as_ref())
                .await
                .map_err(|e| self.list_failed(e))?;
            let names = listed
                .common_prefixes
                .iter()
                .filter_map(|p| p.filename().map(str::to_string))
                .filter(|n| !n.starts_with('.'))
                .collect();
            self.stats().listed = names;
            Ok(())
        })
    }

    /// The models the store had at its last listing.
    pub fn listed(&self) -> Vec<String> {
        self.stats().listed.clone()
    }

    /// Models downloading now (first downloads included).
    pub fn downloading(&self) -> Vec<String> {
        self.stats().downloading.keys().cloned().collect()
    }
}

/// Drops folder markers from a model's listing: a marker (`repo/m/1/`,
/// which consoles create) arrives as an empty object named like the folder.
fn drop_folder_markers(files: &mut Vec<(String, ObjectMeta)>) {
    let folders: HashSet<String> = files
        .iter()
        .filter_map(|(rel, _)| rel.rsplit_once('/').map(|(dir, _)| dir.to_string()))
        .flat_map(|dir| {
            let parts: Vec<&str> = dir.split('/').collect();
            (1..=parts.len())
                .map(|n| parts[..n].join("/"))
                .collect::<Vec<_>>()
        })
        .collect();
    files.retain(|(rel, meta)| !(meta.size == 0 && folders.contains(rel)));
}

/// What identifies an object's content in a listing: its ETag, else its modification time.
fn tag(meta: &ObjectMeta) -> String {
    meta.e_tag
        .clone()
        .unwrap_or_else(|| meta.last_modified.to_rfc3339())
}

/// The listing recorded beside a snapshot (`<snapshot>.listing`).
fn listing_path(snapshot: &Path) -> PathBuf {
    let mut name = snapshot.as_os_str().to_os_string();
    name.push(".listing");
    PathBuf::from(name)
}

/// A digest of a model's listing: a new one whenever a file is added,
/// removed, or changes size or ETag.
fn generation(files: &[(String, ObjectMeta)]) -> String {
    let mut sorted: Vec<_> = files.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut h = blake3::Hasher::new();
    for (relative, meta) in sorted {
        h.update(relative.as_bytes());
        h.update(&[0]);
        h.update(&meta.size.to_le_bytes());
        h.update(tag(meta).as_bytes());
        h.update(&[0]);
    }
    h.finalize().to_hex()[..16].to_string()
}

/// Whether `stem` names a snapshot of `model` (`<model>.<generation>`).
fn is_snapshot_of(stem: &str, model: &str) -> bool {
    stem.strip_prefix(model)
        .and_then(|r| r.strip_prefix('.'))
        .is_some_and(|g| g.len() == 16 && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// How a cache write that ran out of room ends its message.
const DISK_FULL: &str = "the disk is full";
const TOO_LARGE: &str = "the file is larger than this system lets the server write";

/// Whether an update failed for lack of room (what it wrote is removed).
fn out_of_room(e: &Error) -> bool {
    e.message.ends_with(DISK_FULL) || e.message.ends_with(TOO_LARGE)
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    let what = match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => DISK_FULL,
        // A file size limit (RLIMIT_FSIZE, the file system's largest file).
        Some(libc::EFBIG) => TOO_LARGE,
        _ => "",
    };
    Error::unavailable(format!(
        "model cache '{}': {e}{}{what}",
        path.display(),
        if what.is_empty() { "" } else { ": " }
    ))
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| io_error(dir, e))
}

/// Syncs a downloaded tree's folders (the files were synced as written).
fn sync_tree(dir: &Path) -> Result<()> {
    sync_dir(dir)?;
    for entry in std::fs::read_dir(dir)
        .map_err(|e| io_error(dir, e))?
        .flatten()
    {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            sync_tree(&entry.path())?;
        }
    }
    Ok(())
}

/// The remote repositories' metric families.
pub struct RemoteFamilies(pub Vec<Arc<Remote>>);

impl tern_core::prometheus::Families for RemoteFamilies {
    fn render(&self, out: &mut String) {
        use tern_core::prometheus::{header, labels, sample};
        if self.0.is_empty() {
            return;
        }
        let rows: Vec<(String, u64, u64, Option<f64>)> = self
            .0
            .iter()
            .map(|r| {
                let s = r.stats();
                let age = s
                    .last_success
                    .map(|t| t.elapsed().map_or(0.0, |d| d.as_secs_f64()));
                (labels(&[("repository", r.url())]), s.bytes, s.failures, age)
            })
            .collect();
        header(
            out,
            "tern_model_sync_bytes_total",
            "counter",
            "Bytes of model files downloaded from a remote model repository",
        );
        for (l, bytes, _, _) in &rows {
            sample(out, "tern_model_sync_bytes_total", l, *bytes as f64);
        }
        header(out, "tern_model_sync_failures_total", "counter", "Syncs of a remote model repository that failed (listing, download, verification or the local disk)");
        for (l, _, failures, _) in &rows {
            sample(out, "tern_model_sync_failures_total", l, *failures as f64);
        }
        header(out, "tern_model_sync_age_seconds", "gauge", "Seconds since the last complete sync of a remote model repository (kept across restarts; absent before the first)");
        for (l, _, _, age) in &rows {
            if let Some(age) = age {
                sample(out, "tern_model_sync_age_seconds", l, *age);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn triton_s_addresses_parse() {
        let s3 = |endpoint: Option<&str>, bucket: &str, prefix: &str| Location::S3 {
            endpoint: endpoint.map(str::to_string),
            bucket: bucket.into(),
            prefix: prefix.into(),
        };
        assert_eq!(
            parse("s3://bucket/path/to/repo").unwrap(),
            s3(None, "bucket", "path/to/repo")
        );
        assert_eq!(parse("s3://bucket").unwrap(), s3(None, "bucket", ""));
        assert_eq!(
            parse("s3://localhost:9000/models/repo/").unwrap(),
            s3(Some("http://localhost:9000"), "models", "repo")
        );
        assert_eq!(
            parse("s3://https://minio.local:443/b/p").unwrap(),
            s3(Some("https://minio.local:443"), "b", "p")
        );
        assert_eq!(
            parse("gs://b/p/q").unwrap(),
            Location::Gcs {
                bucket: "b".into(),
                prefix: "p/q".into()
            }
        );
        assert_eq!(
            parse("as://acct/cont/p").unwrap(),
            Location::Azure {
                account: "acct".into(),
                container: "cont".into(),
                prefix: "p".into()
            }
        );
        assert!(parse("s3://").unwrap_err().message.contains("no bucket"));
        assert!(parse("as://acct")
            .unwrap_err()
            .message
            .contains("no account or container"));
        assert!(is_remote(Path::new("gs://b")) && !is_remote(Path::new("/models")));
    }

    #[test]
    fn a_generation_follows_paths_sizes_and_etags() {
        let meta = |size: u64, tag: &str| ObjectMeta {
            location: ObjectPath::from("m/1/model.onnx"),
            last_modified: Default::default(),
            size,
            e_tag: Some(tag.into()),
            version: None,
        };
        let a = generation(&[("1/model.onnx".into(), meta(3, "x"))]);
        assert_eq!(a.len(), 16);
        assert_eq!(a, generation(&[("1/model.onnx".into(), meta(3, "x"))]));
        assert_ne!(a, generation(&[("1/model.onnx".into(), meta(4, "x"))]));
        assert_ne!(a, generation(&[("1/model.onnx".into(), meta(3, "y"))]));
        assert_ne!(a, generation(&[("2/model.onnx".into(), meta(3, "x"))]));
    }

    #[test]
    fn a_snapshot_belongs_to_its_model_only() {
        assert!(is_snapshot_of("m.0123456789abcdef", "m"));
        assert!(!is_snapshot_of("m.b.0123456789abcdef", "m"));
        assert!(is_snapshot_of("m.b.0123456789abcdef", "m.b"));
        assert!(!is_snapshot_of("m.0123456789abcdeg", "m"));
        assert!(!is_snapshot_of("mm.0123456789abcdef", "m"));
    }

    #[test]
    fn folder_markers_are_not_files() {
        // A listing as object_store gives it (a marker's trailing '/' removed).
        let meta = |path: &str, size: u64| ObjectMeta {
            location: ObjectPath::from(path),
            last_modified: Default::default(),
            size,
            e_tag: None,
            version: None,
        };
        let mut files = vec![
            ("1".to_string(), meta("m/1", 0)),
            ("1/model.onnx".to_string(), meta("m/1/model.onnx", 3)),
            ("a/b".to_string(), meta("m/a/b", 0)),
            ("a".to_string(), meta("m/a", 0)),
            ("a/b/c.txt".to_string(), meta("m/a/b/c.txt", 1)),
            ("empty.txt".to_string(), meta("m/empty.txt", 0)),
        ];
        drop_folder_markers(&mut files);
        let kept: Vec<&str> = files.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(kept, ["1/model.onnx", "a/b/c.txt", "empty.txt"]);
    }

    #[test]
    fn the_default_cache_follows_triton_s_mount_variables_then_the_state_folder() {
        // One test: the environment is the process's.
        std::env::set_var("TRITON_GCS_MOUNT_DIRECTORY", "/mnt/gcs");
        assert_eq!(
            default_cache_dir("gs://b/p").unwrap(),
            PathBuf::from("/mnt/gcs")
        );
        std::env::remove_var("TRITON_GCS_MOUNT_DIRECTORY");
        std::env::set_var("STATE_DIRECTORY", "/var/lib/tern:/other");
        assert_eq!(
            default_cache_dir("gs://b/p").unwrap(),
            PathBuf::from("/var/lib/tern/model-cache")
        );
        std::env::remove_var("STATE_DIRECTORY");
    }
}
