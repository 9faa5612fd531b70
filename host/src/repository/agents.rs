//! Repository agents (`model_repository_agents` in `config.pbtxt`), run on
//! every load before the backend sees the model's files. Built in:
//! Triton's `checksum` agent (`MD5:<path relative to the model folder>` →
//! expected hex digest; a mismatch fails the load with Triton's message).
//! Any other agent name fails the load: serving a model without the action
//! its config asks for (decryption, say) would serve it wrongly.

use std::io::Read;
use std::path::Path;

use md5::{Digest, Md5};
use tern_core::config::ModelConfig;
use tern_core::error::{Error, Result};

/// Runs the config's agents on the model folder `dir`.
pub fn run(cfg: &ModelConfig, dir: &Path) -> Result<()> {
    let Some(agents) = cfg.model_repository_agents.as_ref() else {
        return Ok(());
    };
    for agent in &agents.agents {
        match agent.name.as_str() {
            "checksum" => {
                // Sorted: the first failure is the same on every load.
                let mut params: Vec<_> = agent.parameters.iter().collect();
                params.sort();
                for (key, expected) in params {
                    checksum(dir, key, expected).map_err(|e| e.for_model(&cfg.name))?;
                }
            }
            other => {
                return Err(Error::unsupported(format!(
                    "repository agent '{other}' is not available: Tern has the 'checksum' agent \
                     built in and loads no agent libraries"
                ))
                .for_model(&cfg.name))
            }
        }
    }
    Ok(())
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
        run(&config(good), dir.path()).unwrap();
        let bad = r#"{ name: "checksum" parameters { key: "md5:1/model.onnx" value: "00" } }"#;
        let e = run(&config(bad), dir.path()).unwrap_err();
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
                "repository agent 'decrypt' is not available",
            ),
        ];
        for (agents, want) in cases {
            let e = run(&config(agents), dir.path()).unwrap_err();
            assert!(e.message.contains(want), "{agents}: {e}");
        }
    }
}
