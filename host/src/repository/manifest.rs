//! Signed model folders. `tern model sign` writes, into a model's folder, a
//! manifest of every file in it (path, size, SHA-256) and the manifest's
//! Ed25519 signature; a server started with `--model-trust-key` loads a
//! model only when its manifest verifies with one of the keys, the model's
//! name is the manifest's, and the folder holds exactly the files listed with
//! those hashes. The check runs before the config is read, and the files a
//! backend loads are checked again as it reads them (the `Gate` of `agents.rs`),
//! so a file replaced after the check is refused too.
//!
//! Keys are PEM: the signing key PKCS#8, the trust key SPKI (what
//! `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` write);
//! the signature file holds the 64 raw signature bytes (what `openssl pkeyutl
//! -sign -rawin` writes), so a manifest can be signed or checked with
//! OpenSSL as well.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tern_core::error::{Error, Result};

/// The manifest's file name in a model folder.
pub const MANIFEST: &str = "tern-manifest.json";
/// The signature's file name in a model folder (64 raw Ed25519 bytes).
pub const SIGNATURE: &str = "tern-manifest.sig";
/// The manifest format this build writes and reads.
pub const FORMAT: &str = "tern-model-manifest/1";

/// What a signature covers: the model's name and each of its files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// The model's name (its folder's name).
    pub model: String,
    /// Every file below the model folder but the manifest and signature, by
    /// path relative to it (`/`-separated).
    pub files: BTreeMap<String, FileEntry>,
}

/// One file of a signed model.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileEntry {
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, lower-case hex.
    pub sha256: String,
}

impl FileEntry {
    /// Checks `bytes` (the file `relative` as read) against the entry.
    pub fn check(&self, relative: &str, bytes: &[u8]) -> Result<()> {
        let got = hex(&Sha256::digest(bytes));
        if bytes.len() as u64 != self.size || got != self.sha256 {
            return Err(mismatch(relative, &self.sha256, &got));
        }
        Ok(())
    }
}

fn mismatch(relative: &str, expected: &str, got: &str) -> Error {
    Error::invalid_arg(format!(
        "file '{relative}' does not match the signed manifest (sha256 expected {expected}, got {got})"
    ))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks `bytes`, read from `path` in the model folder `dir`, against the
/// signed manifest's `files` (no manifest: nothing to check).
pub fn check_read(
    files: Option<&BTreeMap<String, FileEntry>>,
    dir: &Path,
    path: &Path,
    bytes: &[u8],
) -> Result<()> {
    let Some(files) = files else {
        return Ok(());
    };
    let relative = path
        .strip_prefix(dir)
        .ok()
        .and_then(|p| p.to_str())
        .unwrap_or_default();
    match files.get(relative) {
        Some(entry) => entry.check(relative, bytes),
        None => Err(Error::invalid_arg(format!(
            "file '{relative}' is not in the signed manifest"
        ))),
    }
}

/// The SHA-256 and size of the file at `path`, read as a stream.
fn hash_file(path: &Path) -> Result<(String, u64)> {
    let cannot =
        |e: std::io::Error| Error::invalid_arg(format!("cannot read '{}': {e}", path.display()));
    let mut f = std::fs::File::open(path).map_err(cannot)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(cannot)?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok((hex(&hasher.finalize()), size))
}

/// The files below `dir` (relative `/`-separated path → real path), without
/// the manifest and signature. Links are followed only where they stay in
/// the folder; anything but regular files and folders is refused.
fn files_of(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let mut found = BTreeMap::new();
    let mut pending = vec![(String::new(), dir.to_path_buf())];
    while let Some((prefix, folder)) = pending.pop() {
        let entries = std::fs::read_dir(&folder)
            .map_err(|e| Error::invalid_arg(format!("cannot list '{}': {e}", folder.display())))?;
        for entry in entries {
            let entry = entry.map_err(|e| {
                Error::invalid_arg(format!("cannot list '{}': {e}", folder.display()))
            })?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                return Err(Error::invalid_arg(format!(
                    "'{}': a signed model's file names must be UTF-8",
                    entry.path().display()
                )));
            };
            let relative = format!("{prefix}{name}");
            if relative == MANIFEST || relative == SIGNATURE {
                continue;
            }
            let path = entry.path();
            let link = entry.file_type().is_ok_and(|t| t.is_symlink());
            let real = if link {
                let real = path
                    .canonicalize()
                    .map_err(|e| Error::invalid_arg(format!("'{}': {e}", path.display())))?;
                let root = dir
                    .canonicalize()
                    .map_err(|e| Error::invalid_arg(format!("'{}': {e}", dir.display())))?;
                if !real.starts_with(&root) {
                    return Err(Error::invalid_arg(format!(
                        "file '{relative}' of a signed model links out of the model folder"
                    )));
                }
                real
            } else {
                path
            };
            let meta = std::fs::metadata(&real)
                .map_err(|e| Error::invalid_arg(format!("'{}': {e}", real.display())))?;
            if meta.is_dir() && link {
                // A link to a folder could lead back to where it is (a loop).
                return Err(Error::invalid_arg(format!(
                    "'{relative}' of a signed model is a link to a folder: only links to files \
                     are followed"
                )));
            }
            if meta.is_dir() {
                pending.push((format!("{relative}/"), real));
            } else if meta.is_file() {
                found.insert(relative, real);
            } else {
                return Err(Error::invalid_arg(format!(
                    "file '{relative}' of a signed model is not a regular file"
                )));
            }
        }
    }
    Ok(found)
}

