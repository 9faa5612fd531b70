//! Encrypted model files: the `decrypt` repository agent's keys and cipher.
//! A file `tern model encrypt` wrote is `TERNENC1`, a 12-byte nonce, then the
//! AES-256-GCM ciphertext and tag of the original bytes. Files are decrypted
//! in memory as the backend reads them (through the `Gate` of `agents.rs`); the
//! plaintext is never written to disk. The key is 32 bytes written as 64
//! hex digits, found where the agent's parameters say: `key_file` (a path),
//! `key_env` (an environment variable) or `key_credential` (a systemd
//! credential, `$CREDENTIALS_DIRECTORY/<name>`).

use std::collections::BTreeMap;
use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use tern_core::error::{Error, Result};

/// The first bytes of an encrypted file.
pub const MAGIC: &[u8; 8] = b"TERNENC1";
const NONCE: usize = 12;

/// A model's decryption key.
#[derive(Clone)]
pub struct Key {
    cipher: Aes256Gcm,
    /// Where it came from, for errors.
    source: String,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.source)
    }
}

impl Key {
    /// A key from its 64 hex digits (surrounding white space ignored).
    pub fn from_hex(text: &str, source: &str) -> Result<Key> {
        let text = text.trim();
        let bytes: Option<Vec<u8>> = (text.len() == 64
            && text.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| {
            (0..32)
                .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok())
                .collect()
        })
        .flatten();
        let Some(bytes) = bytes else {
            return Err(Error::invalid_arg(format!(
                "decrypt agent: {source}: a decryption key is 32 bytes written as 64 hex digits"
            )));
        };
        let cipher = Aes256Gcm::new_from_slice(&bytes)
            .map_err(|_| Error::internal("an AES-256 key is 32 bytes"))?;
        Ok(Key {
            cipher,
            source: source.into(),
        })
    }

    /// The key the `decrypt` agent's parameters point at: exactly one of
    /// `key_file`, `key_env`, `key_credential`.
    pub fn from_parameters(params: &BTreeMap<String, String>) -> Result<Key> {
        if let Some(unknown) = params
            .keys()
            .find(|k| !["key_file", "key_env", "key_credential"].contains(&k.as_str()))
        {
            return Err(Error::invalid_arg(format!(
                "decrypt agent: unknown parameter '{unknown}' (expected one of key_file, key_env, \
                 key_credential)"
            )));
        }
        if params.len() != 1 {
            return Err(Error::invalid_arg(
                "decrypt agent: name where the key is with exactly one parameter: key_file, \
                 key_env or key_credential",
            ));
        }
        let (kind, value) = params.iter().next().expect("one parameter");
        match kind.as_str() {
            "key_file" => Self::from_file(Path::new(value), &format!("key_file '{value}'")),
            "key_env" => {
                let source = format!("key_env '{value}'");
                let text = std::env::var(value).map_err(|_| {
                    Error::invalid_arg(format!(
                        "decrypt agent: {source}: the environment variable is not set"
                    ))
                })?;
                Self::from_hex(&text, &source)
            }
            _ => {
                let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY") else {
                    return Err(Error::invalid_arg(format!(
                        "decrypt agent: key_credential '{value}': $CREDENTIALS_DIRECTORY is not \
                         set (systemd sets it for a unit with LoadCredential= or \
                         LoadCredentialEncrypted=)"
                    )));
                };
                if value.contains('/') || value.is_empty() || value == ".." {
                    return Err(Error::invalid_arg(format!(
                        "decrypt agent: key_credential '{value}' is not a credential name"
                    )));
                }
                Self::from_file(
                    &Path::new(&dir).join(value),
                    &format!("key_credential '{value}'"),
                )
            }
        }
    }

    /// A key from a file holding its hex digits.
    pub fn from_file(path: &Path, source: &str) -> Result<Key> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::invalid_arg(format!(
                "decrypt agent: {source}: cannot read '{}': {e}",
                path.display()
            ))
        })?;
        Self::from_hex(&text, source)
    }

    /// The plaintext of the encrypted file `relative` whose bytes are `data`.
    pub fn decrypt(&self, relative: &str, data: &[u8]) -> Result<Vec<u8>> {
        if is_encrypted(data) && data.len() < MAGIC.len() + NONCE + 16 {
            return Err(Error::invalid_arg(format!(
                "file '{relative}' is cut short ({} bytes, less than an encrypted file's header \
                 and tag)",
                data.len()
            )));
        }
        if !is_encrypted(data) {
            return Err(Error::invalid_arg(format!(
                "file '{relative}' is not encrypted (no {} header), but the model's config names \
                 the 'decrypt' repository agent; encrypt it with `tern model encrypt`",
                String::from_utf8_lossy(MAGIC)
            )));
        }
        let (nonce, body) = data[MAGIC.len()..].split_at(NONCE);
        self.cipher
            .decrypt(Nonce::from_slice(nonce), body)
            .map_err(|_| {
                Error::invalid_arg(format!(
                    "file '{relative}' does not decrypt with the key from {}: another key \
                     encrypted it, or the file was changed",
                    self.source
                ))
            })
    }

    /// `plain` encrypted under a fresh random nonce, with the header.
    pub fn encrypt(&self, plain: &[u8]) -> Result<Vec<u8>> {
        let mut nonce = [0u8; NONCE];
        getrandom02::getrandom(&mut nonce)
            .map_err(|e| Error::internal(format!("no random bytes for a nonce: {e}")))?;
        let body = self
            .cipher
            .encrypt(Nonce::from_slice(&nonce), plain)
            .map_err(|_| Error::internal("the file is too large to encrypt"))?;
        let mut out = Vec::with_capacity(MAGIC.len() + NONCE + body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&body);
        Ok(out)
    }
}

