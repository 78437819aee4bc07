//! TLS for `https://` endpoints (and the uplink's `wss://`): rustls with the ring provider,
//! layered on whatever stream a [`Connect`] opened, so the same code runs over real TCP and
//! inside a simulation.
//!
//! The server is verified: its chain must lead to a trusted certificate authority, and its
//! certificate must name the host of the URL (a DNS name is also sent as SNI; an IP address is
//! matched against the certificate's IP addresses). [`TlsTrust`] says which authorities are
//! trusted: the system's (the default) or those of a CA file.
//!
//! [`dial`] is the one place that decides, from a URL's scheme, whether a connection is plain
//! or TLS.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

use crate::net::{Connect, HttpUrl};

/// The environment variable the `gateway` shell commands, `gateway stdio` and `sled-sim` read
/// a CA file's path from when no `--ca-file` is given.
pub const CA_FILE_ENV: &str = "MCP_GATEWAY_CA_FILE";

/// Why TLS could not be set up or did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// The CA file could not be read.
    #[error("cannot read the CA file {path}: {reason}")]
    ReadCaFile { path: PathBuf, reason: String },
    /// The CA file (or PEM text) holds no usable certificate.
    #[error("{source_name}: {reason}")]
    BadCa { source_name: String, reason: String },
    /// The system has no CA certificates to trust.
    #[error(
        "no CA certificates found on this system (install ca-certificates, set SSL_CERT_FILE, \
         or give a CA file)"
    )]
    NoSystemRoots,
    /// Reading the system's CA certificates failed.
    #[error("cannot read the system's CA certificates: {0}")]
    SystemRootsUnreadable(String),
    /// The URL's host cannot be verified against a certificate.
    #[error("{host} is not a name a TLS certificate can be checked against: {reason}")]
    BadServerName { host: String, reason: String },
    /// The handshake failed: the server's certificate was not trusted, did not name the host,
    /// or the server does not speak TLS.
    #[error("TLS with {host_port} failed: {reason}")]
    Handshake { host_port: String, reason: String },
}

impl From<TlsError> for io::Error {
    fn from(e: TlsError) -> io::Error {
        let kind = match e {
            TlsError::ReadCaFile { .. }
            | TlsError::BadCa { .. }
            | TlsError::NoSystemRoots
            | TlsError::SystemRootsUnreadable(_) => io::ErrorKind::InvalidInput,
            TlsError::BadServerName { .. } => io::ErrorKind::InvalidInput,
            TlsError::Handshake { .. } => io::ErrorKind::InvalidData,
        };
        io::Error::new(kind, e)
    }
}

/// Which certificate authorities a client trusts for `https://` and `wss://`: the system's
/// ([`Default`]; read once per process, on the first TLS connection, on tokio's blocking
/// threads), or only those of a CA file.
#[derive(Clone, Default)]
pub struct TlsTrust {
    /// `None`: the system's roots. Else the config and where its roots came from.
    custom: Option<(Arc<rustls::ClientConfig>, String)>,
}

impl std::fmt::Debug for TlsTrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.custom {
            None => f.write_str("TlsTrust(system roots)"),
            Some((_, from)) => write!(f, "TlsTrust({from})"),
        }
    }
}

