//! HTTPS and WSS on the gateway's own listeners: rustls (ring) with a certificate chain and a
//! private key read from PEM files, reloaded without a restart.
//!
//! [`ServerTls::load`] reads both files and refuses a pair that does not work (no certificate,
//! no key, a key that is not the certificate's). The accept loop (`accept.rs`) takes the
//! configuration in force for each new connection and runs the handshake in the connection's
//! own task, bounded by [`HANDSHAKE_TIMEOUT`]; a failed handshake is logged at debug level and
//! counted (`gateway_tls_handshakes_failed_total`). A client that speaks plain HTTP to the TLS
//! port gets a plain `400` saying to use `https://`, rather than a connection closed on it.
//!
//! `watch` reloads the files on SIGHUP and whenever their contents change (checked every two
//! seconds, by a digest of the bytes; nothing of the key is kept but rustls's own signing key).
//! A pair that loads replaces the one in force for new connections (open ones keep theirs); one
//! that does not is refused with an error in the log and the pair in force stays. A certificate
//! renewed by writing the two files one after the other is therefore picked up once both are
//! written.
//!
//! Key material never reaches a log line or a `Debug` output: errors name the file and what is
//! wrong with it, never its bytes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// How often the files are read to see whether they changed.
const POLL: Duration = Duration::from_secs(2);

/// How long a new connection has to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The certificate chain and private key files (PEM).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain: the server's certificate first, then intermediates.
    pub cert: PathBuf,
    /// The private key of the first certificate (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why a certificate and key could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsConfigError {
    /// A file could not be read.
    #[error("cannot read {what} file {path}: {reason}")]
    Read {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// The certificate file holds no certificate, or one that cannot be read.
    #[error("the certificate file {path}: {reason}")]
    Certificate { path: PathBuf, reason: String },
    /// The key file holds no private key, or one that cannot be used.
    #[error("the private key file {path}: {reason}")]
    Key { path: PathBuf, reason: String },
    /// The key is not the certificate's, or rustls refused the pair.
    #[error("the certificate {cert} and the key {key} do not go together: {reason}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
}

/// The TLS configuration in force for new connections, and the files it is reloaded from.
/// Cloning shares it. Its `Debug` names the files and the certificate's fingerprint only.
#[derive(Clone)]
pub struct ServerTls {
    inner: Arc<Inner>,
}

struct Inner {
    files: TlsFiles,
    current: RwLock<Loaded>,
    /// What the last refused reload read (a digest of the bytes, or the read error), so that an
    /// unforced reload does not refuse the same files again every poll.
    last_refused: Mutex<Option<String>>,
}

/// A configuration and what it was made from.
struct Loaded {
    config: Arc<rustls::ServerConfig>,
    /// SHA-256 of the two files' bytes, to see whether they changed.
    digest: [u8; 32],
    /// SHA-256 of the server's certificate (DER), hex, for the log.
    fingerprint: String,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.inner.files.cert)
            .field("key", &self.inner.files.key)
            .field("fingerprint", &self.fingerprint())
            .finish()
    }
}

/// What a reload came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// The files are as loaded; nothing was done.
    Unchanged,
    /// The new pair is in force for new connections; its certificate's SHA-256 fingerprint.
    Replaced { fingerprint: String },
    /// The new pair was refused; the pair in force stays.
    Refused(TlsConfigError),
}

impl ServerTls {
    /// Reads and checks the certificate and key in `files`.
    pub fn load(files: TlsFiles) -> Result<ServerTls, TlsConfigError> {
        let loaded = load(&files, read_files(&files)?)?;
        Ok(ServerTls {
            inner: Arc::new(Inner {
                files,
                current: RwLock::new(loaded),
                last_refused: Mutex::new(None),
            }),
        })
    }

    /// The files the configuration is (re)loaded from.
    pub fn files(&self) -> &TlsFiles {
        &self.inner.files
    }

