//! `GET` of an authorization server's documents (discovery metadata, JWKS): [`Fetch`], and
//! [`HttpFetch`], HTTP/1.1 over a [`Connect`] with TLS for `https://` URLs.

use bytes::Bytes;
use futures_util::future::BoxFuture;
use gateway_client::{Connect, HttpUrl, TlsError, TlsTrust};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

/// The largest document accepted: a JWKS with dozens of RSA keys is a few tens of KiB.
pub const MAX_DOCUMENT_BYTES: usize = 1 << 20;

/// Why a `GET` brought no document.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// The server answered with a status other than 200.
    #[error("HTTP status {0}")]
    Status(u16),
    /// No answer: the URL, the connection, TLS or HTTP failed. Says why.
    #[error("{0}")]
    Failed(String),
}

/// Fetches documents for the OAuth resource server. The caller applies its own timeout, so an
/// implementation may take its time, but it must use only `tokio::time` and a
/// [`Connect`]-style network, so that it runs on turmoil too.
pub trait Fetch: Send + Sync + 'static {
    /// `GET url`: the body of a 200 answer, at most [`MAX_DOCUMENT_BYTES`].
    fn get(&self, url: &str) -> BoxFuture<'static, Result<Bytes, FetchError>>;
}

/// The real fetcher: HTTP/1.1 over a [`Connect`] (tokio TCP in production), TLS for `https://`
/// through [`gateway_client::dial`] (rustls, with the system's CA certificates, read once on
/// first use, or a PEM's). No redirects.
#[derive(Clone)]
pub struct HttpFetch<C: Connect> {
    connect: C,
    trust: TlsTrust,
}

impl<C: Connect> HttpFetch<C> {
    /// Trusts the system's CA certificates for `https://`.
    pub fn new(connect: C) -> HttpFetch<C> {
        HttpFetch {
            connect,
            trust: TlsTrust::system(),
        }
    }

    /// Trusts only the CA certificates in `pem` for `https://` (an authorization server
    /// behind a private CA).
    pub fn with_ca_pem(connect: C, pem: &[u8]) -> Result<HttpFetch<C>, String> {
        let trust = TlsTrust::from_ca_pem("the CA PEM", pem).map_err(|e| e.to_string())?;
        Ok(HttpFetch { connect, trust })
    }
}

impl<C: Connect> std::fmt::Debug for HttpFetch<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpFetch")
    }
}

impl<C: Connect> Fetch for HttpFetch<C> {
    fn get(&self, url: &str) -> BoxFuture<'static, Result<Bytes, FetchError>> {
        let this = self.clone();
        let url = url.to_owned();
        Box::pin(async move { this.fetch(&url).await })
    }
}

impl<C: Connect> HttpFetch<C> {
    async fn fetch(&self, url: &str) -> Result<Bytes, FetchError> {
        let (tls, parsed) = split_url(url)?;
        let host_port = parsed.host_port();
        // A TLS failure says "TLS with host:port failed: …" itself.
        let stream = gateway_client::dial(&self.connect, &parsed, &self.trust)
            .await
            .map_err(
                |e| match e.get_ref().and_then(|e| e.downcast_ref::<TlsError>()) {
                    Some(tls) => FetchError::Failed(tls.to_string()),
                    None => FetchError::Failed(format!("cannot connect to {host_port}: {e}")),
                },
            )?;
        let host_header = if (tls && parsed.port == 443) || (!tls && parsed.port == 80) {
            parsed.host.clone()
        } else {
            host_port.clone()
        };
        get(stream, &host_header, &parsed.path).await
    }
}

/// Whether the URL needs TLS, and its parts; `https://` URLs default to port 443.
fn split_url(url: &str) -> Result<(bool, HttpUrl), FetchError> {
    let parsed = HttpUrl::parse(url)
        .map_err(|e| FetchError::Failed(format!("cannot fetch {url:?}: {}", e.reason)))?;
    Ok((parsed.tls, parsed))
}

