//! Secrets at rest and gateway keys: ChaCha20-Poly1305 (RustCrypto) with a 32-byte master key,
//! keys from the OS RNG, SHA-256 key hashes. Nothing here is hand-rolled.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use sha2::{Digest, Sha256};
use std::path::Path;
use subtle::ConstantTimeEq;

const NONCE_LEN: usize = 12;

/// The AEAD key that seals stored secrets.
#[derive(Clone)]
pub struct MasterKey(ChaCha20Poly1305);

impl MasterKey {
    pub fn from_bytes(bytes: &[u8]) -> Result<MasterKey, String> {
        if bytes.len() != 32 {
            return Err(format!("the master key must be 32 bytes, got {}", bytes.len()));
        }
        Ok(MasterKey(ChaCha20Poly1305::new(Key::from_slice(bytes))))
    }

    /// From base64 text (`GATEWAY_MASTER_KEY`, `master.key`).
    pub fn from_base64(text: &str) -> Result<MasterKey, String> {
        let bytes = B64.decode(text.trim()).map_err(|_| "the master key is not valid base64".to_string())?;
        MasterKey::from_bytes(&bytes)
    }

    /// `GATEWAY_MASTER_KEY` when set, else `<state>/master.key`, generated (mode 0600) when absent.
    pub fn load(env: Option<&str>, state_dir: &Path) -> Result<MasterKey, String> {
        if let Some(text) = env {
            return MasterKey::from_base64(text);
        }
        let path = state_dir.join("master.key");
        match std::fs::read_to_string(&path) {
            Ok(text) => MasterKey::from_base64(&text).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let text = B64.encode(random::<32>()?);
                write_private(&path, &text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                MasterKey::from_base64(&text)
            }
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    }

    /// base64(nonce || ciphertext-and-tag).
    pub fn seal(&self, plain: &[u8]) -> Result<String, String> {
        let nonce = random::<NONCE_LEN>()?;
        let sealed = self.0.encrypt(Nonce::from_slice(&nonce), plain).map_err(|_| "encryption failed".to_string())?;
        let mut out = nonce.to_vec();
        out.extend(sealed);
        Ok(B64.encode(out))
    }

    pub fn open(&self, sealed: &str) -> Result<Vec<u8>, String> {
        let bytes = B64.decode(sealed).map_err(|_| "a sealed value is not base64".to_string())?;
        if bytes.len() < NONCE_LEN {
            return Err("a sealed value is too short".to_string());
        }
        let (nonce, body) = bytes.split_at(NONCE_LEN);
        self.0
            .decrypt(Nonce::from_slice(nonce), body)
            .map_err(|_| "a sealed value does not open with this master key".to_string())
    }
}

fn random<const N: usize>() -> Result<[u8; N], String> {
    let mut bytes = [0u8; N];
    getrandom::getrandom(&mut bytes).map_err(|e| format!("the OS random generator failed: {e}"))?;
    Ok(bytes)
}

#[cfg(unix)]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(text.as_bytes())
}

#[cfg(not(unix))]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)
}

/// A new gateway key: `gw-` and 32 lowercase hex digits from the OS RNG.
pub fn new_api_key() -> Result<String, String> {
    Ok(format!("gw-{}", hex(&random::<16>()?)))
}

/// A new secret token (a console session's id, its CSRF token): 32 bytes from the OS RNG, in
/// lowercase hex.
pub fn new_token() -> Result<String, String> {
    Ok(hex(&random::<32>()?))
}

/// Lowercase hex SHA-256 of the whole key string: the only form a key is stored in.
pub fn key_hash(key: &str) -> String {
    hex(&Sha256::digest(key.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares without an early exit (subtle), so the time says nothing about where two keys differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_open_round_trip_and_tamper() {
        let key = MasterKey::from_bytes(&[7u8; 32]).unwrap();
        let sealed = key.seal(b"sk-secret").unwrap();
        assert_ne!(sealed, key.seal(b"sk-secret").unwrap(), "a fresh nonce each time");
        assert_eq!(key.open(&sealed).unwrap(), b"sk-secret");
        let other = MasterKey::from_bytes(&[8u8; 32]).unwrap();
        assert!(other.open(&sealed).is_err());
        let mut bytes = B64.decode(&sealed).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert!(key.open(&B64.encode(bytes)).is_err());
        assert!(MasterKey::from_bytes(&[0u8; 16]).is_err());
        assert!(MasterKey::from_base64("not base64!").is_err());
    }

    #[test]
    fn master_key_file_is_generated_once_private() {
        let dir = std::env::temp_dir().join(format!("cp-key-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = MasterKey::load(None, &dir).unwrap();
        let b = MasterKey::load(None, &dir).unwrap();
        assert_eq!(b.open(&a.seal(b"x").unwrap()).unwrap(), b"x");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join("master.key")).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn keys_and_hashes() {
        let key = new_api_key().unwrap();
        assert_eq!(key.len(), 35);
        assert!(key.starts_with("gw-") && key[3..].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_ne!(key, new_api_key().unwrap());
        // sha256("abc")
        assert_eq!(key_hash("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
