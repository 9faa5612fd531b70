//! Server wiring and lifecycle: load the repository, bind the frontends,
//! serve until asked to stop, then drain in-flight requests (bounded by
//! `--exit-timeout-secs`) and stop every model.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cache::ResponseCache;
use crate::cli::Args;
use crate::frontend::common::{HeaderForward, ServerInfo};
use crate::frontend::grpc;
use crate::frontend::http::{HttpService, HttpState};
use crate::frontend::listen::{bind_all, Acceptor, Bound, Listener};
use crate::frontend::restrict::Restrictions;
use crate::infer::Infer;
use crate::metrics::Metrics;
use crate::repository::control::ControlMode;
use crate::repository::{Repository, RepositoryOptions, State};
use tern_core::error::{Error, Result};

/// A started server.
pub struct RunningServer {
    /// Bound HTTP TCP address (`None` when HTTP is disabled or on a Unix socket).
    pub http_addr: Option<SocketAddr>,
    /// Bound gRPC TCP address (`None` when gRPC is disabled or on a Unix socket).
    pub grpc_addr: Option<SocketAddr>,
    /// Bound metrics TCP address (`None` when metrics are disabled or on a Unix socket).
    pub metrics_addr: Option<SocketAddr>,
    /// All models.
    pub repository: Arc<Repository>,
    info: Arc<ServerInfo>,
    stop: watch::Sender<bool>,
    stop_polling: Arc<AtomicBool>,
    poller: Option<std::thread::JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    exit_timeout: Duration,
    signal: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

/// Loads the repository and starts the frontends.
pub async fn start(args: &Args) -> Result<RunningServer> {
    let (mode, load_models) = args.model_control()?;
    tracing::info!("{}", crate::version::line());
    let pools = configure_memory(args);
    let metrics_settings = args.metrics_settings()?;
    crate::scheduler::rate_limit::install(args.rate_limiter());
    let cache = match args.cache_settings()? {
        Some(settings) => Some(ResponseCache::open(&settings).await?),
        None => None,
    };
    let tracer = crate::trace::Tracer::new(args.trace_config()?)?;
    let infer = Infer::with(
        repository_options(args, metrics_settings.summary_latencies)?,
        cache.clone(),
        tracer,
    );
    let repository = infer.repository().clone();
    let metrics = args.allow_metrics.then(|| {
        let mut m = Metrics::new(repository.clone(), metrics_settings, pools);
        if let Some(cache) = cache {
            m = m.with_families(cache);
        }
        Arc::new(m)
    });
    let initialized = load_startup_models(args, &repository, mode, &load_models).await?;
    let info = Arc::new(ServerInfo {
        infer,
        repository: repository.clone(),
        server_id: args.id.clone(),
        strict_readiness: args.strict_readiness,
        shutting_down: AtomicBool::new(false),
        control_mode: mode,
        shm: Arc::new(tern_memory::shm::SharedMemory::new(args.allow_client_shm)),
        initialized,
    });
    let (stop, stop_rx) = watch::channel(false);
    // SIGINT/SIGTERM stop the server gracefully from the moment clients can
    // reach it; while the models load, they end the process at once.
    let signal = Box::pin(shutdown_signal());
    let frontends = match bind_frontends(args, &info, metrics).await {
        Ok(f) => f,
        Err(e) => {
            stop_models(&repository).await;
            return Err(e);
        }
    };
    let served = frontends.serve(args, &stop_rx);
    let stop_polling = Arc::new(AtomicBool::new(false));
    let mut poller = None;
    if mode == ControlMode::Poll && initialized {
        if args.repository_poll_secs > 0 {
            let interval = Duration::from_secs(args.repository_poll_secs as u64);
            poller = Some(repository.spawn_poller(interval, stop_polling.clone())?);
            tracing::info!("polling the model repository every {interval:?}");
        } else {
            tracing::info!(
                "--repository-poll-secs={}: the model repository is not polled after startup",
                args.repository_poll_secs
            );
        }
    }
    if initialized {
        // Detached: it sleeps at most a second between sweeps and stops with the flag.
        drop(repository.spawn_idle_unloader(stop_polling.clone())?);
    }
    let o = &repository.options().on_demand;
    if o.enabled {
        tracing::info!(
            "models load on demand; idle unload: {}; memory budget: {}",
            o.idle_unload
                .map_or("off".into(), |d| format!("after {} s", d.as_secs())),
            o.budget.map_or("off".into(), |b| format!("{} bytes", b))
        );
    }
    Ok(RunningServer {
        http_addr: served.http_addr,
        grpc_addr: served.grpc_addr,
        metrics_addr: served.metrics_addr,
        repository,
        info,
        stop,
        stop_polling,
        poller,
        tasks: served.tasks,
        exit_timeout: Duration::from_secs(args.exit_timeout_secs),
        signal,
    })
}

/// Stops every model off the async workers: stopping an instance runs its
/// `finalize` (a plugin's may write its log, which blocks).
async fn stop_models(repository: &Arc<Repository>) {
    let repo = repository.clone();
    if tokio::task::spawn_blocking(move || repo.shutdown())
        .await
        .is_err()
    {
        tracing::error!("stopping the models panicked");
    }
}

/// Logs the GPUs and sizes the memory pools the `--*-memory-pool-byte-size` flags ask for.
fn configure_memory(args: &Args) -> &'static tern_memory::pool::Pools {
    tern_memory::cuda::log_devices();
    if let Some(bad) = args
        .cuda_memory_pool_byte_size
        .iter()
        .find(|(gpu, _)| *gpu >= tern_memory::cuda::devices().len())
    {
        tracing::warn!(
            "--cuda-memory-pool-byte-size names GPU {} which is not present; ignored",
            bad.0
        );
    }
    tern_memory::pool::configure(
        args.pinned_memory_pool_byte_size,
        args.host_memory_pool_byte_size,
        &args.cuda_memory_pool_byte_size,
    )
}

