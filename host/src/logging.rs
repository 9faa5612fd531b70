//! Logging setup from the tritonserver logging flags.

use std::sync::Mutex;

use tracing_subscriber::EnvFilter;

use crate::cli::Args;
use crate::error::{Error, Result};

/// The level filter the flags ask for (`RUST_LOG` overrides it).
pub fn level(args: &Args) -> &'static str {
    match args.log_verbose {
        v if v >= 2 => "trace",
        1 => "debug",
        _ if args.log_info => "info",
        _ if args.log_warning => "warn",
        _ if args.log_error => "error",
        _ => "off",
    }
}

/// Installs the global subscriber (stderr or `--log-file`).
pub fn init(args: &Args) -> Result<()> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level(args)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match &args.log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| {
                    Error::invalid_arg(format!("cannot open --log-file '{}': {e}", path.display()))
                })?;
            builder
                .with_ansi(false)
                .with_writer(Mutex::new(file))
                .init();
        }
        None => builder.with_writer(std::io::stderr).init(),
    }
    Ok(())
}