/// Whether `data` starts as an encrypted file does.
pub fn is_encrypted(data: &[u8]) -> bool {
    data.starts_with(MAGIC)
}

/// A new key's 64 hex digits (from the operating system's random source).
pub fn generate_hex() -> Result<String> {
    let mut key = [0u8; 32];
    getrandom02::getrandom(&mut key)
        .map_err(|e| Error::internal(format!("no random bytes for a key: {e}")))?;
    Ok(key.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn encrypted_bytes_decrypt_only_with_their_key_and_unchanged() {
        let key = Key::from_hex(&generate_hex().unwrap(), "test").unwrap();
        let sealed = key.encrypt(b"model bytes").unwrap();
        assert!(is_encrypted(&sealed));
        assert_eq!(key.decrypt("1/m", &sealed).unwrap(), b"model bytes");
        // A fresh nonce each time.
        assert_ne!(key.encrypt(b"model bytes").unwrap(), sealed);

        let other = Key::from_hex(&generate_hex().unwrap(), "other").unwrap();
        let e = other.decrypt("1/m", &sealed).unwrap_err();
        assert!(
            e.message
                .contains("does not decrypt with the key from other"),
            "{e}"
        );
        let mut flipped = sealed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(key.decrypt("1/m", &flipped).is_err());
        let e = key.decrypt("1/m", b"plain onnx").unwrap_err();
        assert!(e.message.contains("file '1/m' is not encrypted"), "{e}");
    }

    #[test]
    fn the_key_comes_from_one_named_place() {
        let dir = tempfile::tempdir().unwrap();
        let hex = generate_hex().unwrap();
        let file = dir.path().join("k");
        std::fs::write(&file, format!("{hex}\n")).unwrap();
        let key = Key::from_parameters(&params(&[("key_file", file.to_str().unwrap())])).unwrap();
        let sealed = key.encrypt(b"x").unwrap();

        std::env::set_var("TERN_TEST_DECRYPT_KEY", &hex);
        let from_env = Key::from_parameters(&params(&[("key_env", "TERN_TEST_DECRYPT_KEY")]));
        assert_eq!(from_env.unwrap().decrypt("f", &sealed).unwrap(), b"x");

        let e = Key::from_parameters(&params(&[("key_env", "TERN_TEST_NO_SUCH_VAR")])).unwrap_err();
        assert!(e.message.contains("environment variable is not set"), "{e}");
        let e = Key::from_parameters(&params(&[])).unwrap_err();
        assert!(e.message.contains("exactly one parameter"), "{e}");
        let e = Key::from_parameters(&params(&[("key", "x")])).unwrap_err();
        assert!(e.message.contains("unknown parameter 'key'"), "{e}");
        let e = Key::from_parameters(&params(&[("key_credential", "../k")])).unwrap_err();
        assert!(
            e.message.contains("CREDENTIALS_DIRECTORY")
                || e.message.contains("not a credential name"),
            "{e}"
        );
        let e = Key::from_hex("abcd", "short").unwrap_err();
        assert!(e.message.contains("64 hex digits"), "{e}");
        // Not ASCII, or not hex, at the right length: refused, never a panic.
        let e = Key::from_hex(&format!("\u{feff}{}", &hex[3..]), "bom").unwrap_err();
        assert!(e.message.contains("64 hex digits"), "{e}");
        let e = Key::from_hex(&format!("+f{}", &hex[2..]), "sign").unwrap_err();
        assert!(e.message.contains("64 hex digits"), "{e}");
    }
}
