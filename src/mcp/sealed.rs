//! The servers' sessions sealed inside the client's session id on the aggregate endpoint
//! (docs/mcp.md): at `initialize` the gateway opens a session with every server and answers an
//! `Mcp-Session-Id` that holds them, encrypted and authenticated (ChaCha20-Poly1305) under the
//! session key and bound to the caller. Any worker, and any replica with the same key, reads
//! the sessions back from the id itself: no shared state.

use super::aggregate::Session;
use crate::ports::{Host, SharedStore};
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use serde::{Deserialize, Deserializer};

/// Marks a sealed session id (and its format's version).
const PREFIX: &str = "gw1.";
const NONCE_BYTES: usize = 12;
/// The most of the sessions' text an id seals: the id is then at most ~5.5 KB, within
/// [`super::aggregate::MAX_SESSION_ID`] and far within Envoy's 60 KiB of request headers.
const MAX_SEALED: usize = 4096;
/// Where a key of this Envoy's own is kept when the configuration names none.
const OWN_KEY_SLOT: &str = "mcp:session-key";

/// The key that seals session ids: `mcp_session_key` (32 bytes, base64), the same on every
/// replica; never printed.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SessionKey([u8; 32]);

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

impl SessionKey {
    #[cfg(any(test, fuzzing))]
    pub(crate) fn of(bytes: [u8; 32]) -> SessionKey {
        SessionKey(bytes)
    }

    fn parse(text: &str) -> Result<SessionKey, String> {
        let bytes = base64::engine::general_purpose::STANDARD.decode(text.trim()).ok();
        match bytes.and_then(|bytes| <[u8; 32]>::try_from(bytes).ok()) {
            Some(bytes) => Ok(SessionKey(bytes)),
            None => Err("mcp_session_key: must be 32 bytes in base64 (e.g. `openssl rand -base64 32`)".to_string()),
        }
    }

    /// The configured key, else this Envoy's own: made once from the host's randomness and kept
    /// in shared data, so its workers share it (another replica cannot read its ids: the
    /// client's sessions there are opened again).
    pub(crate) fn or_own(configured: Option<&SessionKey>, host: &mut dyn Host) -> SessionKey {
        if let Some(key) = configured {
            return key.clone();
        }
        if let Some(key) = own_key(host.store()) {
            return key;
        }
        let bytes = random_bytes(host);
        host.store().set(OWN_KEY_SLOT, &bytes, 0);
        // Two workers may make one at once: the one kept is the one every worker uses.
        own_key(host.store()).unwrap_or(SessionKey(bytes))
    }
}

fn own_key(store: &dyn SharedStore) -> Option<SessionKey> {
    let (bytes, _) = store.get(OWN_KEY_SLOT)?;
    bytes.try_into().ok().map(SessionKey)
}

/// Reads `mcp_session_key` of the plugin configuration.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<SessionKey>, D::Error> {
    let text = Option::<String>::deserialize(deserializer)?;
    text.map(|text| SessionKey::parse(&text)).transpose().map_err(serde::de::Error::custom)
}