/// The manifest of the model `model` in `dir` as its files are now.
pub fn build(dir: &Path, model: &str) -> Result<Manifest> {
    let mut files = BTreeMap::new();
    for (relative, path) in files_of(dir)? {
        let (sha256, size) = hash_file(&path)?;
        files.insert(relative, FileEntry { size, sha256 });
    }
    Ok(Manifest {
        format: FORMAT.into(),
        model: model.into(),
        files,
    })
}

/// Signs the model folder `dir` (the model's name is the folder's): writes
/// the manifest and its signature, each written whole then renamed into
/// place. Returns the manifest.
pub fn sign(dir: &Path, key: &SigningKey) -> Result<Manifest> {
    let model = model_name(dir)?;
    let manifest = build(dir, &model)?;
    let mut text = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| Error::internal(format!("cannot write the manifest: {e}")))?;
    text.push(b'\n');
    let signature = key.sign(&text);
    write_whole(&dir.join(MANIFEST), &text)?;
    write_whole(&dir.join(SIGNATURE), &signature.to_bytes())?;
    Ok(manifest)
}

/// The model name a folder gives (its last component).
pub fn model_name(dir: &Path) -> Result<String> {
    let real = dir
        .canonicalize()
        .map_err(|e| Error::invalid_arg(format!("'{}': {e}", dir.display())))?;
    real.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| Error::invalid_arg(format!("'{}' names no model folder", dir.display())))
}

