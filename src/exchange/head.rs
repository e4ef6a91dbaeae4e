//! A provider's response head, read from the host once and shared by the phases that finish,
//! hold or recover its answer.

use super::{reply, Env, RawHeaders};
use crate::request::headers;
use crate::stream;

/// A provider's response head: its status and headers, read from the host once.
#[derive(Default)]
pub(super) struct Head {
    /// 0 when absent or garbled.
    pub(super) status: u16,
    pub(super) headers: RawHeaders,
}

impl Head {
    /// The head of the response request `env.id` received.
    pub(super) fn read(env: &mut Env) -> Head {
        let headers = env.io.response_headers(env.id);
        Head { status: reply::parse_status(headers::find(&headers, ":status")), headers }
    }

    pub(super) fn content_type(&self) -> Option<&[u8]> {
        headers::find(&self.headers, "content-type")
    }

    /// The provider streams its answer (by its content type).
    pub(super) fn is_stream(&self) -> bool {
        self.content_type().is_some_and(stream::is_stream)
    }

    pub(super) fn content_length(&self) -> Option<usize> {
        let value = headers::find(&self.headers, "content-length")?;
        std::str::from_utf8(value).ok()?.trim().parse().ok()
    }

    /// The body comes as it is (no content encoding but `identity`).
    pub(super) fn unencoded(&self) -> bool {
        headers::find(&self.headers, "content-encoding").is_none_or(|v| v == b"identity")
    }

    /// The content type as text (empty when the provider sent none).
    pub(super) fn content_type_text(&self) -> String {
        self.content_type().map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default()
    }
}