/// The client's session id holding `sessions` (server id, session) of `caller`; `nonce` fresh
/// randomness.
pub(crate) fn seal(key: &SessionKey, nonce: [u8; NONCE_BYTES], caller: &str, sessions: &[(String, Session)]) -> String {
    let mut plain = String::new();
    for (server, session) in sessions {
        plain.push_str(&session.text(server));
        plain.push('\n');
    }
    let cipher = ChaCha20Poly1305::new(Key::from_slice(&key.0));
    let payload = Payload { msg: plain.as_bytes(), aad: caller.as_bytes() };
    // Encryption fails only for a message past 256 GiB.
    let sealed = cipher.encrypt(Nonce::from_slice(&nonce), payload).unwrap_or_default();
    let mut bytes = nonce.to_vec();
    bytes.extend_from_slice(&sealed);
    format!("{PREFIX}{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The sessions sealed in the client's session id `id`, when it is one the key sealed for
/// `caller`; None for any other id (not sealed, altered, another caller's, another key's).
pub(crate) fn unseal(key: &SessionKey, id: &str, caller: &str) -> Option<Sessions> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(id.strip_prefix(PREFIX)?).ok()?;
    let (nonce, sealed) = (bytes.get(..NONCE_BYTES)?, bytes.get(NONCE_BYTES..)?);
    let cipher = ChaCha20Poly1305::new(Key::from_slice(&key.0));
    let plain = cipher.decrypt(Nonce::from_slice(nonce), Payload { msg: sealed, aad: caller.as_bytes() }).ok()?;
    let plain = String::from_utf8(plain).ok()?;
    let sessions = plain.lines().filter_map(Session::from_text);
    Some(sessions.map(|(server, session)| (server.to_string(), session)).collect())
}

/// Servers' sessions, by server id.
pub(crate) type Sessions = Vec<(String, Session)>;

/// The sessions an id holds (the first, up to [`MAX_SEALED`] bytes of them), and those past it.
pub(crate) fn fitting(sessions: Sessions) -> (Sessions, Sessions) {
    let mut size = 0;
    sessions.into_iter().partition(|(server, session)| {
        size += server.len() + session.id.as_deref().map_or(0, str::len) + session.version.len() + 3;
        size <= MAX_SEALED
    })
}

/// Fresh randomness for a nonce.
pub(crate) fn nonce(host: &mut dyn Host) -> [u8; NONCE_BYTES] {
    random_bytes(host)
}

/// `N` bytes of the host's randomness.
fn random_bytes<const N: usize>(host: &mut dyn Host) -> [u8; N] {
    let mut bytes = [0u8; N];
    for chunk in bytes.chunks_mut(8) {
        chunk.iter_mut().zip(host.random().to_le_bytes()).for_each(|(byte, drawn)| *byte = drawn);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::testing::FakeHost;
    use crate::unit_tests::test;

    fn key(byte: u8) -> SessionKey {
        SessionKey::of([byte; 32])
    }

    fn sessions() -> Vec<(String, Session)> {
        vec![
            ("files".into(), Session { id: Some("s-1".into()), version: "2025-11-25".into() }),
            ("search".into(), Session { id: None, version: "2026-07-28".into() }),
        ]
    }

    #[test]
    fn a_sealed_id_gives_its_sessions_back_to_its_caller_only() {
        let id = seal(&key(1), [7; 12], "key-1", &sessions());
        assert!(id.starts_with("gw1.") && id.bytes().all(|b| b.is_ascii_graphic()), "{id}");
        assert!(!id.contains("s-1") && !id.contains("files"), "the sessions are not readable: {id}");
        assert_eq!(unseal(&key(1), &id, "key-1"), Some(sessions()));
        assert_eq!(unseal(&key(1), &id, "key-2"), None, "another caller's");
        assert_eq!(unseal(&key(2), &id, "key-1"), None, "another key's");
        let mut altered = id.clone().into_bytes();
        let last = altered.len() - 3;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(unseal(&key(1), std::str::from_utf8(&altered).unwrap(), "key-1"), None, "altered");
        for other in ["0123456789abcdef0123456789abcdef", "gw1.", "gw1.!!", "gw1.AAAA"] {
            assert_eq!(unseal(&key(1), other, "key-1"), None, "{other}");
        }
        assert_eq!(unseal(&key(1), &seal(&key(1), [8; 12], "key-1", &[]), "key-1"), Some(vec![]));
    }

    #[test]
    fn an_id_seals_the_sessions_that_fit_and_leaves_the_rest() {
        let long = |server: &str| (server.to_string(), Session { id: Some("x".repeat(1500)), version: "v".into() });
        let (sealed, over) = fitting(vec![long("a"), long("b"), long("c"), long("d")]);
        assert_eq!((sealed.len(), over.len()), (2, 2));
        assert_eq!(over[0].0, "c");
        let id = seal(&key(1), [1; 12], "k", &sealed);
        assert!(id.len() < super::super::aggregate::MAX_SESSION_ID, "{}", id.len());
    }

    #[test]
    fn the_key_is_the_configured_one_else_one_every_worker_shares() {
        assert!(SessionKey::parse("AAAA").is_err() && SessionKey::parse("not base64!").is_err());
        let configured = SessionKey::parse(&base64::engine::general_purpose::STANDARD.encode([3u8; 32])).unwrap();
        assert_eq!(format!("{configured:?}"), "SessionKey(..)", "never printed");
        let mut host = FakeHost::new(5);
        assert_eq!(SessionKey::or_own(Some(&configured), &mut host), configured);
        let own = SessionKey::or_own(None, &mut host);
        assert_ne!(own, configured);
        assert_eq!(SessionKey::or_own(None, &mut host), own, "made once, then shared");
    }
}