/// Writes `bytes` to `path` through a temporary file in the same folder,
/// synced before it is renamed over `path`: a reader sees the old file or
/// the new one, never part of one.
pub fn write_whole(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let fail =
        |e: std::io::Error| Error::invalid_arg(format!("cannot write '{}': {e}", path.display()));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(fail)?;
    tmp.write_all(bytes).map_err(fail)?;
    tmp.as_file().sync_all().map_err(fail)?;
    tmp.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

/// Checks the model folder `dir` of model `model` against its signed
/// manifest: the signature verifies with one of `keys`, the manifest names
/// this model, and the folder holds exactly its files with their hashes.
/// Returns the manifest, for checking files again as they are loaded.
pub fn verify(dir: &Path, model: &str, keys: &[VerifyingKey]) -> Result<Manifest> {
    let manifest_path = dir.join(MANIFEST);
    let text = match std::fs::read(&manifest_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::invalid_arg(format!(
                "the model is not signed: '{}' does not exist, and this server loads only signed \
                 models (--model-trust-key); sign it with `tern model sign`",
                manifest_path.display()
            )))
        }
        Err(e) => {
            return Err(Error::invalid_arg(format!(
                "cannot read '{}': {e}",
                manifest_path.display()
            )))
        }
    };
    let sig_path = dir.join(SIGNATURE);
    let sig = std::fs::read(&sig_path).map_err(|e| {
        Error::invalid_arg(format!(
            "the model's manifest has no signature: cannot read '{}': {e}",
            sig_path.display()
        ))
    })?;
    let signature = Signature::from_slice(&sig).map_err(|_| {
        Error::invalid_arg(format!(
            "'{}' is not an Ed25519 signature (64 bytes, got {})",
            sig_path.display(),
            sig.len()
        ))
    })?;
    if !keys.iter().any(|k| k.verify(&text, &signature).is_ok()) {
        return Err(Error::invalid_arg(format!(
            "the signature of '{}' does not verify with any --model-trust-key: the manifest was \
             changed after it was signed, or signed with another key",
            manifest_path.display()
        )));
    }
    let manifest: Manifest = serde_json::from_slice(&text)
        .map_err(|e| Error::invalid_arg(format!("'{}': {e}", manifest_path.display())))?;
    if manifest.format != FORMAT {
        return Err(Error::unsupported(format!(
            "'{}' is in format '{}'; this server reads '{FORMAT}'",
            manifest_path.display(),
            manifest.format
        )));
    }
    if manifest.model != model {
        return Err(Error::invalid_arg(format!(
            "the signed manifest is for model '{}', not '{model}'",
            manifest.model
        )));
    }
    let present = files_of(dir)?;
    if let Some(extra) = present.keys().find(|f| !manifest.files.contains_key(*f)) {
        return Err(Error::invalid_arg(format!(
            "file '{extra}' is not in the signed manifest"
        )));
    }
    for (relative, entry) in &manifest.files {
        let Some(path) = present.get(relative) else {
            return Err(Error::invalid_arg(format!(
                "file '{relative}' is in the signed manifest but not in the model folder"
            )));
        };
        let (got, size) = hash_file(path)?;
        if got != entry.sha256 || size != entry.size {
            return Err(mismatch(relative, &entry.sha256, &got));
        }
    }
    Ok(manifest)
}

/// A new signing key (from the operating system's random source).
pub fn generate() -> Result<SigningKey> {
    let mut seed = [0u8; 32];
    getrandom02::getrandom(&mut seed)
        .map_err(|e| Error::internal(format!("no random bytes for a key: {e}")))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// The private key as PKCS#8 PEM and the public key as SPKI PEM.
pub fn to_pem(key: &SigningKey) -> Result<(String, String)> {
    let fail = |e: String| Error::internal(format!("cannot encode the key: {e}"));
    let private = key
        .to_pkcs8_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
        .map_err(|e| fail(e.to_string()))?;
    let public = key
        .verifying_key()
        .to_public_key_pem(ed25519_dalek::pkcs8::spki::der::pem::LineEnding::LF)
        .map_err(|e| fail(e.to_string()))?;
    Ok((private.to_string(), public))
}

/// Reads a signing key (PKCS#8 PEM) from `path`.
pub fn read_signing_key(path: &Path) -> Result<SigningKey> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::invalid_arg(format!("cannot read '{}': {e}", path.display())))?;
    SigningKey::from_pkcs8_pem(&text).map_err(|e| {
        Error::invalid_arg(format!(
            "'{}' is not an Ed25519 private key in PKCS#8 PEM: {e}",
            path.display()
        ))
    })
}

