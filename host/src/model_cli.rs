//! `tern model keygen|sign|verify|encrypt`: the tools that prepare model
//! folders for servers that load only signed models (`--model-trust-key`)
//! or serve encrypted ones (the `decrypt` repository agent).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tern_core::error::{Error, Result};

use crate::repository::{decrypt, manifest};

#[derive(Parser)]
#[command(
    name = "tern model",
    about = "Sign and encrypt model folders",
    after_help = "Sign: `tern model keygen --sign key.pem`, then `tern model sign --key key.pem <model folder>`; \
                  serve with `--model-trust-key key.pem.pub`.\n\
                  Encrypt: `tern model keygen --encrypt model.key`, then `tern model encrypt --key model.key \
                  --out <repository> <model folder>`."
)]
struct ModelCli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Writes a new key, readable by its owner only (an existing file is never replaced).
    Keygen {
        /// An Ed25519 signing key: PKCS#8 PEM at PATH, its public key (for --model-trust-key) at PATH.pub.
        #[arg(
            long,
            value_name = "PATH",
            required_unless_present = "encrypt",
            conflicts_with = "encrypt"
        )]
        sign: Option<PathBuf>,
        /// A decryption key for the `decrypt` agent: 32 random bytes as 64 hex digits.
        #[arg(long, value_name = "PATH")]
        encrypt: Option<PathBuf>,
    },
    /// Writes each model folder's manifest (every file's SHA-256) and its signature.
    Sign {
        /// The signing key (PKCS#8 PEM, from `tern model keygen --sign` or `openssl genpkey -algorithm ed25519`).
        #[arg(long, value_name = "PEM")]
        key: PathBuf,
        /// Model folders (the folder's name is the model's).
        #[arg(required = true)]
        models: Vec<PathBuf>,
    },
    /// Checks model folders as a server started with --model-trust-key does.
    Verify {
        /// Public keys (PEM) the manifest may verify with.
        #[arg(long = "trust-key", value_name = "PEM", required = true)]
        trust_key: Vec<PathBuf>,
        /// Model folders.
        #[arg(required = true)]
        models: Vec<PathBuf>,
    },
    /// Writes a copy of a model folder with its model files encrypted
    /// (AES-256-GCM) and the `decrypt` agent named in its config.
    Encrypt {
        /// The key file (64 hex digits, from `tern model keygen --encrypt`).
        #[arg(long, value_name = "PATH")]
        key: PathBuf,
        /// Where the copy goes: `<OUT>/<model name>` (a repository folder; the copy must not exist yet).
        #[arg(long, value_name = "OUT")]
        out: PathBuf,
        /// Files to encrypt, relative to the model folder (default: each
        /// version's model file, `default_model_filename` or
        /// model.onnx/model.wasm).
        #[arg(long = "file", value_name = "PATH")]
        files: Vec<String>,
        /// How the server finds the key, written into the copy's config:
        /// key_file=<path> (default: the key's path), key_env=<variable> or
        /// key_credential=<systemd credential name>.
        #[arg(long, value_name = "KIND=VALUE")]
        key_source: Option<String>,
        /// The model folder.
        model: PathBuf,
    },
}

