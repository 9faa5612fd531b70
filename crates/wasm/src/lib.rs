//! The WebAssembly runtime behind the `wasm` backend: one shared wasmtime
//! [`Engine`] (component model, epoch interruption, pooling allocator when
//! the address space allows it), the epoch ticker that enforces execution
//! deadlines, the `.cwasm` cache ([`cache`]) and the host side of the
//! `tern:plugin` world ([`host`]).

pub mod backend;
pub mod cache;
pub mod host;
pub mod metrics;
mod telemetry;

pub use telemetry::{PluginCounters, PluginTelemetry};

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use tern_core::error::{Error, Result};

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "tern:plugin/plugin",
});

/// How often the epoch advances; execution deadlines are rounded up to it.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// The shared engine and how it was configured.
pub struct Runtime {
    /// The engine every plugin is compiled for.
    pub engine: Engine,
    /// Whether the pooling instance allocator is in use (else on-demand).
    pub pooling: bool,
}

fn base_config() -> Config {
    let mut c = Config::new();
    c.wasm_component_model(true);
    c.epoch_interruption(true);
    if std::env::var_os("TERN_WASM_PERFMAP").is_some() {
        // Plugin authors profiling with `perf`: names for the compiled plugin
        // code in /tmp/perf-<pid>.map (docs/plugins.md).
        c.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    c
}

impl Runtime {
    /// Builds the engine: the pooling allocator if its address-space
    /// reservation succeeds, otherwise on-demand allocation with small
    /// reservations (kernels with a 39-bit address space, as on some Jetson
    /// boards, cannot reserve the pool). `pooling = false` skips the probe.
    pub fn new(pooling: bool) -> Result<Runtime> {
        if pooling {
            let mut pool = PoolingAllocationConfig::default();
            pool.total_component_instances(512)
                .total_core_instances(1024)
                .total_memories(1024)
                .total_tables(1024)
                .max_memory_size(4 << 30);
            let mut c = base_config();
            c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
            match Engine::new(&c) {
                Ok(engine) => {
                    return Ok(Runtime {
                        engine,
                        pooling: true,
                    })
                }
                Err(e) => tracing::info!(
                    "wasm: pooling allocator unavailable ({e:#}); using on-demand allocation"
                ),
            }
        }
        let mut c = base_config();
        c.allocation_strategy(InstanceAllocationStrategy::OnDemand);
        c.memory_reservation(64 << 20);
        c.memory_guard_size(64 << 10);
        let engine = Engine::new(&c)
            .map_err(|e| Error::internal(format!("cannot create the wasm engine: {e:#}")))?;
        Ok(Runtime {
            engine,
            pooling: false,
        })
    }
}

/// The process-wide runtime, created on first use with its epoch ticker.
pub fn runtime() -> Result<Arc<Runtime>> {
    static RUNTIME: OnceLock<std::result::Result<Arc<Runtime>, Error>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let rt = Arc::new(Runtime::new(
                std::env::var_os("TERN_WASM_NO_POOLING").is_none(),
            )?);
            tracing::info!(pooling = rt.pooling, "wasm runtime ready");
            let engine = rt.engine.clone();
            std::thread::Builder::new()
                .name("wasm-epoch".into())
                .spawn(move || loop {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                })
                .map_err(|e| Error::internal(format!("cannot start the wasm epoch thread: {e}")))?;
            Ok(rt)
        })
        .clone()
}

/// Epoch ticks covering `d` (at least one).
pub fn ticks(d: Duration) -> u64 {
    (d.as_micros() / EPOCH_TICK.as_micros()).max(1) as u64 + 1
}