/// The repository's settings from the command line.
fn repository_options(args: &Args, summary_latencies: bool) -> Result<RepositoryOptions> {
    let trust_keys = args.trust_keys()?;
    // A remote repository is served from its local cache folder.
    let mut roots = Vec::new();
    let mut remotes = Vec::new();
    for root in &args.model_repository {
        if crate::repository::remote::is_remote(root) {
            let url = root.to_string_lossy().to_string();
            let cache = match &args.model_cache_dir {
                Some(dir) => dir.clone(),
                None => crate::repository::remote::default_cache_dir(&url)?,
            };
            let remote = crate::repository::remote::Remote::open(
                &url,
                &cache,
                trust_keys.clone(),
                tokio::runtime::Handle::current(),
            )?;
            tracing::info!(
                "model repository '{url}': cached in '{}'",
                remote.root().display()
            );
            roots.push(remote.root());
            remotes.push(Arc::new(remote));
        } else {
            roots.push(root.clone());
        }
    }
    Ok(RepositoryOptions {
        roots,
        auto_complete: args.auto_complete(),
        backend: args.backend_settings()?,
        gpu_count: tern_memory::cuda::devices().len(),
        load_threads: args.model_load_thread_count,
        load_timeout: (args.model_load_timeout_secs > 0)
            .then(|| Duration::from_secs(args.model_load_timeout_secs)),
        config_name: args.model_config_name.clone(),
        summary_latencies: args.allow_metrics && summary_latencies,
        load_retries: args.model_load_retry_count,
        on_demand: args.on_demand()?,
        trust_keys,
        remotes,
    })
}