/// Runs `tern model <argv>`.
pub fn main(argv: Vec<OsString>) -> ExitCode {
    let cli: ModelCli = match tern_plugin_tool::parse_subcommand("tern model", argv) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Keygen { sign, encrypt } => {
            if let Some(path) = sign {
                let key = manifest::generate()?;
                let (private, public) = manifest::to_pem(&key)?;
                let public_path = with_suffix(&path, ".pub");
                write_new(&path, private.as_bytes(), 0o600)?;
                write_new(&public_path, public.as_bytes(), 0o644)?;
                eprintln!(
                    "wrote the signing key to '{}' and its public key to '{}'",
                    path.display(),
                    public_path.display()
                );
            } else if let Some(path) = encrypt {
                write_new(
                    &path,
                    format!("{}\n", decrypt::generate_hex()?).as_bytes(),
                    0o600,
                )?;
                eprintln!("wrote a decryption key to '{}'", path.display());
            }
            Ok(())
        }
        Command::Sign { key, models } => {
            let key = manifest::read_signing_key(&key)?;
            for dir in models {
                let signed = manifest::sign(&dir, &key)?;
                eprintln!(
                    "signed model '{}': {} files ('{}')",
                    signed.model,
                    signed.files.len(),
                    dir.join(manifest::MANIFEST).display()
                );
            }
            Ok(())
        }
        Command::Verify { trust_key, models } => {
            let keys = trust_key
                .iter()
                .map(|p| manifest::read_trust_key(p))
                .collect::<Result<Vec<_>>>()?;
            for dir in models {
                let name = manifest::model_name(&dir)?;
                let signed = manifest::verify(&dir, &name, &keys)
                    .map_err(|e| e.context(format!("model '{name}'")))?;
                eprintln!("model '{name}': verified, {} files", signed.files.len());
            }
            Ok(())
        }
        Command::Encrypt {
            key,
            out,
            files,
            key_source,
            model,
        } => encrypt(&key, &out, files, key_source, &model),
    }
}

/// `path` with `suffix` added to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Creates `path` (never replacing a file) with `bytes` and `mode`.
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail =
        |e: std::io::Error| Error::invalid_arg(format!("cannot write '{}': {e}", path.display()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(fail)?;
    f.write_all(bytes).map_err(fail)?;
    f.sync_all().map_err(fail)
}

/// The files `tern model encrypt` encrypts by default: each version's model file.
fn default_files(model: &Path, cfg: &tern_core::config::ModelConfig) -> Result<Vec<String>> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(model)
        .map_err(|e| Error::invalid_arg(format!("cannot list '{}': {e}", model.display())))?;
    let mut versions: Vec<String> = entries
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.parse::<i64>().is_ok())
        .collect();
    versions.sort();
    for version in versions {
        let candidates: Vec<&str> = if cfg.default_model_filename.is_empty() {
            vec!["model.onnx", "model.wasm"]
        } else {
            vec![cfg.default_model_filename.as_str()]
        };
        let found = candidates
            .iter()
            .find(|c| model.join(&version).join(c).is_file())
            .ok_or_else(|| {
                Error::invalid_arg(format!(
                    "version {version} has no model file to encrypt ({}); name files with --file",
                    candidates.join(" or ")
                ))
            })?;
        files.push(format!("{version}/{found}"));
    }
    if files.is_empty() {
        return Err(Error::invalid_arg(format!(
            "'{}' has no version folders to encrypt",
            model.display()
        )));
    }
    Ok(files)
}

fn encrypt(
    key_path: &Path,
    out: &Path,
    files: Vec<String>,
    key_source: Option<String>,
    model: &Path,
) -> Result<()> {
    let key = decrypt::Key::from_file(key_path, &format!("'{}'", key_path.display()))?;
    let name = manifest::model_name(model)?;
    let config_path = model.join("config.pbtxt");
    let config_text = std::fs::read_to_string(&config_path).unwrap_or_default();
    let cfg = tern_core::config::parse_pbtxt(&config_text)
        .map_err(|e| e.context(config_path.display()))?;
    let files = if files.is_empty() {
        default_files(model, &cfg)?
    } else {
        files
    };
    let target = out.join(&name);
    if target.exists() {
        return Err(Error::invalid_arg(format!(
            "'{}' exists: encrypt writes a new copy of the model folder",
            target.display()
        )));
    }
    let stanza = agent_stanza(key_path, key_source.as_deref())?;
    if cfg.model_repository_agents.is_some() {
        return Err(Error::invalid_arg(format!(
            "the config names repository agents already: add the decrypt agent to its list \
             yourself (and encrypt with --file), or remove them first:\n  {stanza}"
        )));
    }
    // Built in a temporary folder beside the target and renamed into place
    // whole; the files to encrypt are never copied in plain.
    std::fs::create_dir_all(out)
        .map_err(|e| Error::invalid_arg(format!("'{}': {e}", out.display())))?;
    let staging = tempfile::Builder::new()
        .prefix(".tern-encrypt-")
        .tempdir_in(out)
        .map_err(|e| Error::invalid_arg(format!("'{}': {e}", out.display())))?;
    let copy = staging.path().join(&name);
    let skip: std::collections::HashSet<PathBuf> = files
        .iter()
        .chain(
            [
                manifest::MANIFEST.to_string(),
                manifest::SIGNATURE.to_string(),
            ]
            .iter(),
        )
        .map(|f| model.join(f))
        .collect();
    copy_tree(model, &copy, &skip)?;
    write_encrypted(model, &copy, &files, &key)?;
    let mut text = config_text;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&stanza);
    text.push('\n');
    manifest::write_whole(&copy.join("config.pbtxt"), text.as_bytes())?;
    std::fs::rename(&copy, &target)
        .map_err(|e| Error::invalid_arg(format!("'{}': {e}", target.display())))?;
    eprintln!(
        "wrote '{}'{}",
        target.display(),
        if model.join(manifest::MANIFEST).exists() {
            "; the model was signed: sign the copy again (`tern model sign`)"
        } else {
            ""
        }
    );
    Ok(())
}

