//! Names on the wire that the filter and the control plane both use (the control plane's
//! requests through the gateway, the requests the filter relays to it) and the syntax of the
//! header names and values both check.

use base64::Engine;
use sha2::{Digest, Sha256};

/// Marks the control plane's own requests through the gateway that the provider must answer
/// rather than the control plane (the provider's part of a merged batch list): without it the
/// filter would relay them back. It never reaches a provider, even when forwarded by name.
pub const CONTROL_PLANE_FETCH_HEADER: &str = "x-gateway-control-plane-fetch";

/// The client's `Authorization`, renamed on the way to the control plane (which sends the
/// batch's lines back through the gateway with it).
pub const CLIENT_AUTHORIZATION_HEADER: &str = "x-gateway-client-authorization";

/// The caller's workspace, on requests relayed to the control plane.
pub const WORKSPACE_HEADER: &str = "x-gateway-workspace";

/// The value of `CONTROL_PLANE_FETCH_HEADER`: derived from the control plane's token (only a
/// holder of the token can make it, and the token itself never travels on the gateway's
/// listener).
pub fn control_plane_fetch_marker(token: &str) -> String {
    let digest = Sha256::new().chain_update(b"model-gateway control-plane fetch\n").chain_update(token).finalize();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest)
}

/// Whether `text` can go out as a header value: no control character but the tab (RFC 9110;
/// Envoy answers a request carrying a CR, LF or NUL in a header with a plain-text 503).
pub fn is_header_value(text: &str) -> bool {
    !text.bytes().any(|b| b.is_ascii_control() && b != b'\t')
}

/// An HTTP header name: one or more token characters (RFC 9110).
pub fn is_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unit_tests::test;

    #[test]
    fn header_values_have_no_control_characters_but_tab() {
        assert!(is_header_value("Bearer sk-1\tx é"));
        for bad in ["a\rb", "a\nb", "a\u{0}b", "\u{1}", "\u{7f}"] {
            assert!(!is_header_value(bad), "{bad:?}");
        }
    }
}
