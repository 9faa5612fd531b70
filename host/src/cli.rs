//! Command-line flags, compatible with `tritonserver` where Tern implements
//! the feature. Every flag can also be set through a `TERN_*` environment
//! variable. Known tritonserver flags that Tern does not implement yet are
//! rejected with a clear message instead of being silently accepted.

use std::path::PathBuf;

use clap::{ArgAction, Parser};

use tern_core::error::{Error, Result};

/// Tern: a Triton-compatible inference server.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "tern",
    about,
    disable_version_flag = true,
    // As tritonserver's getopt_long: `--log-warn` for `--log-warning`, and a
    // repeated flag takes its last value.
    infer_long_args = true,
    args_override_self = true,
    // Help under each flag: the longest gRPC flag would otherwise leave its
    // section's descriptions one word wide.
    next_line_help = true,
    after_help = "Plugins: `tern plugin new <dir> --lang rust|python|js|c`, `tern plugin build <dir>` (see `tern plugin --help`)."
)]
pub struct Args {
    /// Model repository path (repeatable).
    #[arg(
        help_heading = "Model repository",
        long = "model-repository",
        alias = "model-store",
        env = "TERN_MODEL_REPOSITORY",
        value_delimiter = ',',
        required_unless_present = "version"
    )]
    pub model_repository: Vec<PathBuf>,

    /// Print the version, git commit, target, cargo features and the ONNX Runtime library found, then exit.
    #[arg(help_heading = "Server", short = 'V', long = "version")]
    pub version: bool,

    /// HTTP port (0 = pick a free port).
    #[arg(
        help_heading = "HTTP",
        long,
        env = "TERN_HTTP_PORT",
        default_value_t = 8000
    )]
    pub http_port: u16,

    /// HTTP bind address, or `unix:<path>` for a Unix-domain socket (the port is then unused).
    #[arg(
        help_heading = "HTTP",
        long,
        env = "TERN_HTTP_ADDRESS",
        default_value = "0.0.0.0"
    )]
    pub http_address: String,

    /// gRPC port (0 = pick a free port).
    #[arg(
        help_heading = "GRPC",
        long,
        env = "TERN_GRPC_PORT",
        default_value_t = 8001
    )]
    pub grpc_port: u16,

    /// gRPC bind address, or `unix:<path>` for a Unix-domain socket (the port is then unused).
    #[arg(
        help_heading = "GRPC",
        long,
        env = "TERN_GRPC_ADDRESS",
        default_value = "0.0.0.0"
    )]
    pub grpc_address: String,

    /// Permissions of the Unix-domain socket files (octal; connecting needs write).
    #[arg(
        help_heading = "Server",
        long,
        env = "TERN_UNIX_SOCKET_MODE",
        default_value = "0660"
    )]
    pub unix_socket_mode: String,

    /// Owner of the Unix-domain socket files: `user`, `user:group` or `:group` (names or ids).
    #[arg(help_heading = "Server", long, env = "TERN_UNIX_SOCKET_OWNER")]
    pub unix_socket_owner: Option<String>,

    /// Serve gRPC.
    #[arg(help_heading = "GRPC", long, env = "TERN_ALLOW_GRPC", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub allow_grpc: bool,

    /// Interval of gRPC keepalive pings, in milliseconds.
    #[arg(
        help_heading = "GRPC",
        long,
        env = "TERN_GRPC_KEEPALIVE_TIME",
        default_value_t = 7_200_000
    )]
    pub grpc_keepalive_time: u64,

    /// How long to wait for a keepalive ping acknowledgement, in milliseconds.
    #[arg(
        help_heading = "GRPC",
        long,
        env = "TERN_GRPC_KEEPALIVE_TIMEOUT",
        default_value_t = 20_000
    )]
    pub grpc_keepalive_timeout: u64,

    /// Accept client keepalive pings (and send server ones) while no call is open.
    #[arg(help_heading = "GRPC", long, env = "TERN_GRPC_KEEPALIVE_PERMIT_WITHOUT_CALLS", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub grpc_keepalive_permit_without_calls: bool,

    /// Most server keepalive pings sent without data in between (0 = unlimited).
    #[arg(
        help_heading = "GRPC",
        long,
        env = "TERN_GRPC_HTTP2_MAX_PINGS_WITHOUT_DATA",
        default_value_t = 2
    )]
    pub grpc_http2_max_pings_without_data: u32,

    /// Shortest interval, in milliseconds, between client pings before they count as strikes.
    #[arg(
        help_heading = "GRPC",
        long,
        env = "TERN_GRPC_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA",
        default_value_t = 300_000
    )]
    pub grpc_http2_min_recv_ping_interval_without_data: u64,

    /// Ping strikes tolerated before the connection is closed (0 = unlimited).
    #[arg(
        help_heading = "GRPC",
        long,
        env = "TERN_GRPC_HTTP2_MAX_PING_STRIKES",
        default_value_t = 2
    )]
    pub grpc_http2_max_ping_strikes: u32,

    /// Close gRPC connections older than this many milliseconds (0 = never).
    #[arg(
        help_heading = "GRPC",
        long,
        env = "TERN_GRPC_MAX_CONNECTION_AGE",
        default_value_t = 0
    )]
    pub grpc_max_connection_age: u64,

    /// Extra time, in milliseconds, an aged connection gets to finish its calls.
    #[arg(
        help_heading = "GRPC",
        long,
        env = "TERN_GRPC_MAX_CONNECTION_AGE_GRACE",
        default_value_t = 0
    )]
    pub grpc_max_connection_age_grace: u64,

    /// Serve gRPC over TLS (needs --grpc-server-cert and --grpc-server-key).
    #[arg(help_heading = "GRPC", long, env = "TERN_GRPC_USE_SSL", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub grpc_use_ssl: bool,

    /// Require client certificates signed by --grpc-root-cert (implies --grpc-use-ssl).
    #[arg(help_heading = "GRPC", long, env = "TERN_GRPC_USE_SSL_MUTUAL", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub grpc_use_ssl_mutual: bool,

    /// PEM file with the server certificate chain.
    #[arg(help_heading = "GRPC", long, env = "TERN_GRPC_SERVER_CERT")]
    pub grpc_server_cert: Option<PathBuf>,

    /// PEM file with the server private key.
    #[arg(help_heading = "GRPC", long, env = "TERN_GRPC_SERVER_KEY")]
    pub grpc_server_key: Option<PathBuf>,

    /// PEM file with the CA that signs client certificates (mutual TLS).
    #[arg(help_heading = "GRPC", long, env = "TERN_GRPC_ROOT_CERT")]
    pub grpc_root_cert: Option<PathBuf>,

    /// Compression of inference responses for clients that accept it: none|low|medium|high
    /// (any level other than none uses gzip; tonic does not expose the level).
    #[arg(
        help_heading = "GRPC",
        long,
        env = "TERN_GRPC_INFER_RESPONSE_COMPRESSION_LEVEL",
        default_value = "none"
    )]
    pub grpc_infer_response_compression_level: String,

    /// Largest gRPC message accepted or sent, in bytes (Tern-specific;
    /// default 2147483647, Triton's fixed limit). A request over it fails
    /// with OUT_OF_RANGE before it is decoded.
    #[arg(help_heading = "GRPC", long, env = "TERN_GRPC_MAX_MESSAGE_SIZE", default_value_t = i32::MAX as usize, value_parser = clap::value_parser!(usize))]
    pub grpc_max_message_size: usize,

    /// Restrict HTTP API categories to calls carrying a header:
    /// `<category>[,<category>...]:<key>=<value>` (repeatable).
    #[arg(help_heading = "HTTP", long, env = "TERN_HTTP_RESTRICTED_API")]
    pub http_restricted_api: Vec<String>,

    /// Restrict gRPC protocol categories to calls carrying metadata:
    /// `<category>[,<category>...]:<key>=<value>` (repeatable).
    #[arg(help_heading = "GRPC", long, env = "TERN_GRPC_RESTRICTED_PROTOCOL")]
    pub grpc_restricted_protocol: Vec<String>,

    /// Serve HTTP.
    #[arg(help_heading = "HTTP", long, env = "TERN_ALLOW_HTTP", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub allow_http: bool,

    /// Server identifier reported by `GET /v2` (`triton`, as in tritonserver, so
    /// scripts that check it keep working; the `tern` extension identifies Tern).
    #[arg(
        help_heading = "Server",
        long,
        env = "TERN_ID",
        default_value = "triton"
    )]
    pub id: String,

    /// Exit at startup when any model fails to load.
    #[arg(help_heading = "Model repository", long, env = "TERN_EXIT_ON_ERROR", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub exit_on_error: bool,

    /// `/v2/health/ready` is 200 only when every model is ready.
    #[arg(help_heading = "Model repository", long, env = "TERN_STRICT_READINESS", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub strict_readiness: bool,

    /// Do not fill missing config fields from model files.
    #[arg(
        help_heading = "Model repository",
        long,
        env = "TERN_DISABLE_AUTO_COMPLETE_CONFIG"
    )]
    pub disable_auto_complete_config: bool,

    /// Deprecated Triton spelling of --disable-auto-complete-config.
    #[arg(help_heading = "Model repository", long, env = "TERN_STRICT_MODEL_CONFIG", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub strict_model_config: bool,

    /// Maximum HTTP request body size in bytes (also after decompression).
    #[arg(help_heading = "HTTP", long, env = "TERN_HTTP_MAX_INPUT_SIZE", default_value_t = 64 * 1024 * 1024)]
    pub http_max_input_size: usize,

    /// Seconds an HTTP client may take to send a request's headers, or leave
    /// its body without new data, before the connection is closed (Tern-specific;
    /// 0 = wait forever). Stalled clients then cannot hold connections open.
    #[arg(
        help_heading = "HTTP",
        long,
        env = "TERN_HTTP_READ_TIMEOUT_SECS",
        default_value_t = 60
    )]
    pub http_read_timeout_secs: u64,

    /// Verbose logging level (0 = off, 1 = debug, 2+ = trace).
    #[arg(
        help_heading = "Logging",
        long,
        env = "TERN_LOG_VERBOSE",
        default_value_t = 0
    )]
    pub log_verbose: u32,

    /// Log line format: `default` or `ISO8601`.
    #[arg(
        help_heading = "Logging",
        long,
        env = "TERN_LOG_FORMAT",
        default_value = "default"
    )]
    pub log_format: String,

    /// Log to this file instead of stderr.
    #[arg(help_heading = "Logging", long, env = "TERN_LOG_FILE")]
    pub log_file: Option<PathBuf>,

    /// Enable info-level logging.
    #[arg(help_heading = "Logging", long, env = "TERN_LOG_INFO", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub log_info: bool,

    /// Enable warning-level logging.
    #[arg(help_heading = "Logging", long, env = "TERN_LOG_WARNING", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub log_warning: bool,

    /// Enable error-level logging.
    #[arg(help_heading = "Logging", long, env = "TERN_LOG_ERROR", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub log_error: bool,

    /// On SIGINT/SIGTERM, how long in-flight requests may take before the server exits.
    #[arg(
        help_heading = "Server",
        long,
        env = "TERN_EXIT_TIMEOUT_SECS",
        default_value_t = 30
    )]
    pub exit_timeout_secs: u64,

    /// Where tritonserver looks for backend libraries; accepted for
    /// compatibility (Tern's backends are built in).
    #[arg(
        help_heading = "Backends and plugins",
        long,
        env = "TERN_BACKEND_DIRECTORY"
    )]
    pub backend_directory: Option<PathBuf>,

    /// tritonserver's lowest CUDA compute capability for GPU instances;
    /// accepted for compatibility (ONNX Runtime and LibTorch decide what runs).
    #[arg(
        help_heading = "Backends and plugins",
        long,
        env = "TERN_MIN_SUPPORTED_COMPUTE_CAPABILITY"
    )]
    pub min_supported_compute_capability: Option<f64>,

    /// Backend settings, `[<backend>,]<key>=<value>` (repeatable); e.g. `default-max-batch-size=8`.
    #[arg(
        help_heading = "Backends and plugins",
        long = "backend-config",
        env = "TERN_BACKEND_CONFIG",
        value_delimiter = ';'
    )]
    pub backend_config: Vec<String>,

    /// Model control: none (load everything at startup), poll (follow repository changes)
    /// or explicit (load and unload through the API).
    #[arg(
        help_heading = "Model repository",
        long,
        env = "TERN_MODEL_CONTROL_MODE",
        default_value = "none"
    )]
    pub model_control_mode: String,

    /// Model to load at startup in explicit mode (repeatable; `*` = every model).
    #[arg(
        help_heading = "Model repository",
        long,
        env = "TERN_LOAD_MODEL",
        value_delimiter = ','
    )]
    pub load_model: Vec<String>,

    /// Tern only, explicit mode: a request for a model that is in the
    /// repository but not loaded loads it and waits (within the request's
    /// timeout) instead of failing; concurrent requests share one load.
    #[arg(help_heading = "Model repository", long, env = "TERN_MODEL_LOAD_ON_DEMAND", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub model_load_on_demand: bool,

    /// Tern only, with --model-load-on-demand: unload unpinned models that no
    /// request used for this many seconds (0: never).
    #[arg(
        help_heading = "Model repository",
        long,
        env = "TERN_MODEL_IDLE_UNLOAD_SECS",
        default_value_t = 0
    )]
    pub model_idle_unload_secs: u64,

    /// Tern only, with --model-load-on-demand: the most memory the process
    /// may use (bytes, with K/M/G/Ki/Mi/Gi, or N% of the cgroup's limit, else
    /// of physical memory); a load evicts the least recently used unpinned
    /// models to stay under it, or is refused.
    #[arg(help_heading = "Model repository", long, env = "TERN_MEMORY_BUDGET")]
    pub memory_budget: Option<String>,

    /// Further attempts at a model version that fails to load (tritonserver's
    /// retry count: each attempt creates the version and its instances anew).
    #[arg(
        help_heading = "Model repository",
        long,
        env = "TERN_MODEL_LOAD_RETRY_COUNT",
        default_value_t = 0
    )]
    pub model_load_retry_count: u32,

    /// Seconds between repository polls in poll mode (0 or less: the
    /// repository is read at startup and not polled again, as tritonserver).
    #[arg(
        help_heading = "Model repository",
        long,
        env = "TERN_REPOSITORY_POLL_SECS",
        default_value_t = 15,
        allow_negative_numbers = true
    )]
    pub repository_poll_secs: i32,

    /// Use `<model>/configs/<name>.pbtxt` instead of `config.pbtxt` where it exists.
    #[arg(
        help_heading = "Model repository",
        long,
        env = "TERN_MODEL_CONFIG_NAME"
    )]
    pub model_config_name: Option<String>,

    /// Load only signed models: an Ed25519 public key (PEM) their manifest
    /// (`tern model sign`) must verify with. Repeat for several keys.
    #[arg(
        help_heading = "Model repository",
        long = "model-trust-key",
        value_name = "PEM",
        env = "TERN_MODEL_TRUST_KEY",
        value_delimiter = ','
    )]
    pub model_trust_key: Vec<std::path::PathBuf>,

    /// Where models of s3://, gs:// and as:// repositories are kept
    /// (default: TRITON_{AWS,GCS,AZURE}_MOUNT_DIRECTORY, else the state
    /// folder: $STATE_DIRECTORY/model-cache, $XDG_STATE_HOME/tern/model-cache
    /// or ~/.local/state/tern/model-cache).
    #[arg(
        help_heading = "Model repository",
        long = "model-cache-dir",
        value_name = "DIR",
        env = "TERN_MODEL_CACHE_DIR"
    )]
    pub model_cache_dir: Option<std::path::PathBuf>,

    /// Let clients register system and CUDA shared memory (off by default:
    /// a registered region gives the client a window into server memory).
    #[arg(help_heading = "Memory and devices", long, env = "TERN_ALLOW_CLIENT_SHM", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub allow_client_shm: bool,

    /// Page-locked host memory for staging GPU inputs, in bytes (needs CUDA; 0 disables).
    #[arg(help_heading = "Memory and devices", long, env = "TERN_PINNED_MEMORY_POOL_BYTE_SIZE", default_value_t = tern_memory::pool::DEFAULT_PINNED_POOL)]
    pub pinned_memory_pool_byte_size: usize,

    /// Recycled host memory for request bodies and CPU input batches, in bytes
    /// (Tern-specific; 0 = allocate per request).
    #[arg(help_heading = "Memory and devices", long, env = "TERN_HOST_MEMORY_POOL_BYTE_SIZE", default_value_t = tern_memory::pool::DEFAULT_HOST_POOL)]
    pub host_memory_pool_byte_size: usize,

    /// Device memory pool per GPU, `<gpu>:<bytes>` (repeatable, or comma-separated;
    /// default 64 MiB per GPU).
    #[arg(help_heading = "Memory and devices", long, env = "TERN_CUDA_MEMORY_POOL_BYTE_SIZE", value_delimiter = ',', value_parser = parse_cuda_pool)]
    pub cuda_memory_pool_byte_size: Vec<(usize, usize)>,

    /// Serve Prometheus metrics.
    #[arg(help_heading = "Metrics", long, env = "TERN_ALLOW_METRICS", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub allow_metrics: bool,

    /// Report CPU utilisation and memory.
    #[arg(help_heading = "Metrics", long, env = "TERN_ALLOW_CPU_METRICS", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub allow_cpu_metrics: bool,

    /// Report GPU metrics through NVML (where the driver provides it).
    #[arg(help_heading = "Metrics", long, env = "TERN_ALLOW_GPU_METRICS", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = parse_bool)]
    pub allow_gpu_metrics: bool,

    /// Metrics port (0 = pick a free port).
    #[arg(
        help_heading = "Metrics",
        long,
        env = "TERN_METRICS_PORT",
        default_value_t = 8002
    )]
    pub metrics_port: u16,

    /// Metrics bind address, or `unix:<path>` for a Unix-domain socket (the port is then unused).
    #[arg(
        help_heading = "Metrics",
        long,
        env = "TERN_METRICS_ADDRESS",
        default_value = "0.0.0.0"
    )]
    pub metrics_address: String,

    /// How often CPU and memory gauges are sampled, in milliseconds.
    #[arg(
        help_heading = "Metrics",
        long,
        env = "TERN_METRICS_INTERVAL_MS",
        default_value_t = 2000
    )]
    pub metrics_interval_ms: u64,

    /// Rate limiting of model instances: `off` or `execution_count`
    /// (instances run only with the resources their `rate_limiter` asks for).
    #[arg(help_heading = "Rate limiter", long, env = "TERN_RATE_LIMIT", default_value = "off", value_parser = parse_rate_limit)]
    pub rate_limit: String,

    /// A rate-limiter resource's copies, `<name>:<count>[:<device>]` (repeatable;
    /// without a device: on every device).
    #[arg(help_heading = "Rate limiter", long, env = "TERN_RATE_LIMIT_RESOURCE")]
    pub rate_limit_resource: Vec<crate::scheduler::rate_limit::ResourceFlag>,

    /// Response cache `<cache>,<setting>=<value>` (repeatable): `local,size=<bytes>`
    /// or `redis,host=<host>` with `redis,port=<port>` (docs/configuration.md).
    #[arg(help_heading = "Response cache", long, env = "TERN_CACHE_CONFIG")]
    pub cache_config: Vec<String>,

    /// Deprecated tritonserver spelling of `--cache-config=local,size=<bytes>`.
    #[arg(
        help_heading = "Response cache",
        long,
        env = "TERN_RESPONSE_CACHE_BYTE_SIZE"
    )]
    pub response_cache_byte_size: Option<String>,

    /// Where tritonserver looks for cache libraries; accepted for
    /// compatibility (Tern's caches are built in).
    #[arg(help_heading = "Response cache", long, env = "TERN_CACHE_DIRECTORY")]
    pub cache_directory: Option<PathBuf>,

    /// Tracing `[<mode>,]<setting>=<value>` (repeatable): `level`, `rate`,
    /// `count`, `mode` (triton or opentelemetry); `triton,file`,
    /// `triton,log-frequency`; `opentelemetry,url`, `opentelemetry,resource`,
    /// `opentelemetry,bsp_*` (docs/configuration.md, "Tracing").
    #[arg(help_heading = "Tracing", long, env = "TERN_TRACE_CONFIG")]
    pub trace_config: Vec<String>,

    /// Deprecated: `--trace-config triton,file=<path>`.
    #[arg(help_heading = "Tracing", long, env = "TERN_TRACE_FILE")]
    pub trace_file: Option<String>,

    /// Deprecated: `--trace-config level=<OFF|TIMESTAMPS|TENSORS>` (repeatable).
    #[arg(help_heading = "Tracing", long, env = "TERN_TRACE_LEVEL")]
    pub trace_level: Vec<String>,

    /// Deprecated: `--trace-config rate=<rate>`.
    #[arg(help_heading = "Tracing", long, env = "TERN_TRACE_RATE")]
    pub trace_rate: Option<String>,

    /// Deprecated: `--trace-config count=<count>`.
    #[arg(help_heading = "Tracing", long, env = "TERN_TRACE_COUNT")]
    pub trace_count: Option<String>,

    /// Deprecated: `--trace-config triton,log-frequency=<value>`.
    #[arg(help_heading = "Tracing", long, env = "TERN_TRACE_LOG_FREQUENCY")]
    pub trace_log_frequency: Option<String>,

    /// Request headers whose names match this regular expression (anywhere,
    /// case-insensitively) become string request parameters.
    #[arg(help_heading = "HTTP", long, env = "TERN_HTTP_HEADER_FORWARD_PATTERN")]
    pub http_header_forward_pattern: Option<String>,

    /// gRPC metadata whose keys match this regular expression (anywhere,
    /// case-insensitively) become string request parameters.
    #[arg(help_heading = "GRPC", long, env = "TERN_GRPC_HEADER_FORWARD_PATTERN")]
    pub grpc_header_forward_pattern: Option<String>,

    /// Metrics settings `<setting>=<value>` (repeatable): counter_latencies,
    /// summary_latencies, summary_quantiles.
    #[arg(help_heading = "Metrics", long, env = "TERN_METRICS_CONFIG")]
    pub metrics_config: Vec<String>,

    /// How many models load in parallel.
    #[arg(
        help_heading = "Model repository",
        long,
        env = "TERN_MODEL_LOAD_THREAD_COUNT",
        default_value_t = 4
    )]
    pub model_load_thread_count: usize,

    /// Seconds one model's load may take before it is abandoned and fails
    /// (0 = no limit). Loads of other models never wait for it.
    #[arg(
        help_heading = "Model repository",
        long,
        env = "TERN_MODEL_LOAD_TIMEOUT_SECS",
        default_value_t = 600
    )]
    pub model_load_timeout_secs: u64,

    /// Where compiled WebAssembly plugins are cached (default `$XDG_CACHE_HOME/tern/wasm` or `~/.cache/tern/wasm`; `none` = no cache).
    #[arg(
        help_heading = "Backends and plugins",
        long,
        env = "TERN_WASM_CACHE_DIR"
    )]
    pub wasm_cache_dir: Option<PathBuf>,

    /// The most the compiled-plugin cache may hold (bytes, with K/M/G/Ki/Mi/Gi;
    /// default 2Gi); the least recently used entries are removed to stay within it.
    #[arg(
        help_heading = "Backends and plugins",
        long,
        env = "TERN_WASM_CACHE_MAX_SIZE",
        default_value = "2Gi",
        value_parser = |s: &str| crate::repository::demand::parse_bytes("--wasm-cache-max-size", s)
    )]
    pub wasm_cache_max_size: u64,

    /// The Python runner component that serves `backend: "python"` models (default: `python-runner.wasm` beside the binary, else `../lib/tern/python-runner.wasm` from it).
    #[arg(
        help_heading = "Backends and plugins",
        long,
        env = "TERN_PYTHON_RUNNER"
    )]
    pub python_runner: Option<PathBuf>,

    /// Path of libonnxruntime.so (default: $ORT_DYLIB_PATH, next to the binary, ../lib/tern/ or ../lib/ beside it, then the system loader).
    #[arg(
        help_heading = "Backends and plugins",
        long,
        env = "TERN_ONNXRUNTIME_LIBRARY"
    )]
    pub onnxruntime_library: Option<PathBuf>,
}

