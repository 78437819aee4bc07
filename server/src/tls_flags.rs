//! `gateway serve`'s TLS flags: the certificate and key the gateway serves HTTPS and WSS with.

use std::path::PathBuf;

use gateway_server::tls::{ServerTls, TlsFiles};

/// Serving HTTPS and WSS (`gateway serve`).
#[derive(Debug, clap::Args)]
pub(crate) struct TlsFlags {
    /// Serve HTTPS and WSS on every port (/mcp, /uplink, /metrics) with the certificate chain in
    /// this PEM file (the server's certificate first). Re-read, with --tls-key, on SIGHUP and
    /// whenever the files change; a pair that does not load is refused and the one in force
    /// stays. Unset: plain HTTP, meant for loopback or behind a proxy that ends TLS.
    #[arg(
        long = "tls-cert",
        value_name = "FILE",
        env = "MCP_GATEWAY_TLS_CERT",
        requires = "tls_key"
    )]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key (PEM: PKCS#8, PKCS#1 or SEC1) of --tls-cert's certificate.
    #[arg(
        long = "tls-key",
        value_name = "FILE",
        env = "MCP_GATEWAY_TLS_KEY",
        requires = "tls_cert"
    )]
    pub(crate) tls_key: Option<PathBuf>,
}

impl TlsFlags {
    /// The certificate and key, loaded and checked, when given.
    pub(crate) fn load(&self) -> Result<Option<ServerTls>, String> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return Ok(None);
        };
        let files = TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
        };
        ServerTls::load(files).map(Some).map_err(|e| e.to_string())
    }
}