/// Loads the models startup loads (all of them, or the `--load-model` ones)
/// and logs each version's state. As tritonserver: a repository folder that
/// cannot be opened fails startup; with `--exit-on-error=false` the server
/// comes up anyway, answering metadata but neither live nor ready, and
/// loads nothing (returns `false`, not initialized). A failed load fails
/// startup under `--exit-on-error`.
async fn load_startup_models(
    args: &Args,
    repository: &Arc<Repository>,
    mode: ControlMode,
    load_models: &[String],
) -> Result<bool> {
    // Remote repositories' caches first: what the store has now, or (when
    // it cannot be reached) the snapshots the cache verified before.
    if !repository.options().remotes.is_empty() {
        let repo = repository.clone();
        // Explicit mode fetches only the models it loads (`*`: all of them).
        let only: Option<Vec<String>> = (mode == ControlMode::Explicit
            && !load_models.iter().any(|m| m == "*"))
        .then(|| load_models.to_vec());
        let _ = tokio::task::spawn_blocking(move || match only {
            None => {
                let _ = repo.sync_remotes(None);
            }
            Some(names) => {
                for name in &names {
                    let _ = repo.sync_for_load(name);
                }
                // The index names what the stores have, fetched or not.
                for remote in &repo.options().remotes {
                    if let Err(e) = remote.list_models() {
                        tracing::warn!("{e}");
                    }
                }
            }
        })
        .await;
    }
    let initialized = match check_roots(&repository.options().roots) {
        Ok(()) => true,
        Err(e) if args.exit_on_error => {
            stop_models(repository).await;
            return Err(e.context("error: creating server"));
        }
        Err(e) => {
            tracing::error!("{}: {}", e.code.as_str(), e.message);
            false
        }
    };
    let errors = if initialized {
        let (repo, names) = (repository.clone(), load_models.to_vec());
        tokio::task::spawn_blocking(move || repo.load_startup(mode, &names))
            .await
            .map_err(|e| Error::internal(format!("model loading panicked: {e}")))??
    } else {
        Vec::new()
    };
    log_model_states(repository);
    if !errors.is_empty() && args.exit_on_error {
        stop_models(repository).await;
        return Err(Error::new(
            errors[0].code,
            format!(
                "{} model load error(s), exiting (--exit-on-error=true): {}",
                errors.len(),
                errors[0].message
            ),
        ));
    }
    Ok(initialized)
}

/// One line per model version: ready at info level, anything else with its reason as a warning.
fn log_model_states(repository: &Repository) {
    for row in repository.index() {
        let version = row
            .version
            .map(|v| v.to_string())
            .unwrap_or_else(|| "-".into());
        if row.state == State::Ready {
            tracing::info!(
                "model {:<24} version {:<4} {}",
                row.name,
                version,
                row.state.as_str()
            );
        } else {
            tracing::warn!(
                "model {:<24} version {:<4} {}: {}",
                row.name,
                version,
                row.state.as_str(),
                row.reason
            );
        }
    }
}

/// The frontends, built and bound, not yet serving.
struct Frontends {
    http: Option<(Arc<HttpState>, Listeners)>,
    grpc: Option<(grpc::GrpcServer, Listeners)>,
    metrics: Option<(Arc<Metrics>, Listeners)>,
}

/// A frontend's bound listeners (one per address of its address flag).
type Listeners = Vec<(Listener, Bound)>;

/// What the serving frontends listen on, and their tasks.
struct Served {
    http_addr: Option<SocketAddr>,
    grpc_addr: Option<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
    tasks: Vec<JoinHandle<()>>,
}