/// A boolean flag value as tritonserver reads it: `true`/`on`/`1` or
/// `false`/`off`/`0`, in any case.
fn parse_bool(s: &str) -> std::result::Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "on" | "1" => Ok(true),
        "false" | "off" | "0" => Ok(false),
        _ => Err(format!("invalid value for bool option: {s}")),
    }
}

/// `--rate-limit`: `off` or `execution_count`, in any case (as tritonserver reads it).
fn parse_rate_limit(s: &str) -> std::result::Result<String, String> {
    match s.to_ascii_lowercase().as_str() {
        v @ ("off" | "execution_count") => Ok(v.to_string()),
        _ => Err(format!(
            "invalid argument for --rate-limit: '{s}' (off or execution_count)"
        )),
    }
}

/// `--cuda-memory-pool-byte-size <gpu>:<bytes>`.
fn parse_cuda_pool(s: &str) -> std::result::Result<(usize, usize), String> {
    let (gpu, bytes) = s
        .split_once(':')
        .ok_or_else(|| format!("expected <gpu>:<bytes>, got '{s}'"))?;
    let gpu = gpu
        .trim()
        .parse()
        .map_err(|_| format!("'{gpu}' is not a GPU index"))?;
    let bytes = bytes
        .trim()
        .parse()
        .map_err(|_| format!("'{bytes}' is not a byte count"))?;
    Ok((gpu, bytes))
}