    /// The configuration for a new connection.
    pub fn config(&self) -> Arc<rustls::ServerConfig> {
        self.read().config.clone()
    }

    /// The SHA-256 fingerprint (hex) of the certificate in force.
    pub fn fingerprint(&self) -> String {
        self.read().fingerprint.clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Loaded> {
        self.inner
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the files again and, if they changed (or `forced`), puts the new pair in force.
    /// Unforced, files refused last time and not changed since are [`Reloaded::Unchanged`].
    /// Reads files: blocking, but small.
    pub fn reload(&self, forced: bool) -> Reloaded {
        let files = &self.inner.files;
        let (seen, outcome) = match read_files(files) {
            Err(e) => (e.to_string(), Err(e)),
            Ok(bytes) => {
                let d = digest(&bytes);
                if !forced && d == self.read().digest {
                    return Reloaded::Unchanged;
                }
                (hex(&d), load(files, bytes))
            }
        };
        let mut last_refused = self
            .inner
            .last_refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match outcome {
            Ok(loaded) => {
                let fingerprint = loaded.fingerprint.clone();
                *self
                    .inner
                    .current
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = loaded;
                *last_refused = None;
                Reloaded::Replaced { fingerprint }
            }
            Err(_) if !forced && last_refused.as_deref() == Some(seen.as_str()) => {
                Reloaded::Unchanged
            }
            Err(e) => {
                *last_refused = Some(seen);
                Reloaded::Refused(e)
            }
        }
    }
}

/// The two files' bytes.
struct FileBytes {
    cert: Vec<u8>,
    key: Vec<u8>,
}

fn read_files(files: &TlsFiles) -> Result<FileBytes, TlsConfigError> {
    let read = |what: &'static str, path: &Path| {
        std::fs::read(path).map_err(|e| TlsConfigError::Read {
            what,
            path: path.to_owned(),
            reason: e.to_string(),
        })
    };
    Ok(FileBytes {
        cert: read("the certificate", &files.cert)?,
        key: read("the private key", &files.key)?,
    })
}

fn digest(bytes: &FileBytes) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((bytes.cert.len() as u64).to_be_bytes());
    h.update(&bytes.cert);
    h.update(&bytes.key);
    h.finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// A rustls server configuration from the files' bytes: ring, TLS 1.2 and 1.3, HTTP/1.1.
fn load(files: &TlsFiles, bytes: FileBytes) -> Result<Loaded, TlsConfigError> {
    let digest = digest(&bytes);
    let cert_error = |reason: String| TlsConfigError::Certificate {
        path: files.cert.clone(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(&bytes.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| cert_error(format!("a certificate could not be read: {e}")))?;
    let Some(first) = certs.first() else {
        return Err(cert_error("no PEM certificate in it".to_owned()));
    };
    let fingerprint = hex(&Sha256::digest(first.as_ref()));
    // The PEM error names the file's structure (a missing END line, bad base64), never its
    // content.
    let key = PrivateKeyDer::from_pem_slice(&bytes.key).map_err(|e| TlsConfigError::Key {
        path: files.key.clone(),
        reason: match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no PEM private key in it (PKCS#8, PKCS#1 or SEC1)".to_owned()
            }
            e => format!("the private key could not be read: {e}"),
        },
    })?;
    drop(bytes);
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let signing_key =
        provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| TlsConfigError::Key {
                path: files.key.clone(),
                reason: format!("the key cannot sign: {e}"),
            })?;
    let pair_error = |reason: String| TlsConfigError::Pair {
        cert: files.cert.clone(),
        key: files.key.clone(),
        reason,
    };
    let certified = rustls::sign::CertifiedKey::new(certs, signing_key);
    certified
        .keys_match()
        .map_err(|e| pair_error(e.to_string()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| pair_error(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(OneCertificate(Arc::new(certified))));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Loaded {
        config: Arc::new(config),
        digest,
        fingerprint,
    })
}

/// Why a connection's TLS handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeFailed {
    /// The client spoke plain HTTP; it was answered 400 saying to use `https://`.
    #[error("the client spoke plain HTTP (answered 400: use https://)")]
    PlainHttp,
    /// Not done within [`HANDSHAKE_TIMEOUT`].
    #[error("not done within {HANDSHAKE_TIMEOUT:?}")]
    Timeout,
    /// The client went away, sent something that is not TLS, or refused the certificate.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The server is shutting down.
    #[error("shutting down")]
    Shutdown,
}

/// What a plain-HTTP client gets from a TLS port.
fn plain_http_answer() -> Vec<u8> {
    let body = "This port of the MCP gateway speaks TLS: use https:// (and wss://).\n";
    format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The server side of TLS on an accepted connection, with the configuration `acceptor` holds,
/// within [`HANDSHAKE_TIMEOUT`]. A client whose first byte is a letter (an HTTP method) rather
/// than a TLS handshake record gets a plain 400 naming `https://`.
pub(crate) async fn accept<S>(
    acceptor: tokio_rustls::TlsAcceptor,
    mut io: S,
) -> Result<tokio_rustls::server::TlsStream<Rewound<S>>, HandshakeFailed>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let handshake = async {
        let mut first = [0u8; 1];
        if io.read(&mut first).await? == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
        }
        // 0x16: a TLS handshake record.
        if first[0].is_ascii_alphabetic() {
            io.write_all(&plain_http_answer()).await?;
            let _ = io.shutdown().await;
            return Err(HandshakeFailed::PlainHttp);
        }
        let io = Rewound {
            first: Some(first[0]),
            inner: io,
        };
        Ok(acceptor.accept(io).await?)
    };
    tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake)
        .await
        .unwrap_or(Err(HandshakeFailed::Timeout))
}