/// Reads a trust key (an Ed25519 public key, SPKI PEM) from `path`.
pub fn read_trust_key(path: &Path) -> Result<VerifyingKey> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::invalid_arg(format!("cannot read '{}': {e}", path.display())))?;
    VerifyingKey::from_public_key_pem(&text).map_err(|e| {
        Error::invalid_arg(format!(
            "'{}' is not an Ed25519 public key in PEM (-----BEGIN PUBLIC KEY-----): {e}",
            path.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(root: &Path) -> PathBuf {
        let dir = root.join("m");
        std::fs::create_dir_all(dir.join("1")).unwrap();
        std::fs::write(dir.join("config.pbtxt"), "backend: \"identity\"").unwrap();
        std::fs::write(dir.join("1/model.bin"), b"weights").unwrap();
        dir
    }

    #[test]
    fn a_signed_folder_verifies_and_every_change_is_refused_by_name() {
        let root = tempfile::tempdir().unwrap();
        let dir = model(root.path());
        let key = generate().unwrap();
        let trusted = [key.verifying_key()];
        let signed = sign(&dir, &key).unwrap();
        assert_eq!(signed.files.len(), 2);
        assert_eq!(verify(&dir, "m", &trusted).unwrap(), signed);

        let e = verify(&dir, "other", &trusted).unwrap_err();
        assert!(e.message.contains("is for model 'm', not 'other'"), "{e}");
        let stranger = generate().unwrap();
        let e = verify(&dir, "m", &[stranger.verifying_key()]).unwrap_err();
        assert!(
            e.message
                .contains("does not verify with any --model-trust-key"),
            "{e}"
        );

        std::fs::write(dir.join("1/model.bin"), b"weightz").unwrap();
        let e = verify(&dir, "m", &trusted).unwrap_err();
        assert!(
            e.message
                .contains("file '1/model.bin' does not match the signed manifest"),
            "{e}"
        );
        std::fs::write(dir.join("1/model.bin"), b"weights").unwrap();

        std::fs::create_dir(dir.join("2")).unwrap();
        std::fs::write(dir.join("2/model.bin"), b"new").unwrap();
        let e = verify(&dir, "m", &trusted).unwrap_err();
        assert!(
            e.message
                .contains("file '2/model.bin' is not in the signed manifest"),
            "{e}"
        );
        std::fs::remove_dir_all(dir.join("2")).unwrap();

        std::fs::remove_file(dir.join("1/model.bin")).unwrap();
        let e = verify(&dir, "m", &trusted).unwrap_err();
        assert!(
            e.message
                .contains("'1/model.bin' is in the signed manifest but not"),
            "{e}"
        );
        std::fs::write(dir.join("1/model.bin"), b"weights").unwrap();
        assert!(verify(&dir, "m", &trusted).is_ok());

        // The manifest itself edited (a hash swapped for the tampered file's).
        let text = std::fs::read_to_string(dir.join(MANIFEST)).unwrap();
        std::fs::write(
            dir.join(MANIFEST),
            text.replace("\"size\": 7", "\"size\": 8"),
        )
        .unwrap();
        let e = verify(&dir, "m", &trusted).unwrap_err();
        assert!(e.message.contains("does not verify"), "{e}");

        std::fs::remove_file(dir.join(MANIFEST)).unwrap();
        let e = verify(&dir, "m", &trusted).unwrap_err();
        assert!(e.message.contains("the model is not signed"), "{e}");
    }

    #[test]
    fn a_link_to_a_folder_is_refused_not_walked() {
        let root = tempfile::tempdir().unwrap();
        let dir = model(root.path());
        std::os::unix::fs::symlink(".", dir.join("1/loop")).unwrap();
        let e = sign(&dir, &generate().unwrap()).unwrap_err();
        assert!(
            e.message
                .contains("'1/loop' of a signed model is a link to a folder"),
            "{e}"
        );
        std::fs::remove_file(dir.join("1/loop")).unwrap();
        // A link to a file in the folder is followed.
        std::os::unix::fs::symlink("model.bin", dir.join("1/alias.bin")).unwrap();
        let signed = sign(&dir, &generate().unwrap()).unwrap();
        assert_eq!(signed.files["1/alias.bin"], signed.files["1/model.bin"]);
    }

    #[test]
    fn keys_round_trip_through_pem() {
        let dir = tempfile::tempdir().unwrap();
        let key = generate().unwrap();
        let (private, public) = to_pem(&key).unwrap();
        assert!(private.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(public.starts_with("-----BEGIN PUBLIC KEY-----"));
        std::fs::write(dir.path().join("k"), &private).unwrap();
        std::fs::write(dir.path().join("k.pub"), &public).unwrap();
        let back = read_signing_key(&dir.path().join("k")).unwrap();
        assert_eq!(back.to_bytes(), key.to_bytes());
        assert_eq!(
            read_trust_key(&dir.path().join("k.pub")).unwrap(),
            key.verifying_key()
        );
        let e = read_trust_key(&dir.path().join("k")).unwrap_err();
        assert!(e.message.contains("is not an Ed25519 public key"), "{e}");
    }

    #[test]
    fn a_file_read_later_is_checked_against_its_entry() {
        let entry = FileEntry {
            size: 2,
            sha256: hex(&Sha256::digest(b"ok")),
        };
        assert!(entry.check("1/f", b"ok").is_ok());
        let e = entry.check("1/f", b"no").unwrap_err();
        assert!(e.message.contains("file '1/f' does not match"), "{e}");
    }
}
