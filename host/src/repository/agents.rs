//! Repository agents (`model_repository_agents` in `config.pbtxt`), run on
//! every load before the backend sees the model's files, and the [`Gate`]
//! backends read those files through. Built in: Triton's `checksum` agent
//! (`MD5:<path relative to the model folder>` → expected hex digest; a
//! mismatch fails the load with Triton's message) and Tern's `decrypt` agent
//! (model files decrypted in memory as they are loaded, [`super::decrypt`]).
//! Any other agent name fails the load: serving a model without the action
//! its config asks for would serve it wrongly. A signed model's manifest
//! ([`super::manifest`]) is checked before the agents run; the gate checks
//! each file a backend reads against it again.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use md5::{Digest, Md5};
use tern_core::backend::FileGate;
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};

use super::decrypt;
use super::manifest::{FileEntry, Manifest};

/// Runs the config's agents on the model folder `dir` (whose verified
/// manifest is `signed`, when the server loads only signed models) and
/// returns how the backend reads the model's files.
pub fn run(cfg: &ModelConfig, dir: &Path, signed: Option<Manifest>) -> Result<Arc<dyn FileGate>> {
    let mut key = None;
    for agent in cfg.model_repository_agents.iter().flat_map(|a| &a.agents) {
        // Sorted: the first failure is the same on every load.
        let params: BTreeMap<String, String> = agent
            .parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        match agent.name.as_str() {
            "checksum" => {
                for (key, expected) in &params {
                    checksum(dir, key, expected).map_err(|e| e.for_model(&cfg.name))?;
                }
            }
            "decrypt" => {
                if key.is_some() {
                    return Err(Error::invalid_arg(
                        "the 'decrypt' repository agent is named twice",
                    )
                    .for_model(&cfg.name));
                }
                key = Some(
                    decrypt::Key::from_parameters(&params).map_err(|e| e.for_model(&cfg.name))?,
                );
            }
            other => {
                return Err(Error::unsupported(format!(
                    "repository agent '{other}' is not available: Tern has the 'checksum' and \
                     'decrypt' agents built in and loads no agent libraries"
                ))
                .for_model(&cfg.name))
            }
        }
    }
    if signed.is_none() && key.is_none() {
        return Ok(tern_core::backend::plain_files());
    }
    Ok(Arc::new(Gate {
        dir: dir.to_path_buf(),
        signed: signed.map(|m| m.files),
        key,
    }))
}

/// How a backend reads the files of a signed or encrypted model: each file
/// read whole, checked against the signed manifest (the bytes loaded are the
/// bytes checked, whatever happened to the file since the load's first
/// check), then decrypted; the plaintext stays in memory.
#[derive(Debug)]
pub struct Gate {
    dir: PathBuf,
    signed: Option<BTreeMap<String, FileEntry>>,
    key: Option<decrypt::Key>,
}

impl FileGate for Gate {
    fn read(&self, path: &Path) -> Result<Vec<u8>> {
        let relative = path
            .strip_prefix(&self.dir)
            .ok()
            .and_then(|p| p.to_str())
            .map(|p| p.replace(std::path::MAIN_SEPARATOR, "/"))
            .ok_or_else(|| {
                Error::invalid_arg(format!(
                    "'{}' is not in the model folder '{}'",
                    path.display(),
                    self.dir.display()
                ))
            })?;
        tern_core::files::check_regular(path, &format!("file '{relative}'"))?;
        if let Some(files) = &self.signed {
            // Not read at all when its size already differs (a grown file).
            let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(u64::MAX);
            if let Some(entry) = files.get(&relative).filter(|e| e.size != size) {
                return Err(Error::invalid_arg(format!(
                    "file '{relative}' does not match the signed manifest (size expected {}, \
                     got {size})",
                    entry.size
                )));
            }
        }
        let bytes = std::fs::read(path)
            .map_err(|e| Error::invalid_arg(format!("cannot read '{}': {e}", path.display())))?;
        if let Some(files) = &self.signed {
            let Some(entry) = files.get(&relative) else {
                return Err(Error::invalid_arg(format!(
                    "file '{relative}' is not in the signed manifest"
                )));
            };
            entry.check(&relative, &bytes)?;
        }
        match &self.key {
            Some(key) => key.decrypt(&relative, &bytes),
            None => Ok(bytes),
        }
    }
    fn sealed(&self) -> bool {
        self.key.is_some()
    }
    fn checked(&self) -> bool {
        true
    }
}

