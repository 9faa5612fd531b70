//! The WebAssembly runtime behind the `wasm` backend: one shared wasmtime
//! [`Engine`] (component model, epoch interruption, pooling allocator when
//! the address space allows it), the epoch ticker that enforces execution
//! deadlines while plugins run ([`Ticking`]), the `.cwasm` cache ([`cache`]), the host side of the
//! `tern:plugin` world ([`host`], with the native kernels in [`ops`]) and
//! plugins' stdout/stderr ([`stdio`]).

pub mod backend;
mod blocking;
pub mod cache;
pub mod guest_fixes;
pub mod host;
pub mod metrics;
pub mod ops;
pub mod precompile;
pub mod python;
pub mod stdio;
mod telemetry;

pub use telemetry::{PluginCounters, PluginTelemetry};

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use tern_core::error::{Error, Result};

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "tern:plugin/plugin",
    with: {
        "tern:plugin/responses.response-sender": host::SenderHandle,
        "tern:plugin/responses.response-stream": host::StreamHandle,
        "tern:plugin/ops.array": ops::ArrayHandle,
    },
});

/// How often the epoch advances while a plugin runs; execution deadlines are
/// rounded up to it.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Calls into plugins in flight (see [`Ticking`]).
static CALLS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// The epoch ticker thread, unparked when the first call starts.
static TICKER: OnceLock<std::thread::Thread> = OnceLock::new();

/// Held for the length of a call into a plugin (instantiation, `initialize`,
/// `execute`, `finalize`): the epoch ticker runs only while one is held, so
/// the call's deadline can fire, and sleeps otherwise (an idle server has no
/// timer wake-ups from it). The epoch stands still meanwhile, which only
/// matters to deadlines, and every deadline is set when its call starts.
#[must_use = "the epoch ticks only while the guard is held"]
pub struct Ticking(());

impl Ticking {
    /// Starts ticking if no other call is in flight.
    pub fn start() -> Ticking {
        if CALLS_IN_FLIGHT.fetch_add(1, Ordering::SeqCst) == 0 {
            if let Some(ticker) = TICKER.get() {
                ticker.unpark();
            }
        }
        Ticking(())
    }
}

impl Drop for Ticking {
    fn drop(&mut self) {
        CALLS_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The epoch ticker's loop: a tick every [`EPOCH_TICK`] while calls are in
/// flight, parked when there are none. An unpark that comes between the
/// check and `park` is kept by the thread's token, so no call is missed.
fn tick(engine: Engine) -> ! {
    loop {
        if CALLS_IN_FLIGHT.load(Ordering::SeqCst) == 0 {
            std::thread::park();
            continue;
        }
        std::thread::sleep(EPOCH_TICK);
        engine.increment_epoch();
    }
}

/// The shared engine and how it was configured.
pub struct Runtime {
    /// The engine every plugin is compiled for.
    pub engine: Engine,
    /// Whether the pooling instance allocator's memory layout is in use
    /// (else on-demand allocation with small reservations).
    pub pooling: bool,
    /// The architecture the engine generates code for (`x86_64`, `aarch64`).
    pub arch: String,
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

/// On-demand allocation with small reservations: what a machine whose
/// address space cannot hold the pool runs with.
fn on_demand(c: &mut Config) {
    c.allocation_strategy(InstanceAllocationStrategy::OnDemand);
    c.memory_reservation(64 << 20);
    c.memory_guard_size(64 << 10);
}

fn engine(c: &Config) -> Result<Engine> {
    Engine::new(c).map_err(|e| Error::internal(format!("cannot create the wasm engine: {e:#}")))
}

impl Runtime {
    /// Builds the engine: the pooling allocator if its address-space
    /// reservation succeeds, otherwise on-demand allocation with small
    /// reservations (kernels with a 39-bit address space, as on some Jetson
    /// boards, cannot reserve the pool). `pooling = false` skips the probe.
    pub fn new(pooling: bool) -> Result<Runtime> {
        let arch = std::env::consts::ARCH.to_string();
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
                        arch,
                    })
                }
                Err(e) => tracing::info!(
                    "wasm: pooling allocator unavailable ({e:#}); using on-demand allocation"
                ),
            }
        }
        let mut c = base_config();
        on_demand(&mut c);
        Ok(Runtime {
            engine: engine(&c)?,
            pooling: false,
            arch,
        })
    }

    /// An engine generating code for another machine, `target` a triple such
    /// as `aarch64-unknown-linux-gnu`, with the memory layout the device will
    /// use (`pooling`, or on-demand where the pool cannot be reserved): for
    /// precompiling plugins into a device's `.cwasm` cache. Code uses the
    /// target's baseline instruction set, which every CPU of it runs.
    pub fn for_target(target: &str, pooling: bool) -> Result<Runtime> {
        let arch = target.split('-').next().unwrap_or(target).to_string();
        if !cfg!(feature = "cross-compile") && arch != std::env::consts::ARCH {
            return Err(Error::unsupported(format!(
                "this tern generates code for {host} only (built without the \
                 `cross-compile` feature, as the static device build is): precompile \
                 plugins for '{target}' with a build that has it, such as the gnu \
                 release, or on the device itself",
                host = std::env::consts::ARCH
            )));
        }
        let mut c = base_config();
        c.target(target).map_err(|e| {
            Error::invalid_arg(format!("unknown compilation target '{target}': {e:#}"))
        })?;
        if pooling {
            // The pool's memory layout is the default one; no pool is reserved here.
            c.allocation_strategy(InstanceAllocationStrategy::OnDemand);
        } else {
            on_demand(&mut c);
        }
        Ok(Runtime {
            engine: engine(&c)?,
            pooling,
            arch,
        })
    }

    /// What a `.cwasm` cache entry of this engine is made for: architecture
    /// and memory layout. Entries for another one are never picked; an entry
    /// from another Wasmtime version fails its check when loaded and is
    /// compiled again.
    pub fn cache_tag(&self) -> String {
        let layout = if self.pooling { "pooling" } else { "on-demand" };
        format!("{}-{layout}", self.arch)
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
            let ticker = std::thread::Builder::new()
                .name("wasm-epoch".into())
                .spawn(move || tick(engine))
                .map_err(|e| Error::internal(format!("cannot start the wasm epoch thread: {e}")))?;
            let _ = TICKER.set(ticker.thread().clone());
            // Calls may have started before the ticker was known.
            ticker.thread().unpark();
            Ok(rt)
        })
        .clone()
}

/// Epoch ticks covering `d` (at least one).
pub fn ticks(d: Duration) -> u64 {
    (d.as_micros() / EPOCH_TICK.as_micros()).max(1) as u64 + 1
}