/// An accepted connection: plain, or the server side of TLS over it.
#[derive(Debug)]
pub(crate) enum ServerStream<S> {
    Plain(S),
    Tls(Box<tokio_rustls::server::TlsStream<Rewound<S>>>),
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> tokio::io::AsyncRead
    for ServerStream<S>
{
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            ServerStream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite
    for ServerStream<S>
{
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ServerStream::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            ServerStream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            ServerStream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            ServerStream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A stream whose first byte was read already (to tell TLS from plain HTTP): reads give it
/// back first.
#[derive(Debug)]
pub(crate) struct Rewound<S> {
    first: Option<u8>,
    inner: S,
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Rewound<S> {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() > 0 {
            if let Some(b) = this.first.take() {
                buf.put_slice(&[b]);
                return std::task::Poll::Ready(Ok(()));
            }
        }
        std::pin::Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Rewound<S> {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// Presents the one certificate chain to every client.
struct OneCertificate(Arc<rustls::sign::CertifiedKey>);

impl std::fmt::Debug for OneCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OneCertificate")
    }
}

impl rustls::server::ResolvesServerCert for OneCertificate {
    fn resolve(
        &self,
        _client_hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// Reloads `tls` on SIGHUP and whenever its files change, until the task is aborted.
pub(crate) async fn watch(tls: ServerTls) {
    let mut hup = crate::hangup::Hangup::new();
    loop {
        let forced = hup.next(POLL).await;
        let trigger = if forced { "SIGHUP" } else { "file change" };
        let files = tls.files();
        match tls.reload(forced) {
            Reloaded::Unchanged => {}
            Reloaded::Replaced { fingerprint } => tracing::info!(
                cert = %files.cert.display(),
                trigger,
                sha256 = %fingerprint,
                "TLS certificate reloaded; new connections use it"
            ),
            // Said once per refused content (and on every SIGHUP).
            Reloaded::Refused(e) => tracing::error!(
                trigger,
                "TLS certificate and key refused: {e}; the ones in force stay"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA of the test's own and certificates it issues, as PEM.
    struct Ca(rcgen::CertifiedIssuer<'static, rcgen::KeyPair>);

    impl Ca {
        fn new() -> Ca {
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            let key = rcgen::KeyPair::generate().unwrap();
            Ca(rcgen::CertifiedIssuer::self_signed(params, key).unwrap())
        }

        /// (certificate PEM, key PEM, certificate DER) for `localhost`.
        fn issue(&self) -> (String, String, Vec<u8>) {
            let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &self.0).unwrap();
            (cert.pem(), key.serialize_pem(), cert.der().to_vec())
        }
    }

    fn scratch(what: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gateway-tls-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn files(dir: &Path) -> TlsFiles {
        TlsFiles {
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
        }
    }

    fn write(files: &TlsFiles, cert: &str, key: &str) {
        std::fs::write(&files.cert, cert).unwrap();
        std::fs::write(&files.key, key).unwrap();
    }

    #[test]
    fn a_pair_that_does_not_work_is_refused_naming_the_file_and_never_the_key() {
        let dir = scratch("refused");
        let f = files(&dir);
        let ca = Ca::new();
        let (cert, key, der) = ca.issue();
        let (_, other_key, _) = ca.issue();
        write(&f, &cert, &key);
        let tls = ServerTls::load(f.clone()).unwrap();
        assert_eq!(tls.fingerprint(), hex(&Sha256::digest(&der)));
        let shown = format!("{tls:?}");
        assert!(
            shown.contains("cert.pem") && !shown.contains("PRIVATE"),
            "{shown}"
        );

        let key_body: String = key.lines().nth(1).unwrap().to_owned();
        let cases: [(&str, &str, &str); 4] = [
            (&cert, &other_key, "do not go together"),
            ("not a certificate", &key, "no PEM certificate"),
            (&cert, "", "no PEM private key"),
            (&cert, &cert, "no PEM private key"),
        ];
        for (c, k, want) in cases {
            write(&f, c, k);
            let e = ServerTls::load(f.clone()).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
            assert!(!e.contains(&key_body[..20]), "{e}");
        }
        std::fs::remove_file(&f.key).unwrap();
        let e = ServerTls::load(f).unwrap_err();
        assert!(matches!(e, TlsConfigError::Read { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_reload_replaces_a_good_pair_and_keeps_the_old_one_for_a_bad_one() {
        let dir = scratch("reload");
        let f = files(&dir);
        let ca = Ca::new();
        let (cert1, key1, der1) = ca.issue();
        let (cert2, key2, der2) = ca.issue();
        write(&f, &cert1, &key1);
        let tls = ServerTls::load(f.clone()).unwrap();
        let first = tls.config();
        assert_eq!(tls.reload(false), Reloaded::Unchanged);
        assert!(matches!(tls.reload(true), Reloaded::Replaced { .. }));

        // Half a renewal: the new certificate with the old key. Refused, once.
        std::fs::write(&f.cert, &cert2).unwrap();
        assert!(matches!(
            tls.reload(false),
            Reloaded::Refused(TlsConfigError::Pair { .. })
        ));
        assert_eq!(tls.reload(false), Reloaded::Unchanged);
        assert!(matches!(tls.reload(true), Reloaded::Refused(_)));
        assert_eq!(tls.fingerprint(), hex(&Sha256::digest(&der1)));
        // The other half: in force for new connections.
        std::fs::write(&f.key, &key2).unwrap();
        let fingerprint = hex(&Sha256::digest(&der2));
        assert_eq!(
            tls.reload(false),
            Reloaded::Replaced {
                fingerprint: fingerprint.clone()
            }
        );
        assert_eq!(tls.fingerprint(), fingerprint);
        assert!(!Arc::ptr_eq(&first, &tls.config()));
        // A vanished file is refused; the pair in force stays.
        std::fs::remove_file(&f.cert).unwrap();
        assert!(matches!(
            tls.reload(false),
            Reloaded::Refused(TlsConfigError::Read { .. })
        ));
        assert_eq!(tls.reload(false), Reloaded::Unchanged);
        assert_eq!(tls.fingerprint(), fingerprint);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