/// Builds the frontends (bad flags or TLS material fail here, before
/// anything listens) and binds them in tritonserver's order (gRPC, HTTP,
/// metrics), so a busy port is reported as it would be, and before any is
/// served, so none is left open.
async fn bind_frontends(
    args: &Args,
    info: &Arc<ServerInfo>,
    metrics: Option<Arc<Metrics>>,
) -> Result<Frontends> {
    let grpc_settings = args.grpc_settings()?;
    let unix = args.unix_socket_settings()?;
    let restrictions = Restrictions::parse(&args.http_restricted_api, "--http-restricted-api")?;
    let grpc_router = if args.allow_grpc {
        Some(grpc::build(info.clone(), &grpc_settings)?)
    } else {
        None
    };
    let grpc = match grpc_router {
        Some(router) => Some((
            router,
            bind_all("GRPC", &args.grpc_address, args.grpc_port, &unix).await?,
        )),
        None => None,
    };
    let http = match args.allow_http {
        true => {
            let state = Arc::new(HttpState {
                info: info.clone(),
                max_input_size: args.http_max_input_size,
                read_timeout: http_read_timeout(args),
                restrictions,
                header_forward: args
                    .http_header_forward_pattern
                    .as_deref()
                    .map(|p| HeaderForward::parse("--http-header-forward-pattern", p))
                    .transpose()?,
            });
            Some((
                state,
                bind_all("HTTP", &args.http_address, args.http_port, &unix).await?,
            ))
        }
        false => None,
    };
    let metrics = match metrics {
        Some(m) => Some((
            m,
            bind_all("Metrics", &args.metrics_address, args.metrics_port, &unix).await?,
        )),
        None => None,
    };
    Ok(Frontends {
        http,
        grpc,
        metrics,
    })
}

fn http_read_timeout(args: &Args) -> Option<Duration> {
    (args.http_read_timeout_secs > 0).then(|| Duration::from_secs(args.http_read_timeout_secs))
}

impl Frontends {
    /// Serves every bound frontend until `stop` turns true.
    fn serve(self, args: &Args, stop: &watch::Receiver<bool>) -> Served {
        let stopped = |mut rx: watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|v| *v).await;
        };
        let mut served = Served {
            http_addr: None,
            grpc_addr: None,
            metrics_addr: None,
            tasks: Vec::new(),
        };
        if let Some((state, listeners)) = self.http {
            let app = HttpService::new(state);
            for (listener, addr) in listeners {
                served.http_addr = served.http_addr.or(addr.tcp());
                served.tasks.push(serve_http(
                    "HTTP",
                    listener,
                    app.clone(),
                    http_read_timeout(args),
                    stopped(stop.clone()),
                ));
                tracing::info!("started HTTP service at {addr}");
            }
        }
        if let Some((router, listeners)) = self.grpc {
            let (listeners, addrs): (Vec<Listener>, Vec<Bound>) = listeners.into_iter().unzip();
            served.grpc_addr = addrs.iter().find_map(Bound::tcp);
            let shutdown = stopped(stop.clone());
            served.tasks.push(tokio::spawn(async move {
                if let Err(e) = grpc::serve(router, listeners, shutdown).await {
                    tracing::error!("gRPC server error: {e}");
                }
            }));
            for addr in addrs {
                tracing::info!("started GRPCInferenceService at {addr}");
            }
        }
        if let Some((metrics, listeners)) = self.metrics {
            let app = TowerToHyperService::new(crate::frontend::metrics::router(metrics));
            for (listener, addr) in listeners {
                served.metrics_addr = served.metrics_addr.or(addr.tcp());
                served.tasks.push(serve_http(
                    "metrics",
                    listener,
                    app.clone(),
                    // Longer than Prometheus' default 1 min scrape interval, so its kept-alive
                    // connection is not closed just as the next scrape starts.
                    Some(Duration::from_secs(300)),
                    stopped(stop.clone()),
                ));
                tracing::info!("started Metrics Service at {addr}");
            }
        }
        served
    }
}

