//! `gateway serve`'s TLS flags: the certificate and key the gateway serves HTTPS and WSS with,
//! and the public name its sleds dial it by, which their identity proofs are bound to.

use std::net::SocketAddr;
use std::path::PathBuf;

use gateway_server::tls::{ServerTls, TlsFiles};

/// Serving HTTPS and WSS, and the name sleds reach the gateway by (`gateway serve`).
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
    /// The name sleds dial this gateway by: the host of their uplink URL (behind a proxy, the
    /// proxy's name), normally the name in the certificate. A sled signs it with the gateway's
    /// nonce and its project, and a proof made for another name is refused (close 4007), so a
    /// proof given to another gateway cannot be replayed here. Default: --listen's address,
    /// unless that is 0.0.0.0 or [::] (then proofs are not bound to a name).
    #[arg(long = "public-name", value_name = "HOST", env = "MCP_GATEWAY_PUBLIC_NAME",
          value_parser = parse_public_name)]
    pub(crate) public_name: Option<String>,
}

/// A host name or IP address, as a URL would hold it (no port, no path).
fn parse_public_name(value: &str) -> Result<String, String> {
    match gateway_client::HttpUrl::parse(&format!("https://{value}")) {
        Ok(u) if u.host == value => Ok(u.host),
        Ok(_) => Err("a host name or IP address, without a port or a path".to_owned()),
        Err(e) => Err(e.reason),
    }
}

impl TlsFlags {
    /// The name identity proofs must be made for: --public-name, else `listen`'s address
    /// unless it is unspecified.
    pub(crate) fn public_name(&self, listen: SocketAddr) -> Option<String> {
        if let Some(name) = &self.public_name {
            return Some(name.clone());
        }
        let ip = listen.ip();
        (!ip.is_unspecified()).then(|| ip.to_string())
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_public_name_is_a_host_and_defaults_to_a_specific_listen_address() {
        assert_eq!(parse_public_name("gw.example").unwrap(), "gw.example");
        assert_eq!(parse_public_name("[::1]").unwrap(), "[::1]");
        assert!(parse_public_name("gw.example:443").is_err());
        assert!(parse_public_name("gw example").is_err());
        assert!(parse_public_name("gw.example/x").is_err());
        let flags = |public_name: Option<&str>| TlsFlags {
            tls_cert: None,
            tls_key: None,
            public_name: public_name.map(str::to_owned),
        };
        let at = |a: &str| a.parse::<SocketAddr>().unwrap();
        assert_eq!(
            flags(None).public_name(at("127.0.0.1:7878")).as_deref(),
            Some("127.0.0.1")
        );
        assert_eq!(flags(None).public_name(at("0.0.0.0:7878")), None);
        assert_eq!(flags(None).public_name(at("[::]:7878")), None);
        assert_eq!(
            flags(Some("gw.example"))
                .public_name(at("0.0.0.0:7878"))
                .as_deref(),
            Some("gw.example")
        );
    }
}
