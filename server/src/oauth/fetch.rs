//! `GET` of an authorization server's documents (discovery metadata, JWKS): [`Fetch`], and
//! [`HttpFetch`], HTTP/1.1 over a [`Connect`] with TLS for `https://` URLs.

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use gateway_client::{Connect, HttpUrl};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::OnceCell;
use tokio_rustls::rustls;

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

/// The real fetcher: HTTP/1.1 over a [`Connect`] (tokio TCP in production), TLS (rustls, with
/// the system's CA certificates, read once on first use) for `https://`. No redirects.
#[derive(Clone)]
pub struct HttpFetch<C: Connect> {
    connect: C,
    tls: Arc<OnceCell<Result<Arc<rustls::ClientConfig>, String>>>,
}

impl<C: Connect> HttpFetch<C> {
    /// Trusts the system's CA certificates for `https://`.
    pub fn new(connect: C) -> HttpFetch<C> {
        HttpFetch {
            connect,
            tls: Arc::new(OnceCell::new()),
        }
    }

    /// Trusts only the CA certificates in `pem` for `https://` (an authorization server
    /// behind a private CA).
    pub fn with_ca_pem(connect: C, pem: &[u8]) -> Result<HttpFetch<C>, String> {
        use rustls::pki_types::pem::PemObject as _;
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| format!("a CA certificate could not be read: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("a CA certificate could not be used: {e}"))?;
        }
        if roots.is_empty() {
            return Err("no CA certificate in the PEM".into());
        }
        Ok(HttpFetch {
            connect,
            tls: Arc::new(OnceCell::new_with(Some(client_config(roots)))),
        })
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
        let stream = self
            .connect
            .connect(&host_port)
            .await
            .map_err(|e| FetchError::Failed(format!("cannot connect to {host_port}: {e}")))?;
        let host_header = if (tls && parsed.port == 443) || (!tls && parsed.port == 80) {
            parsed.host.clone()
        } else {
            host_port.clone()
        };
        if !tls {
            return get(stream, &host_header, &parsed.path).await;
        }
        let config = self
            .tls
            .get_or_init(|| async {
                match tokio::task::spawn_blocking(tls_config).await {
                    Ok(r) => r,
                    Err(e) => Err(format!("loading CA certificates failed: {e}")),
                }
            })
            .await
            .clone()
            .map_err(FetchError::Failed)?;
        let name = parsed.host.trim_start_matches('[').trim_end_matches(']');
        let server_name = rustls::pki_types::ServerName::try_from(name.to_owned())
            .map_err(|e| FetchError::Failed(format!("{name} is not a TLS server name: {e}")))?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(server_name, stream)
            .await
            .map_err(|e| FetchError::Failed(format!("TLS with {host_port} failed: {e}")))?;
        get(stream, &host_header, &parsed.path).await
    }
}

/// Whether the URL needs TLS, and its parts; `https://` URLs default to port 443.
fn split_url(url: &str) -> Result<(bool, HttpUrl), FetchError> {
    let bad = |reason: String| FetchError::Failed(format!("cannot fetch {url:?}: {reason}"));
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad("not an absolute URL".into()))?;
    let tls = if scheme.eq_ignore_ascii_case("https") {
        true
    } else if scheme.eq_ignore_ascii_case("http") {
        false
    } else {
        return Err(bad("the scheme must be https:// or http://".into()));
    };
    let mut parsed = HttpUrl::parse(&format!("http://{rest}")).map_err(|e| bad(e.reason))?;
    if tls {
        let authority = rest.split(['/', '?']).next().unwrap_or("");
        let has_port = match authority.rsplit_once(']') {
            Some((_, after)) => after.starts_with(':'),
            None => authority.contains(':'),
        };
        if !has_port {
            parsed.port = 443;
        }
    }
    Ok((tls, parsed))
}

/// rustls with ring and the system's CA certificates (`SSL_CERT_FILE` and `SSL_CERT_DIR` are
/// honoured). Reads files: run it off the runtime.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::debug!(error = %e, "a CA certificate could not be loaded");
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err("no CA certificates found on this system (install ca-certificates, or set SSL_CERT_FILE)".into());
    }
    client_config(roots)
}

/// rustls with ring, trusting `roots`.
fn client_config(roots: rustls::RootCertStore) -> Result<Arc<rustls::ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration failed: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
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
