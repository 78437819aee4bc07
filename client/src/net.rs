//! How a client (or a sled) opens a connection: generic, so the same code runs over real TCP and
//! inside a simulation; and the `http://` and `https://` URLs it connects to (TLS is layered on
//! the connection by [`crate::tls::dial`]).

use std::future::Future;

/// Opens byte streams to `host:port` addresses. A simulation implements this over its own
/// network; [`TokioConnect`] is real TCP.
pub trait Connect: Clone + Send + Sync + 'static {
    /// The connected stream.
    type Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;

    /// Connects to `host_port` (`"127.0.0.1:8080"`, `"gateway:80"`, `"[::1]:80"`).
    fn connect(
        &self,
        host_port: &str,
    ) -> impl Future<Output = std::io::Result<Self::Stream>> + Send;
}

/// Real TCP through `tokio::net::TcpStream`, with `TCP_NODELAY` set.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioConnect;

impl Connect for TokioConnect {
    type Stream = tokio::net::TcpStream;

    async fn connect(&self, host_port: &str) -> std::io::Result<Self::Stream> {
        let stream = tokio::net::TcpStream::connect(host_port).await?;
        stream.set_nodelay(true)?;
        Ok(stream)
    }
}

/// An `http://host[:port][/path]` URL that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid URL {url:?}: {reason}")]
pub struct UrlError {
    /// The URL as given.
    pub url: String,
    /// What is wrong with it.
    pub reason: String,
}

/// An `http://` or `https://` URL split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// `https://`: the connection speaks TLS (see [`crate::tls::dial`]).
    pub tls: bool,
    /// The host as written (an IPv6 address keeps its brackets).
    pub host: String,
    /// The port (80 when the URL has none, 443 for `https://`).
    pub port: u16,
    /// The path, starting with `/` (`/` when the URL has none). Query strings are kept.
    pub path: String,
}

impl HttpUrl {
    /// Parses `http://host[:port][/path]` or `https://host[:port][/path]`.
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let fail = |reason: &str| UrlError {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let (tls, rest) = match url.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (false, rest),
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (true, rest),
            Some(_) => return Err(fail("the scheme must be http:// or https://")),
            None => return Err(fail("expected http://host:port or https://host:port")),
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let path = if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("/{path}")
        };
        if authority.contains('@') {
            return Err(fail("user info is not supported"));
        }
        let (host, port) = if let Some(after) = authority.strip_prefix('[') {
            let Some(end) = after.find(']') else {
                return Err(fail("unclosed '[' in the host"));
            };
            let host = &authority[..end + 2];
            match &after[end + 1..] {
                "" => (host, None),
                p => match p.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Err(fail("unexpected text after the IPv6 address")),
                },
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() || host == "[]" {
            return Err(fail("the host is empty"));
        }
        if !host.starts_with('[')
            && !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
        {
            return Err(fail("the host has characters a host name cannot have"));
        }
        let port = match port {
            None if tls => 443,
            None => 80,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err(fail("the port must be a number from 1 to 65535")),
                Ok(p) => p,
            },
        };
        if path
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
        {
            return Err(fail("the path has whitespace or control characters"));
        }
        Ok(HttpUrl {
            tls,
            host: host.to_owned(),
            port,
            path,
        })
    }

    /// `host:port`, for connecting and for the `Host` header.
    pub fn host_port(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// `"https"` or `"http"`.
    pub fn scheme(&self) -> &'static str {
        if self.tls {
            "https"
        } else {
            "http"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_urls() {
        let u = HttpUrl::parse("http://127.0.0.1:8080/mcp").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("127.0.0.1", 8080, "/mcp")
        );
        let u = HttpUrl::parse("HTTP://gateway").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("gateway", 80, "/")
        );
        let u = HttpUrl::parse("http://[::1]:9/x?y=1").unwrap();
        assert_eq!(u.host_port(), "[::1]:9");
        assert_eq!(u.path, "/x?y=1");
        let u = HttpUrl::parse("http://h:1?q").unwrap();
        assert_eq!(u.path, "/?q");
        assert!(!u.tls);
        let u = HttpUrl::parse("https://gw.example/mcp").unwrap();
        assert_eq!((u.tls, u.port, u.scheme()), (true, 443, "https"));
        let u = HttpUrl::parse("HTTPS://127.0.0.1:8443").unwrap();
        assert_eq!((u.tls, u.host_port().as_str()), (true, "127.0.0.1:8443"));
        for bad in [
            "127.0.0.1:8080",
            "wss://x:1",
            "ftp://x",
            "http://",
            "http://:80",
            "http://x:0",
            "http://x:65536",
            "http://x:port",
            "http://[::1",
            "http://[::1]x",
            "http://u@x:1",
            "http://a b:1",
            "http://x:1/a b",
        ] {
            assert!(HttpUrl::parse(bad).is_err(), "{bad}");
        }
    }
}