/// tritonserver flags (or flag prefixes) that Tern does not implement yet.
const NOT_YET: &[&str] = &[
    "--cuda-virtual-address-size",
    "--repoagent-directory",
    "--allow-sagemaker",
    "--sagemaker-",
    "--allow-vertex-ai",
    "--vertex-ai-",
    "--buffer-manager-thread-count",
    "--model-namespacing",
    "--host-policy",
    "--http-thread-count",
    "--enable-peer-access",
    "--disable-auto-complete-config-for",
];

impl Args {
    /// The help text when the command line asks for it (`-h`, `--help`):
    /// printed to stdout with exit status 0 by the binary.
    pub fn help_requested(args: &[std::ffi::OsString]) -> Option<String> {
        match Args::try_parse_from(args) {
            Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {
                Some(e.render().to_string())
            }
            _ => None,
        }
    }

    /// Parses the command line, rejecting tritonserver flags Tern does not implement yet.
    pub fn parse_checked<I, T>(args: I) -> Result<Args>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        for a in args.iter().skip(1) {
            let s = a.to_string_lossy();
            let flag = s.split('=').next().unwrap_or("");
            if NOT_YET.iter().any(|p| {
                if p.ends_with('-') {
                    flag.starts_with(p)
                } else {
                    flag == *p
                }
            }) {
                return Err(Error::unsupported(format!(
                    "tritonserver flag '{flag}' is not supported by this version of Tern (see docs/configuration.md)"
                )));
            }
        }
        Args::try_parse_from(args).map_err(|e| Error::invalid_arg(e.to_string()))
    }

    /// Mode and owner of the frontends' Unix-domain socket files.
    pub fn unix_socket_settings(&self) -> Result<crate::frontend::listen::UnixSocketSettings> {
        crate::frontend::listen::UnixSocketSettings::parse(
            &self.unix_socket_mode,
            self.unix_socket_owner.as_deref(),
        )
    }

    /// gRPC server settings.
    pub fn grpc_settings(&self) -> Result<crate::frontend::grpc::GrpcSettings> {
        let compress = match self.grpc_infer_response_compression_level.as_str() {
            "none" => false,
            "low" | "medium" | "high" => true,
            other => {
                return Err(Error::invalid_arg(format!(
                    "--grpc-infer-response-compression-level must be none, low, medium or high, got '{other}'"
                )))
            }
        };
        let read = |flag: &str, path: &Option<PathBuf>| -> Result<Vec<u8>> {
            let path = path
                .as_ref()
                .ok_or_else(|| Error::invalid_arg(format!("TLS for gRPC needs {flag}")))?;
            std::fs::read(path)
                .map_err(|e| Error::invalid_arg(format!("{flag} '{}': {e}", path.display())))
        };
        let tls = if self.grpc_use_ssl || self.grpc_use_ssl_mutual {
            Some(crate::frontend::grpc::TlsSettings {
                cert: read("--grpc-server-cert", &self.grpc_server_cert)?,
                key: read("--grpc-server-key", &self.grpc_server_key)?,
                client_ca: if self.grpc_use_ssl_mutual {
                    Some(read("--grpc-root-cert", &self.grpc_root_cert)?)
                } else {
                    None
                },
            })
        } else {
            None
        };
        Ok(crate::frontend::grpc::GrpcSettings {
            restrictions: crate::frontend::restrict::Restrictions::parse(
                &self.grpc_restricted_protocol,
                "--grpc-restricted-protocol",
            )?,
            tls,
            keepalive_time: std::time::Duration::from_millis(self.grpc_keepalive_time),
            keepalive_timeout: std::time::Duration::from_millis(self.grpc_keepalive_timeout),
            compress_responses: compress,
            max_message_size: self.grpc_max_message_size.clamp(1, i32::MAX as usize),
            max_connection_age: (self.grpc_max_connection_age > 0)
                .then(|| std::time::Duration::from_millis(self.grpc_max_connection_age)),
            max_connection_age_grace: (self.grpc_max_connection_age_grace > 0)
                .then(|| std::time::Duration::from_millis(self.grpc_max_connection_age_grace)),
            header_forward: self
                .grpc_header_forward_pattern
                .as_deref()
                .map(|p| {
                    crate::frontend::common::HeaderForward::parse(
                        "--grpc-header-forward-pattern",
                        p,
                    )
                })
                .transpose()?,
            pings: crate::frontend::grpc::pings::PingPolicy {
                permit_without_calls: self.grpc_keepalive_permit_without_calls,
                max_pings_without_data: self.grpc_http2_max_pings_without_data,
                min_recv_ping_interval: std::time::Duration::from_millis(
                    self.grpc_http2_min_recv_ping_interval_without_data,
                ),
                max_ping_strikes: self.grpc_http2_max_ping_strikes,
            },
        })
    }

    /// The model control mode and what it loads at startup, checked for consistency.
    pub fn model_control(&self) -> Result<(crate::repository::control::ControlMode, Vec<String>)> {
        use crate::repository::control::ControlMode;
        let mode = ControlMode::parse(&self.model_control_mode)?;
        if !self.load_model.is_empty() && mode != ControlMode::Explicit {
            return Err(Error::invalid_arg(
                "--load-model needs --model-control-mode=explicit",
            ));
        }
        Ok((mode, self.load_model.clone()))
    }

    /// `--model-trust-key`: the public keys signed models must verify with.
    pub fn trust_keys(&self) -> Result<Vec<ed25519_dalek::VerifyingKey>> {
        self.model_trust_key
            .iter()
            .map(|p| {
                crate::repository::manifest::read_trust_key(p)
                    .map_err(|e| e.context("--model-trust-key"))
            })
            .collect()
    }

    /// `--model-load-on-demand`, `--model-idle-unload-secs` and
    /// `--memory-budget`, checked against the control mode: loading on
    /// demand needs explicit mode (in none and poll modes every model is
    /// loaded already, and the poller would undo an unload), and the other
    /// two need loading on demand (an unloaded model must come back).
    pub fn on_demand(&self) -> Result<crate::repository::demand::OnDemandOptions> {
        use crate::repository::control::ControlMode;
        let o = crate::repository::demand::OnDemandOptions {
            enabled: self.model_load_on_demand,
            idle_unload: (self.model_idle_unload_secs > 0)
                .then(|| std::time::Duration::from_secs(self.model_idle_unload_secs)),
            budget: self
                .memory_budget
                .as_deref()
                .map(crate::repository::demand::parse_budget)
                .transpose()?,
        };
        if o.enabled && ControlMode::parse(&self.model_control_mode)? != ControlMode::Explicit {
            return Err(Error::invalid_arg(
                "--model-load-on-demand needs --model-control-mode=explicit",
            ));
        }
        if !o.enabled && (o.idle_unload.is_some() || o.budget.is_some()) {
            return Err(Error::invalid_arg(
                "--model-idle-unload-secs and --memory-budget need --model-load-on-demand=true",
            ));
        }
        Ok(o)
    }

    /// Metrics settings from `--allow-cpu-metrics`, `--metrics-interval-ms` and `--metrics-config`.
    pub fn metrics_settings(&self) -> Result<crate::metrics::MetricsSettings> {
        if self.metrics_interval_ms == 0 {
            return Err(Error::invalid_arg("--metrics-interval-ms must be > 0"));
        }
        let mut s = crate::metrics::MetricsSettings {
            cpu: self.allow_cpu_metrics,
            gpu: self.allow_gpu_metrics,
            interval: std::time::Duration::from_millis(self.metrics_interval_ms),
            ..Default::default()
        };
        s.apply_config(&self.metrics_config)?;
        Ok(s)
    }

    /// The rate limiter `--rate-limit` and `--rate-limit-resource` ask for (`None`: off).
    pub fn rate_limiter(
        &self,
    ) -> Option<std::sync::Arc<crate::scheduler::rate_limit::RateLimiter>> {
        (self.rate_limit == "execution_count").then(|| {
            crate::scheduler::rate_limit::RateLimiter::new(self.rate_limit_resource.clone())
        })
    }

    /// The response cache `--cache-config` (or `--response-cache-byte-size`) asks for.
    pub fn cache_settings(&self) -> Result<Option<crate::cache::CacheSettings>> {
        if let Some(dir) = &self.cache_directory {
            tracing::info!(
                "--cache-directory '{}' has no effect: Tern's response caches are built in",
                dir.display()
            );
        }
        crate::cache::CacheSettings::from_flags(
            &self.cache_config,
            self.response_cache_byte_size.as_deref(),
        )
    }

    /// The tracing `--trace-config` and the deprecated `--trace-*` flags ask for.
    pub fn trace_config(&self) -> Result<crate::trace::TraceConfig> {
        crate::trace::flags::parse(
            &self.trace_config,
            &crate::trace::flags::Deprecated {
                file: self.trace_file.clone(),
                level: self.trace_level.clone(),
                rate: self.trace_rate.clone(),
                count: self.trace_count.clone(),
                log_frequency: self.trace_log_frequency.clone(),
            },
        )
    }

    /// Whether configs are auto-completed.
    pub fn auto_complete(&self) -> bool {
        !self.disable_auto_complete_config && !self.strict_model_config
    }

    /// The logging settings from the `--log-*` flags.
    pub fn log_settings(&self) -> crate::logging::Settings {
        crate::logging::Settings {
            log_file: self
                .log_file
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            log_info: self.log_info,
            log_warning: self.log_warning,
            log_error: self.log_error,
            log_verbose_level: self.log_verbose,
            log_format: self.log_format.clone(),
        }
    }

    /// Parses `--backend-config` into backend settings.
    pub fn backend_settings(&self) -> Result<tern_core::backend::BackendSettings> {
        let mut settings = tern_core::backend::BackendSettings {
            onnxruntime_library: self.onnxruntime_library.clone(),
            default_max_batch_size: 4,
            wasm_cache_dir: match self.wasm_cache_dir.as_deref() {
                Some(p) if p.as_os_str() == "none" => None,
                Some(p) => Some(p.to_path_buf()),
                None => tern_wasm::cache::default_dir(),
            },
            wasm_cache_max_bytes: self.wasm_cache_max_size,
            python_runner: self.python_runner.clone(),
        };
        for entry in &self.backend_config {
            let (scope, kv) = match entry.split_once(',') {
                Some((scope, kv)) => (Some(scope), kv),
                None => (None, entry.as_str()),
            };
            let (key, value) = kv.split_once('=').ok_or_else(|| {
                Error::invalid_arg(format!(
                    "--backend-config '{entry}': expected [<backend>,]<key>=<value>"
                ))
            })?;
            match (scope, key) {
                (None | Some("onnxruntime"), "default-max-batch-size") => {
                    settings.default_max_batch_size = value.parse().ok().filter(|&n: &i32| n >= 0).ok_or_else(|| {
                        Error::invalid_arg(format!("--backend-config default-max-batch-size: '{value}' is not a non-negative integer"))
                    })?;
                }
                // Triton hands every other setting to its backend; none of them
                // changes what Tern does (its Python runner is in-process, so the
                // python backend's shared-memory and stub settings have no meaning).
                _ => tracing::warn!(
                    "--backend-config '{entry}' has no effect in Tern (the setting Tern reads is [onnxruntime,]default-max-batch-size)"
                ),
            }
        }
        if let Some(dir) = &self.backend_directory {
            tracing::info!(
                "--backend-directory '{}' has no effect: Tern's backends are built in",
                dir.display()
            );
        }
        if let Some(cc) = self.min_supported_compute_capability {
            tracing::info!(
                "--min-supported-compute-capability {cc} has no effect: ONNX Runtime and LibTorch decide which GPUs they can use"
            );
        }
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag has its `TERN_*` variable (docs/deployment.md promises one
    /// for each), named after the flag, and a bad value in it is refused.
    #[test]
    fn every_flag_has_its_environment_variable() {
        use clap::CommandFactory;
        let cmd = Args::command();
        let mut checked = 0;
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            if matches!(long, "help" | "version") {
                continue;
            }
            let want = format!("TERN_{}", long.to_uppercase().replace('-', "_"));
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(want.as_str()),
                "--{long}"
            );
            checked += 1;
        }
        assert!(checked > 40, "{checked}");
        // The variable goes through the flag's own parser (setting it here
        // would race the other tests that parse arguments).
        let e = Args::parse_checked([
            "tern",
            "--model-repository=/m",
            "--pinned-memory-pool-byte-size=abc",
        ])
        .unwrap_err();
        assert!(e.message.contains("abc"), "{e}");
    }

    #[test]
    fn help_text_is_readable() {
        use clap::CommandFactory;
        let help = Args::command().term_width(100).render_help().to_string();
        let narrow: Vec<&str> = help
            .lines()
            // A long `[env: TERN_...=]` may wrap alone; a word of a sentence may not.
            .filter(|l| {
                l.len() > 40 && l.split_whitespace().count() == 1 && !l.contains(['=', '[', ']'])
            })
            .collect();
        assert!(narrow.is_empty(), "one-word help lines: {narrow:?}");
    }

    #[test]
    fn triton_style_flags() {
        let a = Args::parse_checked([
            "tern",
            "--model-store=/m",
            "--exit-on-error=false",
            "--strict-readiness",
            "false",
            "--http-port",
            "0",
        ])
        .unwrap();
        assert_eq!(a.model_repository, vec![PathBuf::from("/m")]);
        assert!(!a.exit_on_error);
        assert!(!a.strict_readiness);
        assert_eq!(a.http_port, 0);
        assert!(a.auto_complete());
        let a = Args::parse_checked([
            "tern",
            "--model-repository",
            "/a",
            "--model-repository",
            "/b",
            "--strict-model-config=true",
        ])
        .unwrap();
        assert_eq!(a.model_repository.len(), 2);
        assert!(!a.auto_complete());
    }

    #[test]
    fn rejects_unimplemented_and_unknown() {
        let e = Args::parse_checked(["tern", "--model-repository=/m", "--repoagent-directory=/r"])
            .unwrap_err();
        assert!(
            e.message
                .contains("'--repoagent-directory' is not supported"),
            "{e}"
        );
        let a = Args::parse_checked([
            "tern",
            "--model-repository=/m",
            "--trace-config=level=TIMESTAMPS",
            "--trace-config=triton,file=/t.json",
            "--trace-rate=7",
        ])
        .unwrap();
        let t = a.trace_config().unwrap();
        assert_eq!((t.values.rate, t.values.file.as_str()), (7, "/t.json"));
        let e = Args::parse_checked(["tern", "--model-repository=/m", "--bogus"]).unwrap_err();
        assert!(e.message.contains("--bogus"), "{e}");
        let a = Args::parse_checked(["tern", "--model-repository=/m", "--load-model=a"]).unwrap();
        assert!(
            a.model_control().is_err(),
            "--load-model outside explicit mode"
        );
        let a = Args::parse_checked([
            "tern",
            "--model-repository=/m",
            "--model-control-mode=explicit",
            "--load-model=a",
            "--load-model",
            "b",
        ])
        .unwrap();
        assert_eq!(a.model_control().unwrap().1, vec!["a", "b"]);
        let a = Args::parse_checked(["tern", "--model-repository=/m", "--metrics-config=nope=1"])
            .unwrap();
        let e = a.metrics_settings().unwrap_err();
        assert!(e.message.contains("unknown setting"), "{e}");
    }

    #[test]
    fn loading_on_demand_needs_explicit_mode_and_the_rest_need_it() {
        let args = |extra: &[&str]| {
            let mut v = vec!["tern", "--model-repository=/m"];
            v.extend_from_slice(extra);
            Args::parse_checked(v).unwrap().on_demand()
        };
        let o = args(&[
            "--model-control-mode=explicit",
            "--model-load-on-demand",
            "--model-idle-unload-secs=300",
            "--memory-budget=2Gi",
        ])
        .unwrap();
        assert!(o.enabled);
        assert_eq!(o.idle_unload, Some(std::time::Duration::from_secs(300)));
        assert_eq!(o.budget, Some(2 << 30));
        assert!(!args(&[]).unwrap().enabled);
        let e = args(&["--model-load-on-demand=true"]).unwrap_err();
        assert!(
            e.message.contains("needs --model-control-mode=explicit"),
            "{e}"
        );
        let e = args(&["--model-control-mode=explicit", "--memory-budget=50%"]).unwrap_err();
        assert!(e.message.contains("need --model-load-on-demand"), "{e}");
        assert!(args(&["--memory-budget=lots"]).is_err());
    }

    #[test]
    fn backend_config() {
        let a = Args::parse_checked([
            "tern",
            "--model-repository=/m",
            "--backend-config=onnxruntime,default-max-batch-size=8",
        ])
        .unwrap();
        assert_eq!(a.backend_settings().unwrap().default_max_batch_size, 8);
        // Triton's Jetson command line: accepted, logged, no effect.
        let a = Args::parse_checked([
            "tern",
            "--model-repository=/m",
            "--backend-directory=/opt/tritonserver/backends",
            "--min-supported-compute-capability=5.3",
            "--backend-config=python,shm-default-byte-size=2097152",
            "--backend-config=foo=1",
        ])
        .unwrap();
        assert_eq!(a.backend_settings().unwrap().default_max_batch_size, 4);
        for bad in [
            "--backend-config=foo",
            "--backend-config=default-max-batch-size=-1",
        ] {
            let a = Args::parse_checked(["tern", "--model-repository=/m", bad]).unwrap();
            assert!(a.backend_settings().is_err(), "{bad}");
        }
        assert!(Args::parse_checked([
            "tern",
            "--model-repository=/m",
            "--min-supported-compute-capability=abc"
        ])
        .is_err());
    }
}
