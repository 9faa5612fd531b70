//! Server wiring and lifecycle: load the repository, bind the frontends,
//! serve until asked to stop, then drain in-flight requests (bounded by
//! `--exit-timeout-secs`) and stop every model.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cli::Args;
use crate::error::{Error, Result};
use crate::frontend::http::{router, HttpState};
use crate::repository::{Repository, RepositoryOptions, State};

/// A started server.
pub struct RunningServer {
    /// Bound HTTP address (`None` when HTTP is disabled).
    pub http_addr: Option<SocketAddr>,
    /// All models.
    pub repository: Arc<Repository>,
    http_state: Option<Arc<HttpState>>,
    stop: watch::Sender<bool>,
    http_task: Option<JoinHandle<()>>,
    exit_timeout: Duration,
}

/// Loads the repository and starts the frontends.
pub async fn start(args: &Args) -> Result<RunningServer> {
    let options = RepositoryOptions {
        roots: args.model_repository.clone(),
        auto_complete: args.auto_complete(),
        backend: args.backend_settings()?,
        gpu_count: 0,
        load_threads: args.model_load_thread_count,
    };
    let repository = Arc::new(Repository::new(options));
    let repo = repository.clone();
    let errors = tokio::task::spawn_blocking(move || repo.load_all())
        .await
        .map_err(|e| Error::internal(format!("model loading panicked: {e}")))??;
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
    if !errors.is_empty() && args.exit_on_error {
        repository.shutdown();
        return Err(Error::new(
            errors[0].code,
            format!(
                "{} model load error(s), exiting (--exit-on-error=true): {}",
                errors.len(),
                errors[0].message
            ),
        ));
    }
    let (stop, stop_rx) = watch::channel(false);
    let mut http_addr = None;
    let mut http_task = None;
    let mut http_state = None;
    if args.allow_http {
        let addr = format!("{}:{}", args.http_address, args.http_port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| Error::unavailable(format!("cannot bind HTTP on {addr}: {e}")))?;
        http_addr = Some(
            listener
                .local_addr()
                .map_err(|e| Error::internal(e.to_string()))?,
        );
        let state = Arc::new(HttpState {
            repository: repository.clone(),
            server_id: args.id.clone(),
            max_input_size: args.http_max_input_size,
            strict_readiness: args.strict_readiness,
            shutting_down: AtomicBool::new(false),
        });
        http_state = Some(state.clone());
        let app = router(state);
        let mut rx = stop_rx.clone();
        http_task = Some(tokio::spawn(async move {
            let shutdown = async move {
                let _ = rx.wait_for(|v| *v).await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                tracing::error!("HTTP server error: {e}");
            }
        }));
        tracing::info!("started HTTP service at {}", http_addr.expect("bound"));
    }
    Ok(RunningServer {
        http_addr,
        repository,
        http_state,
        stop,
        http_task,
        exit_timeout: Duration::from_secs(args.exit_timeout_secs),
    })
}

impl RunningServer {
    /// Stops accepting connections, waits for in-flight requests up to the
    /// exit timeout, then stops every model.
    pub async fn shutdown(mut self) {
        if let Some(s) = &self.http_state {
            s.shutting_down.store(true, Ordering::Relaxed);
        }
        let _ = self.stop.send(true);
        if let Some(task) = self.http_task.take() {
            if tokio::time::timeout(self.exit_timeout, task).await.is_err() {
                tracing::warn!(
                    "in-flight requests did not finish within {:?}; exiting anyway",
                    self.exit_timeout
                );
            }
        }
        let repo = self.repository.clone();
        let _ = tokio::time::timeout(
            self.exit_timeout,
            tokio::task::spawn_blocking(move || repo.shutdown()),
        )
        .await;
    }
}

/// Resolves when SIGINT or SIGTERM arrives.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}
