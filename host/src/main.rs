//! The `tern` binary: parse flags, set up logging, serve until SIGINT/SIGTERM;
//! `tern plugin new|build` scaffolds and builds WebAssembly plugins;
//! `tern model keygen|sign|verify|encrypt` prepares model folders.

use std::process::ExitCode;

use tern::cli::Args;
use tern::server;

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "plugin") {
        return tern_plugin_tool::main(argv[2..].to_vec(), &tern::plugins::compile);
    }
    if argv.get(1).is_some_and(|a| a == "model") {
        return tern::model_cli::main(argv[2..].to_vec());
    }
    if let Some(help) = Args::help_requested(&argv) {
        print!("{help}");
        return ExitCode::SUCCESS;
    }
    let args = match Args::parse_checked(argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if args.version {
        let settings = match args.backend_settings() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        };
        print!("{}", tern::version::report(&settings));
        return ExitCode::SUCCESS;
    }
    // Held to the end of main: dropping it writes out the queued log lines.
    let _log = match tern::logging::init(args.log_settings(), args.log_file.as_deref()) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let mut running = match server::start(&args).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!("{e}");
                return ExitCode::FAILURE;
            }
        };
        running.stop_requested().await;
        tracing::info!(
            "shutting down: waiting up to {}s for in-flight requests",
            args.exit_timeout_secs
        );
        running.shutdown().await;
        tracing::info!("stopped");
        ExitCode::SUCCESS
    })
}
