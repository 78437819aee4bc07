//! Checks on the HTTP headers of a request to `/mcp`: media types, origins, protocol versions.

/// MCP protocol versions this gateway speaks, newest first.
pub(crate) const PROTOCOL_VERSIONS: &[&str] =
    &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// Stateless protocol versions (no initialize, no session: each request carries its version
/// and client capabilities in `_meta`), newest first.
pub(crate) const MODERN_VERSIONS: &[&str] = &["2026-07-28"];

/// The `_meta` keys of the 2026-07-28 per-request fields.
pub(crate) const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub(crate) const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// Decodes a routing header value: plain text, or `=?base64?...?=` for values that are not
/// plain visible ASCII.
pub(crate) fn decode_header_value(v: &str) -> Option<String> {
    match v
        .strip_prefix("=?base64?")
        .and_then(|r| r.strip_suffix("?="))
    {
        Some(b64) => base64_decode(b64).and_then(|b| String::from_utf8(b).ok()),
        None => Some(v.to_owned()),
    }
}

fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

/// The HTTP status of a JSON-RPC error answered in the 2026-07-28 era.
pub(crate) fn modern_status(code: i64) -> u16 {
    match code {
        -32700 | -32600 | -32602 | -32020 | -32021 | -32022 => 400,
        -32601 => 404,
        _ => 200,
    }
}

/// Whether an `Accept` header admits `media` (`type/subtype`). No header admits anything, as
/// in HTTP; `*/*` and `type/*` count, and `q=0` excludes.
pub(crate) fn accepts(accept: Option<&str>, media: &str) -> bool {
    let Some(accept) = accept else {
        return true;
    };
    let (ty, _) = media.split_once('/').unwrap_or((media, ""));
    accept.split(',').any(|range| {
        let mut parts = range.split(';');
        let name = parts.next().unwrap_or("").trim();
        let refused = parts.any(|p| {
            let p = p.trim();
            p.strip_prefix("q=")
                .is_some_and(|q| q.trim().parse::<f32>().is_ok_and(|q| q <= 0.0))
        });
        !refused
            && (name.eq_ignore_ascii_case(media)
                || name == "*/*"
                || name
                    .strip_suffix("/*")
                    .is_some_and(|t| t.eq_ignore_ascii_case(ty)))
    })
}

/// Whether an `Accept` header names `media` itself or its type's wildcard (not `*/*`): the
/// client says it can read that format, so the gateway may choose it.
pub(crate) fn names(accept: Option<&str>, media: &str) -> bool {
    let Some(accept) = accept else {
        return false;
    };
    let ty = media.split('/').next().unwrap_or(media);
    accept.split(',').any(|range| {
        let name = range.split(';').next().unwrap_or("").trim();
        name.eq_ignore_ascii_case(media)
            || name
                .strip_suffix("/*")
                .is_some_and(|t| t.eq_ignore_ascii_case(ty))
    })
}

/// Whether a request's `Origin` may use the gateway: no Origin (not a browser), a loopback
/// origin, or one on the allow-list (`*` allows any).
pub(crate) fn origin_allowed(origin: Option<&str>, allowed: &[String]) -> bool {
    let Some(origin) = origin else {
        return true;
    };
    if allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Some(rest) = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
    else {
        return false;
    };
    let host = if let Some(v6) = rest.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, port)) if port.is_empty() || valid_port(port) => h,
            _ => return false,
        }
    } else {
        match rest.split_once(':') {
            Some((h, port)) if valid_port(&format!(":{port}")) => h,
            Some(_) => return false,
            None => rest,
        }
    };
    host.eq_ignore_ascii_case("localhost") || host == "127.0.0.1" || host == "::1"
}

fn valid_port(p: &str) -> bool {
    p.strip_prefix(':')
        .is_some_and(|n| !n.is_empty() && n.parse::<u16>().is_ok())
}

/// Whether `v` is a protocol version this gateway speaks, in either era.
pub(crate) fn supported_version(v: &str) -> bool {
    PROTOCOL_VERSIONS.contains(&v) || MODERN_VERSIONS.contains(&v)
}

/// Whether `v` names a stateless (2026-07-28 or later) protocol version.
pub(crate) fn is_modern(v: &str) -> bool {
    MODERN_VERSIONS.contains(&v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept() {
        assert!(accepts(None, "application/json"));
        assert!(accepts(
            Some("application/json, text/event-stream"),
            "application/json"
        ));
        assert!(accepts(Some("*/*"), "text/event-stream"));
        assert!(accepts(Some("text/*;q=0.5"), "text/event-stream"));
        assert!(!accepts(Some("text/html"), "application/json"));
        assert!(!accepts(Some("application/json;q=0"), "application/json"));
        assert!(names(
            Some("application/json, text/event-stream"),
            "text/event-stream"
        ));
        assert!(!names(Some("*/*"), "text/event-stream"));
        assert!(!names(None, "text/event-stream"));
    }

    #[test]
    fn header_values() {
        assert_eq!(decode_header_value("beta").as_deref(), Some("beta"));
        assert_eq!(
            decode_header_value("=?base64?YsOpdGE=?=").as_deref(),
            Some("béta")
        );
        assert_eq!(decode_header_value("=?base64?!!?="), None);
    }

    #[test]
    fn origins() {
        let none: Vec<String> = Vec::new();
        for ok in [
            "http://localhost",
            "http://localhost:6274",
            "https://127.0.0.1:8443",
            "http://[::1]:3000",
        ] {
            assert!(origin_allowed(Some(ok), &none), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.nip.io",
            "null",
            "http://localhost:99999",
            "file://",
        ] {
            assert!(!origin_allowed(Some(bad), &none), "{bad}");
        }
        assert!(origin_allowed(None, &none));
        let list = vec!["https://ops.example".to_owned()];
        assert!(origin_allowed(Some("https://ops.example"), &list));
        assert!(origin_allowed(
            Some("http://evil.example"),
            &["*".to_owned()]
        ));
    }
}