/// Aborts the connection task when dropped, however the request ends.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One `GET` on a connected stream: the body of a 200 answer, at most [`MAX_DOCUMENT_BYTES`].
async fn get<S>(stream: S, host: &str, path: &str) -> Result<Bytes, FetchError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let failed = |what: &str, e: &dyn std::fmt::Display| FetchError::Failed(format!("{what}: {e}"));
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(|e| failed("HTTP handshake failed", &e))?;
    let _conn = AbortOnDrop(
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "authorization server connection ended");
            }
        })
        .abort_handle(),
    );
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::USER_AGENT, "mcp-gateway")
        .header(hyper::header::ACCEPT, "application/json")
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| failed("cannot build the request", &e))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| failed("no HTTP answer", &e))?;
    let status = response.status().as_u16();
    if status != 200 {
        return Err(FetchError::Status(status));
    }
    Limited::new(response.into_body(), MAX_DOCUMENT_BYTES)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| failed("the body could not be read", &*e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TLS server of OpenSSL's (`s_server -WWW`, serving the files of a directory) with a
    /// certificate for `localhost` from a CA of the test's own: a fetch trusting that CA gets
    /// the file; one trusting the system's CAs, or naming the host by another name, does not.
    #[tokio::test]
    async fn https_verifies_the_server_and_its_name() {
        use std::process::Stdio;
        let dir = std::env::temp_dir().join(format!("gateway-fetch-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("openssl runs (it is on every machine of this kind)");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
        let run = |line: String| openssl(&line.split(' ').collect::<Vec<_>>());
        run(format!(
            "req -x509 {ec} -keyout ca.key -out ca.pem -days 1 -subj /CN=test-CA"
        ));
        run(format!(
            "req {ec} -keyout key.pem -out leaf.csr -subj /CN=localhost"
        ));
        std::fs::write(
            dir.join("leaf.ext"),
            "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        run("x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out cert.pem -days 1 -extfile leaf.ext".into());
        std::fs::write(dir.join("jwks"), r#"{"keys":[]}"#).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let _server = tokio::process::Command::new("openssl")
            .args([
                "s_server", "-WWW", "-quiet", "-cert", "cert.pem", "-key", "key.pem",
            ])
            .args(["-accept", &format!("127.0.0.1:{port}")])
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("openssl s_server starts");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "s_server did not listen"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let pem = std::fs::read(dir.join("ca.pem")).unwrap();
        let trusting = HttpFetch::with_ca_pem(gateway_client::TokioConnect, &pem).unwrap();
        let body = trusting
            .get(&format!("https://localhost:{port}/jwks"))
            .await
            .expect("fetched over TLS");
        assert_eq!(&body[..], br#"{"keys":[]}"#);
        let wrong_name = trusting
            .get(&format!("https://127.0.0.1:{port}/jwks"))
            .await;
        assert!(
            matches!(&wrong_name, Err(FetchError::Failed(e)) if e.contains("TLS")),
            "{wrong_name:?}"
        );
        let system = HttpFetch::new(gateway_client::TokioConnect)
            .get(&format!("https://localhost:{port}/jwks"))
            .await;
        assert!(matches!(&system, Err(FetchError::Failed(_))), "{system:?}");
        assert!(HttpFetch::with_ca_pem(gateway_client::TokioConnect, b"nothing").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn urls_split_with_their_default_ports() {
        let cases = [
            (
                "https://id.example.com/jwks",
                true,
                "id.example.com",
                443,
                "/jwks",
            ),
            (
                "https://id.example.com:8443",
                true,
                "id.example.com",
                8443,
                "/",
            ),
            ("https://[::1]/x", true, "[::1]", 443, "/x"),
            ("https://[::1]:9/x", true, "[::1]", 9, "/x"),
            (
                "http://127.0.0.1:9000/a?b",
                false,
                "127.0.0.1",
                9000,
                "/a?b",
            ),
            ("HTTP://localhost", false, "localhost", 80, "/"),
        ];
        for (url, tls, host, port, path) in cases {
            let (t, u) = split_url(url).unwrap();
            assert_eq!(
                (t, u.host.as_str(), u.port, u.path.as_str()),
                (tls, host, port, path),
                "{url}"
            );
        }
        for bad in ["ftp://x/", "id.example.com", "https://", "https://a b/"] {
            assert!(split_url(bad).is_err(), "{bad}");
        }
    }
}