/// The same trust: both the system's, or the same loaded CA certificates (a clone).
impl PartialEq for TlsTrust {
    fn eq(&self, other: &TlsTrust) -> bool {
        match (&self.custom, &other.custom) {
            (None, None) => true,
            (Some((a, _)), Some((b, _))) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for TlsTrust {}

impl TlsTrust {
    /// The system's CA certificates (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured).
    pub fn system() -> TlsTrust {
        TlsTrust::default()
    }

    /// Only the CA certificates (PEM) in the file at `path`.
    pub fn from_ca_file(path: &Path) -> Result<TlsTrust, TlsError> {
        let pem = std::fs::read(path).map_err(|e| TlsError::ReadCaFile {
            path: path.to_owned(),
            reason: e.to_string(),
        })?;
        TlsTrust::from_ca_pem(&format!("the CA file {}", path.display()), &pem)
    }

    /// Only the CA certificates in `pem`; `source_name` names where they came from in errors.
    pub fn from_ca_pem(source_name: &str, pem: &[u8]) -> Result<TlsTrust, TlsError> {
        let bad = |reason: String| TlsError::BadCa {
            source_name: source_name.to_owned(),
            reason,
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| bad(format!("a certificate could not be read: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| bad(format!("a certificate could not be used as a CA: {e}")))?;
        }
        if roots.is_empty() {
            return Err(bad("no PEM certificate in it".to_owned()));
        }
        Ok(TlsTrust {
            custom: Some((client_config(roots), source_name.to_owned())),
        })
    }

    /// `--ca-file`'s value if given, else the file [`CA_FILE_ENV`] names (as `env` reads it),
    /// else the system's roots; with where the choice came from, for messages.
    pub fn from_flag_or_env(
        flag: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<TlsTrust, TlsError> {
        match (flag, env(CA_FILE_ENV).filter(|v| !v.trim().is_empty())) {
            (Some(path), _) => TlsTrust::from_ca_file(path),
            (None, Some(path)) => TlsTrust::from_ca_file(Path::new(path.trim())),
            (None, None) => Ok(TlsTrust::system()),
        }
    }

    /// The rustls configuration: the custom one, or the system's (loaded once per process,
    /// off the runtime's own threads: it reads files).
    async fn config(&self) -> Result<Arc<rustls::ClientConfig>, TlsError> {
        if let Some((config, _)) = &self.custom {
            return Ok(config.clone());
        }
        static SYSTEM: OnceLock<Result<Arc<rustls::ClientConfig>, TlsError>> = OnceLock::new();
        if let Some(loaded) = SYSTEM.get() {
            return loaded.clone();
        }
        let loaded = tokio::task::spawn_blocking(system_config)
            .await
            .unwrap_or_else(|e| Err(TlsError::SystemRootsUnreadable(e.to_string())));
        // Two first connections at once may both load; the first to finish is kept.
        SYSTEM.get_or_init(|| loaded).clone()
    }

    /// TLS over `stream` to `host` (as written in a URL: an IPv6 address keeps its brackets);
    /// `host_port` is named in errors.
    pub async fn handshake<S>(
        &self,
        host: &str,
        host_port: &str,
        stream: S,
    ) -> Result<tokio_rustls::client::TlsStream<S>, TlsError>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let config = self.config().await?;
        let name = host.trim_start_matches('[').trim_end_matches(']');
        let server_name =
            ServerName::try_from(name.to_owned()).map_err(|e| TlsError::BadServerName {
                host: host.to_owned(),
                reason: e.to_string(),
            })?;
        tokio_rustls::TlsConnector::from(config)
            .connect(server_name, stream)
            .await
            .map_err(|e| TlsError::Handshake {
                host_port: host_port.to_owned(),
                reason: e.to_string(),
            })
    }
}

/// rustls with ring, trusting `roots`, speaking HTTP/1.1.
fn client_config(roots: rustls::RootCertStore) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports rustls's safe default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// The system's CA certificates. Reads files, once per process.
fn system_config() -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::debug!(error = %e, "a system CA certificate could not be loaded");
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(TlsError::NoSystemRoots);
    }
    Ok(client_config(roots))
}

/// A connection as [`dial`] opened it: the [`Connect`] stream itself for `http://`, TLS over it
/// for `https://`.
#[derive(Debug)]
pub enum MaybeTls<S> {
    /// No TLS.
    Plain(S),
    /// TLS over the stream.
    Tls(Box<tokio_rustls::client::TlsStream<S>>),
}

impl<S> MaybeTls<S> {
    /// Whether the connection is TLS.
    pub fn is_tls(&self) -> bool {
        matches!(self, MaybeTls::Tls(_))
    }

    /// The certificates the server presented (its own first), when TLS.
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        match self {
            MaybeTls::Plain(_) => None,
            MaybeTls::Tls(tls) => tls.get_ref().1.peer_certificates(),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for MaybeTls<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for MaybeTls<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(s) => s.is_write_vectored(),
            MaybeTls::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// Opens a connection to `url`'s host and port through `connector`: plain for `http://`, TLS
/// verified against `trust` for `https://`.
pub async fn dial<C: Connect>(
    connector: &C,
    url: &HttpUrl,
    trust: &TlsTrust,
) -> io::Result<MaybeTls<C::Stream>> {
    let host_port = url.host_port();
    let stream = connector.connect(&host_port).await?;
    if !url.tls {
        return Ok(MaybeTls::Plain(stream));
    }
    let tls = trust.handshake(&url.host, &host_port, stream).await?;
    Ok(MaybeTls::Tls(Box::new(tls)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_must_hold_a_certificate() {
        let e = TlsTrust::from_ca_pem("the test's PEM", b"nothing here").unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let e = TlsTrust::from_ca_file(Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(
            matches!(e, TlsError::ReadCaFile { .. }) && e.to_string().contains("/nonexistent"),
            "{e}"
        );
        let junk = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(TlsTrust::from_ca_pem("junk", junk).is_err());
    }

    #[test]
    fn the_ca_file_comes_from_the_flag_then_the_environment() {
        let none = |_: &str| None;
        let t = TlsTrust::from_flag_or_env(None, &none).unwrap();
        assert!(format!("{t:?}").contains("system"));
        let env = |k: &str| (k == CA_FILE_ENV).then(|| "/nonexistent/env-ca.pem".to_owned());
        let e = TlsTrust::from_flag_or_env(None, &env).unwrap_err();
        assert!(e.to_string().contains("env-ca.pem"), "{e}");
        let e =
            TlsTrust::from_flag_or_env(Some(Path::new("/nonexistent/flag.pem")), &env).unwrap_err();
        assert!(e.to_string().contains("flag.pem"), "{e}");
    }
}