/// The `decrypt` agent's stanza for the config, naming where the server
/// finds the key (`--key-source`, default: the key file's path).
fn agent_stanza(key_path: &Path, key_source: Option<&str>) -> Result<String> {
    let (kind, value) = match key_source {
        Some(s) => s
            .split_once('=')
            .filter(|(k, _)| ["key_file", "key_env", "key_credential"].contains(k))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .ok_or_else(|| {
                Error::invalid_arg(format!(
                    "--key-source '{s}': expected key_file=<path>, key_env=<variable> or \
                     key_credential=<name>"
                ))
            })?,
        None => {
            let path = key_path
                .canonicalize()
                .map_err(|e| Error::invalid_arg(format!("'{}': {e}", key_path.display())))?;
            ("key_file".to_string(), path.display().to_string())
        }
    };
    Ok(format!(
        "model_repository_agents {{ agents [ {{ name: \"decrypt\" parameters {{ key: \"{kind}\" value: \"{}\" }} }} ] }}",
        value.replace('\\', "\\\\").replace('"', "\\\"")
    ))
}

/// Writes each of `files` (relative to `model`) encrypted with `key` into `copy`.
fn write_encrypted(model: &Path, copy: &Path, files: &[String], key: &decrypt::Key) -> Result<()> {
    for relative in files {
        let source = tern_core::files::resolve_inside(
            model,
            model,
            relative,
            &format!("--file '{relative}'"),
        )?;
        let plain = std::fs::read(&source)
            .map_err(|e| Error::invalid_arg(format!("cannot read '{}': {e}", source.display())))?;
        let sealed = if decrypt::is_encrypted(&plain) {
            eprintln!("'{relative}' is encrypted already: copied as it is");
            plain
        } else {
            eprintln!("encrypted '{relative}'");
            key.encrypt(&plain)?
        };
        let dest = copy.join(relative);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::invalid_arg(format!("'{}': {e}", parent.display())))?;
        }
        manifest::write_whole(&dest, &sealed)?;
    }
    Ok(())
}

/// Copies the folder `from` to `to` but the files in `skip` (links to files
/// copied as what they point at; a link to a folder is refused: it could loop).
fn copy_tree(from: &Path, to: &Path, skip: &std::collections::HashSet<PathBuf>) -> Result<()> {
    let fail = |p: &Path, e: std::io::Error| Error::invalid_arg(format!("'{}': {e}", p.display()));
    std::fs::create_dir_all(to).map_err(|e| fail(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| fail(from, e))? {
        let entry = entry.map_err(|e| fail(from, e))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if skip.contains(&src) {
            continue;
        }
        let link = entry.file_type().is_ok_and(|t| t.is_symlink());
        if src.is_dir() {
            if link {
                return Err(Error::invalid_arg(format!(
                    "'{}' is a link to a folder: copy the model folder without it",
                    src.display()
                )));
            }
            copy_tree(&src, &dst, skip)?;
        } else {
            std::fs::copy(&src, &dst).map_err(|e| fail(&src, e))?;
        }
    }
    Ok(())
}