/// Checks that every repository root is a folder, with tritonserver's errors.
fn check_roots(roots: &[std::path::PathBuf]) -> Result<()> {
    for root in roots {
        match std::fs::metadata(root) {
            Err(_) => {
                return Err(Error::internal(format!(
                    "failed to stat file {}",
                    root.display()
                )))
            }
            Ok(m) if !m.is_dir() => {
                return Err(Error::invalid_arg(format!(
                    "repository path is not a valid directory: {}",
                    root.display()
                )))
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

/// Serves a hyper service (the HTTP frontend's, or an axum router) over
/// HTTP/1.1 on a bound listener until `shutdown` resolves, then lets open
/// connections finish their requests.
///
/// This is `axum::serve` plus hyper's header-read timeout
/// (`header_timeout`): a client that opens a connection and never finishes
/// its headers is disconnected instead of holding a socket forever.
fn serve_http<S>(
    what: &'static str,
    listener: Listener,
    app: S,
    header_timeout: Option<Duration>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> JoinHandle<()>
where
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    use hyper_util::rt::{TokioIo, TokioTimer};

    tokio::spawn(async move {
        let mut shutdown = std::pin::pin!(shutdown);
        let (closing, closing_rx) = watch::channel(false);
        let mut connections = tokio::task::JoinSet::new();
        let mut acceptor = Acceptor::new(what);
        loop {
            let stream = tokio::select! {
                stream = acceptor.accept(&listener) => stream,
                () = &mut shutdown => break,
                // Reap finished connections as we go.
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            };
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new());
            builder.header_read_timeout(header_timeout);
            let service = app.clone();
            let mut closing = closing_rx.clone();
            connections.spawn(async move {
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                let mut conn = std::pin::pin!(conn);
                let finished = tokio::select! {
                    r = conn.as_mut() => Some(r),
                    _ = closing.wait_for(|c| *c) => None,
                };
                let result = match finished {
                    Some(r) => r,
                    None => {
                        // Finish the request in flight, then close.
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                };
                if let Err(e) = result {
                    tracing::debug!("{what} connection ended: {e}");
                }
            });
        }
        // New connections are refused from here on; open ones finish.
        drop(listener);
        let _ = closing.send(true);
        while connections.join_next().await.is_some() {}
    })
}

impl RunningServer {
    /// Resolves when SIGINT or SIGTERM arrives (handlers are installed
    /// before the listeners are bound, so no signal is lost).
    pub async fn stop_requested(&mut self) {
        (&mut self.signal).await;
    }

    /// Stops accepting connections, waits for in-flight requests up to the
    /// exit timeout, then stops every model.
    pub async fn shutdown(mut self) {
        self.info.shutting_down.store(true, Ordering::Relaxed);
        self.stop_polling.store(true, Ordering::Relaxed);
        // A download in progress stops at its next chunk (its partial files
        // stay for the next start to resume).
        self.repository.cancel_syncs();
        let _ = self.stop.send(true);
        let tasks = std::mem::take(&mut self.tasks);
        if tokio::time::timeout(self.exit_timeout, futures_join(tasks))
            .await
            .is_err()
        {
            tracing::warn!(
                "in-flight requests did not finish within {:?}; exiting anyway",
                self.exit_timeout
            );
        }
        // The poller finishes a poll in progress and stops before the models
        // do; the repository then refuses any further load.
        let poller = self.poller.take();
        let repo = self.repository.clone();
        let _ = tokio::time::timeout(
            self.exit_timeout,
            tokio::task::spawn_blocking(move || {
                if poller.is_some_and(|p| p.join().is_err()) {
                    tracing::error!("the repository poll thread panicked");
                }
                repo.shutdown()
            }),
        )
        .await;
        // The traces of the requests drained above are written (or exported) last.
        let tracer = self.info.infer.tracer().clone();
        let _ = tokio::task::spawn_blocking(move || tracer.shutdown()).await;
    }
}

/// Waits for every task.
async fn futures_join(tasks: Vec<JoinHandle<()>>) {
    for t in tasks {
        let _ = t.await;
    }
}

/// Installs the SIGINT and SIGTERM handlers now and returns a future that
/// resolves when one arrives.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).ok();
        let mut int = signal(SignalKind::interrupt()).ok();
        async move {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! { _ = wait(term.take()) => {}, _ = wait(int.take()) => {} }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
