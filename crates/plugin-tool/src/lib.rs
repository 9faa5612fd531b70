//! `tern plugin new|build|compile`: scaffolding and building WebAssembly
//! plugins in Rust, Python, JavaScript and C. `new` writes a ready-to-build
//! folder (a `config.pbtxt`, the source skeleton, the WIT contract and the
//! language's guest SDK, all embedded in this binary); `build` finds the
//! language's toolchain, runs it and writes `<dir>/1/model.wasm`; `compile`
//! precompiles a repository's plugins for a device (the host binary, which
//! holds the WebAssembly engine, does the compiling).

pub mod build;
pub mod progress;
mod scaffold;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

pub use build::{build, BuildOptions};
pub use scaffold::create;

/// A plugin language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    /// Rust (cargo, wasm32-wasip2).
    Rust,
    /// Python (componentize-py).
    Python,
    /// JavaScript (jco componentize, QuickJS).
    Js,
    /// C (clang for wasm32-wasi + wasm-component-ld).
    C,
}

impl Lang {
    /// The language's display name.
    pub fn label(self) -> &'static str {
        match self {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
            Lang::C => "C",
        }
    }
}

#[derive(Debug, Parser)]
#[command(
    name = "tern plugin",
    about = "Create and build Tern WebAssembly plugins"
)]
struct PluginCli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Creates a plugin folder: config.pbtxt, source skeleton, wit/ and the guest SDK.
    New {
        /// Folder to create; its last component is the model name.
        dir: PathBuf,
        /// Plugin language.
        #[arg(long, value_enum)]
        lang: Lang,
    },
    /// Builds <dir> into <dir>/1/model.wasm with the language's toolchain.
    Build {
        /// The plugin folder.
        dir: PathBuf,
        /// Output file (default <dir>/1/model.wasm).
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Folder with the WIT contract (default <dir>/wit).
        #[arg(long)]
        wit: Option<PathBuf>,
        /// Folder with the guest SDK (default <dir>/sdk; unused for Rust).
        #[arg(long)]
        sdk: Option<PathBuf>,
        /// Also precompile the component for this machine into this cache
        /// folder, so the server's first load does not compile it (default:
        /// the server's default --wasm-cache-dir; `none` = do not precompile).
        #[arg(long)]
        cache_dir: Option<PathBuf>,
    },
    /// Precompiles every plugin of a model repository, and the Python runner
    /// when it has `backend: "python"` models, into a .cwasm cache folder for
    /// a target machine, so it never compiles them at first boot (copy the
    /// folder to the device's --wasm-cache-dir).
    Compile {
        /// The model repository.
        repository: PathBuf,
        /// The cache folder to write.
        #[arg(long)]
        cache_dir: PathBuf,
        /// Target triple of the device (default: this machine), e.g. aarch64-unknown-linux-gnu.
        #[arg(long)]
        target: Option<String>,
        /// The device runs plugins with on-demand allocation (its address
        /// space cannot hold the pooling allocator, e.g. 39-bit Jetson
        /// kernels; its log says "pooling allocator unavailable").
        #[arg(long)]
        on_demand: bool,
        /// The Python runner to precompile (default: where the server looks
        /// for it: beside this binary, ../lib/tern, /usr/lib/tern).
        #[arg(long, env = "TERN_PYTHON_RUNNER")]
        python_runner: Option<PathBuf>,
    },
}

/// What `tern plugin compile` (and `build`, for the component it built) asks
/// the host binary to do.
#[derive(Debug, Clone)]
pub struct CompileOptions {
    /// The model repository.
    pub repository: PathBuf,
    /// One component to compile instead of a repository's (for this machine's server).
    pub file: Option<PathBuf>,
    /// The cache folder to write (`None` = the server's default).
    pub cache_dir: Option<PathBuf>,
    /// Target triple (`None` = this machine).
    pub target: Option<String>,
    /// Compile for on-demand allocation instead of the pooling allocator.
    pub on_demand: bool,
    /// The Python runner to precompile for `backend: "python"` models
    /// (`None` = where the server looks for it).
    pub python_runner: Option<PathBuf>,
}

/// Compiles plugins for `tern plugin compile`; returns one line per plugin.
pub type Compiler = dyn Fn(&CompileOptions) -> tern_core::error::Result<Vec<String>>;

/// Parses the arguments of a `tern <tool>` command (`name`, e.g. `tern
/// plugin`; `args` after it). On `--help` or a usage error clap's message is
/// printed and the exit code returned (0 for help, 2 for an error).
pub fn parse_subcommand<P: Parser>(
    name: &str,
    args: Vec<std::ffi::OsString>,
) -> std::result::Result<P, ExitCode> {
    P::try_parse_from(std::iter::once(std::ffi::OsString::from(name)).chain(args)).map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// Runs `tern plugin ...` (`args` starts after `plugin`); messages go to
/// stderr because this is an interactive tool, not the server.
pub fn main(args: Vec<std::ffi::OsString>, compiler: &Compiler) -> ExitCode {
    let cli: PluginCli = match parse_subcommand("tern plugin", args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let result = match cli.command {
        Command::New { dir, lang } => create(&dir, lang).map(|files| {
            eprintln!(
                "created {} plugin '{}' ({} files); build it with: tern plugin build {}",
                lang.label(),
                dir.display(),
                files,
                dir.display()
            );
        }),
        Command::Build {
            dir,
            output,
            wit,
            sdk,
            cache_dir,
        } => build(&BuildOptions {
            dir,
            output,
            wit,
            sdk,
        })
        .and_then(|(lang, out, size)| {
            eprintln!(
                "built {} plugin: {} ({} bytes)",
                lang.label(),
                out.display(),
                size
            );
            if cache_dir.as_deref() == Some(std::path::Path::new("none")) {
                return Ok(());
            }
            eprintln!("precompiling it for this machine (the server's first load then reads the cache)...");
            let lines = compiler(&CompileOptions {
                repository: PathBuf::new(),
                file: Some(out),
                cache_dir,
                target: None,
                on_demand: false,
                python_runner: None,
            })?;
            for l in lines {
                eprintln!("{l}");
            }
            Ok(())
        }),
        Command::Compile {
            repository,
            cache_dir,
            target,
            on_demand,
            python_runner,
        } => compiler(&CompileOptions {
            repository,
            file: None,
            cache_dir: Some(cache_dir),
            target,
            on_demand,
            python_runner,
        })
        .map(|lines| {
            for l in lines {
                eprintln!("{l}");
            }
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
