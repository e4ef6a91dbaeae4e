//! Where a provider lives, parsed from a base URL (built-in, `custom_host` in a header, a
//! config or a stored credential): one parser, so every path checks the same things.

use std::fmt::Write;

/// Scheme, `host:port` and the base path a provider's endpoints hang off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub tls: bool,
    /// Lowercase host, IPv6 without brackets, for the allow-list.
    pub host: String,
    /// `host:port` as sent in `:authority` (IPv6 in brackets).
    pub authority: String,
    /// Path prefix without a trailing slash, e.g. `/v1` or empty.
    pub base_path: String,
}

impl Upstream {
    /// The URL's path, `/` when it has none (a request to the host's root).
    pub fn path_or_root(&self) -> &str {
        if self.base_path.is_empty() {
            "/"
        } else {
            &self.base_path
        }
    }

    /// The port `authority` names (always there: the scheme's when the URL gave none).
    pub fn port(&self) -> u16 {
        let named = self.authority.rsplit_once(':').and_then(|(_, port)| port.parse().ok());
        named.unwrap_or(if self.tls { 443 } else { 80 })
    }

    /// Parses an absolute `http://` or `https://` base URL. The message of an error completes
    /// "custom host ...".
    pub fn parse(url: &str) -> Result<Upstream, &'static str> {
        // Whitespace and control characters could split the request line or a header.
        if has_space_or_control(url) {
            return Err("must not contain whitespace or control characters");
        }
        let (tls, rest) = if let Some(rest) = strip_prefix_ignore_case(url, "https://") {
            (true, rest)
        } else if let Some(rest) = strip_prefix_ignore_case(url, "http://") {
            (false, rest)
        } else {
            return Err("must be an absolute http:// or https:// URL");
        };
        let (authority, path) = match rest.bytes().position(|b| matches!(b, b'/' | b'?' | b'#')) {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if path.bytes().any(|b| b == b'?' || b == b'#') {
            return Err("must not carry a query or fragment");
        }
        // The path goes into the request line as is: plain RFC 3986 path characters only,
        // and no dot segments that would climb out of the base path.
        let path_char = |b: u8| b.is_ascii_alphanumeric() || b"/-._~!$&'()*+,;=:@%".contains(&b);
        if !path.bytes().all(path_char) || path.split('/').any(|seg| seg == "." || seg == "..") {
            return Err("has a path with characters or segments that are not allowed");
        }
        // Credentials in the URL would be sent in the clear and logged.
        if authority.contains('@') {
            return Err("must not contain credentials (user@host)");
        }
        let (host, port) = split_host_port(authority)?;
        let host = host.to_ascii_lowercase();
        let host_char = |b: u8| b.is_ascii_alphanumeric() || b"-._:".contains(&b);
        if host.is_empty() || !host.bytes().all(host_char) {
            return Err("has no valid host");
        }
        let port = port.unwrap_or(if tls { 443 } else { 80 });
        // Written in place: `format!` was a fifth of a parse, which every custom-host request makes.
        let mut authority = String::with_capacity(host.len() + 8);
        let ipv6 = host.contains(':');
        if ipv6 {
            authority.push('[');
        }
        authority.push_str(&host);
        if ipv6 {
            authority.push(']');
        }
        let _ = write!(authority, ":{port}");
        Ok(Upstream { tls, host, authority, base_path: path.trim_end_matches('/').to_string() })
    }
}

/// Whether `s` holds whitespace or a control character; ASCII (every URL a client sends in
/// practice) is checked byte by byte, not decoded.
fn has_space_or_control(s: &str) -> bool {
    if s.is_ascii() {
        // In ASCII, whitespace other than the space is control characters.
        s.bytes().any(|b| b == b' ' || b.is_ascii_control())
    } else {
        s.chars().any(|c| c.is_whitespace() || c.is_control())
    }
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    if head.eq_ignore_ascii_case(prefix) {
        s.get(prefix.len()..)
    } else {
        None
    }
}

fn split_host_port(authority: &str) -> Result<(&str, Option<u16>), &'static str> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or("has an unclosed IPv6 bracket")?;
        match after {
            "" => (host, None),
            _ => (host, Some(after.strip_prefix(':').ok_or("has an invalid port")?)),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(p) if p.bytes().all(|b| b.is_ascii_digit()) => {
            Some(p.parse::<u16>().ok().filter(|p| *p != 0).ok_or("has a port outside 1 to 65535")?)
        }
        Some(_) => return Err("has an invalid port"),
        None => None,
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use crate::unit_tests::test;

    use super::*;

    #[test]
    fn parses_base_urls() {
        let u = Upstream::parse("https://api.openai.com/v1/").unwrap();
        assert_eq!((u.tls, u.authority.as_str(), u.base_path.as_str()), (true, "api.openai.com:443", "/v1"));
        let u = Upstream::parse("HTTP://[::1]:8080").unwrap();
        assert_eq!(
            (u.tls, u.host.as_str(), u.authority.as_str(), u.base_path.as_str()),
            (false, "::1", "[::1]:8080", "")
        );
        let u = Upstream::parse("http://Models.Internal/openai/v1").unwrap();
        assert_eq!((u.host.as_str(), u.authority.as_str()), ("models.internal", "models.internal:80"));
        let ports = ["https://api.openai.com", "http://[::1]:8080/v1", "http://models.internal"]
            .map(|url| Upstream::parse(url).unwrap().port());
        assert_eq!(ports, [443, 8080, 80]);
    }

    #[test]
    fn rejects_what_could_smuggle_or_escape() {
        for bad in [
            "ftp://x",
            "http://",
            "http://u:p@host/",
            "http://host:99999/",
            "http://host:0/",
            "http://host:8a/",
            "http://host/?q",
            "http://host/#f",
            "http://ho st/",
            "http://host/a b",
            "http://host/a\r\nx-injected: 1",
            "http://host/v1/../admin",
            "http://host/./v1",
            "http://host/a\"b",
            "http://[::1/",
            "http://[::1]x/",
        ] {
            assert!(Upstream::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_whitespace_and_control_characters_in_and_outside_ascii() {
        for bad in [
            "http://ho st/",
            "http://host/a\tb",
            "http://host/a\x0bb",
            "http://host/a\x7f",
            "http://host/a\r\nx-injected: 1",
            // Outside ASCII: a no-break space, a line separator, a C1 control.
            "http://h\u{e9}st/a\u{a0}b",
            "http://h\u{e9}st/a\u{2028}b",
            "http://h\u{e9}st/a\u{85}b",
        ] {
            assert_eq!(Upstream::parse(bad), Err("must not contain whitespace or control characters"), "{bad:?}");
        }
        // Other characters outside ASCII are refused by the host's and the path's own rules.
        assert_eq!(Upstream::parse("http://h\u{e9}st/"), Err("has no valid host"));
    }
}