/// One `checksum` parameter: `<algorithm>:<relative path>` and its digest.
fn checksum(dir: &Path, key: &str, expected: &str) -> Result<()> {
    let Some((algorithm, file)) = key.split_once(':') else {
        return Err(Error::invalid_arg(format!("failed to parse key: {key}")));
    };
    if !algorithm.eq_ignore_ascii_case("md5") {
        return Err(Error::unsupported(format!(
            "Unsupported checksum algorithm: {algorithm}"
        )));
    }
    // A missing file in the agent's words; anything else as Tern says it.
    if let Err(e) = std::fs::symlink_metadata(dir.join(file)) {
        return Err(Error::invalid_arg(format!(
            "failed to open text file for read {file}: {e}"
        )));
    }
    let what = format!("checksum agent, file '{file}'");
    // Unlike Triton's agent, a path may not lead out of the model folder.
    let path = tern_core::files::resolve_inside(dir, dir, file, &what)?;
    tern_core::files::check_regular(&path, &what)?;
    let open = |e: std::io::Error| {
        Error::invalid_arg(format!("failed to open text file for read {file}: {e}"))
    };
    let mut f = std::fs::File::open(&path).map_err(open)?;
    let mut hasher = Md5::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf).map_err(open)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let got: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if got != expected {
        return Err(Error::invalid_arg(format!(
            "Mismatched MD5 hash for file {file}, expect: {expected}, got: {got}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_core::config::parse_pbtxt;

    fn config(agents: &str) -> ModelConfig {
        parse_pbtxt(&format!(
            r#"name: "m" backend: "identity" model_repository_agents {{ agents [ {agents} ] }}"#
        ))
        .unwrap()
    }

    fn folder() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("1")).unwrap();
        std::fs::write(dir.path().join("1/model.onnx"), b"hello").unwrap();
        dir
    }

    #[test]
    fn a_matching_md5_loads_and_a_mismatch_fails_with_triton_s_message() {
        let dir = folder();
        // md5("hello")
        let good = r#"{ name: "checksum" parameters { key: "MD5:1/model.onnx" value: "5d41402abc4b2a76b9719d911017c592" } }"#;
        run(&config(good), dir.path(), None).unwrap();
        let bad = r#"{ name: "checksum" parameters { key: "md5:1/model.onnx" value: "00" } }"#;
        let e = run(&config(bad), dir.path(), None).unwrap_err();
        assert_eq!(
            e.message,
            "model 'm': Mismatched MD5 hash for file 1/model.onnx, expect: 00, \
             got: 5d41402abc4b2a76b9719d911017c592"
        );
        assert_eq!(e.code, tern_core::error::Code::InvalidArg);
    }

    #[test]
    fn bad_keys_missing_files_escapes_and_unknown_agents_fail() {
        let dir = folder();
        let cases = [
            (
                r#"{ name: "checksum" parameters { key: "1/model.onnx" value: "x" } }"#,
                "failed to parse key: 1/model.onnx",
            ),
            (
                r#"{ name: "checksum" parameters { key: "SHA1:1/model.onnx" value: "x" } }"#,
                "Unsupported checksum algorithm: SHA1",
            ),
            (
                r#"{ name: "checksum" parameters { key: "MD5:1/absent" value: "x" } }"#,
                "failed to open text file for read 1/absent: ",
            ),
            (
                r#"{ name: "checksum" parameters { key: "MD5:../../etc/passwd" value: "x" } }"#,
                "checksum agent",
            ),
            (
                r#"{ name: "checksum" parameters { key: "MD5:1" value: "x" } }"#,
                "checksum agent",
            ),
            (
                r#"{ name: "decrypt" }"#,
                "decrypt agent: name where the key is with exactly one parameter",
            ),
            (
                r#"{ name: "unzip" }"#,
                "repository agent 'unzip' is not available",
            ),
        ];
        for (agents, want) in cases {
            let e = run(&config(agents), dir.path(), None).unwrap_err();
            assert!(e.message.contains(want), "{agents}: {e}");
        }
    }

    #[test]
    fn the_gate_checks_each_read_against_the_manifest_and_decrypts() {
        let dir = folder();
        let key_hex = decrypt::generate_hex().unwrap();
        let key = decrypt::Key::from_hex(&key_hex, "test").unwrap();
        std::fs::write(
            dir.path().join("1/model.onnx"),
            key.encrypt(b"plain").unwrap(),
        )
        .unwrap();
        std::fs::write(dir.path().join("k"), &key_hex).unwrap();
        let signer = super::super::manifest::generate().unwrap();
        let root = dir.path().canonicalize().unwrap();
        // The folder's name is the model's.
        let name = super::super::manifest::model_name(&root).unwrap();
        let cfg = parse_pbtxt(&format!(
            r#"name: "{name}" model_repository_agents {{ agents [ {{ name: "decrypt" parameters {{ key: "key_file" value: "{}" }} }} ] }}"#,
            root.join("k").display()
        ))
        .unwrap();
        super::super::manifest::sign(&root, &signer).unwrap();
        let signed =
            super::super::manifest::verify(&root, &name, &[signer.verifying_key()]).unwrap();
        let gate = run(&cfg, &root, Some(signed)).unwrap();
        assert!(gate.sealed() && gate.checked());
        assert_eq!(gate.read(&root.join("1/model.onnx")).unwrap(), b"plain");
        // Replaced after the load's first check: refused as it is read.
        std::fs::write(root.join("1/model.onnx"), key.encrypt(b"plain").unwrap()).unwrap();
        let e = gate.read(&root.join("1/model.onnx")).unwrap_err();
        assert!(
            e.message.contains("does not match the signed manifest"),
            "{e}"
        );
        let e = gate.read(Path::new("/etc/hostname")).unwrap_err();
        assert!(e.message.contains("is not in the model folder"), "{e}");
        // Without agents or a signature: plain reads.
        assert!(!run(&config(""), &root, None).unwrap().checked());
    }
}
