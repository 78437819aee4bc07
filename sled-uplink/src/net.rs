//! How a sled finds the gateway ([`GatewayAddr`]). Connections and URLs are
//! `gateway-client`'s ([`Connect`], [`TokioConnect`], [`HttpUrl`]), re-exported here so that
//! `sled_sim::net::…` paths keep working.

pub use gateway_client::net::{Connect, HttpUrl, TokioConnect, UrlError};

/// Where the gateway is: parsed from `http://host:port` or `https://host:port`. The sled finds
/// the uplink endpoint (`ws://host:port/uplink`, `wss://` with TLS) and clients the MCP endpoint
/// (`http://host:port/mcp`, `https://` with TLS) from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayAddr {
    tls: bool,
    host: String,
    port: u16,
}

impl GatewayAddr {
    /// Parses `http://host:port` or `https://host:port` (a trailing `/` is fine; any other path
    /// is an error).
    pub fn parse(url: &str) -> Result<Self, UrlError> {
        let parsed = HttpUrl::parse(url)?;
        if parsed.path != "/" {
            return Err(UrlError {
                url: url.to_owned(),
                reason: format!(
                    "expected the gateway's base URL http(s)://host:port, without a path (got {:?})",
                    parsed.path
                ),
            });
        }
        Ok(GatewayAddr {
            tls: parsed.tls,
            host: parsed.host,
            port: parsed.port,
        })
    }

    /// Whether the gateway speaks TLS (`https://`, `wss://`).
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// The base URL as an [`HttpUrl`] (path `/`), for dialing.
    pub fn base_url(&self) -> HttpUrl {
        HttpUrl {
            tls: self.tls,
            host: self.host.clone(),
            port: self.port,
            path: "/".to_owned(),
        }
    }

    /// The host as written.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `host:port`.
    pub fn host_port(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// `ws://host:port/uplink` (`wss://` with TLS).
    pub fn uplink_url(&self) -> String {
        let ws = if self.tls { "wss" } else { "ws" };
        format!(
            "{ws}://{}{}",
            self.host_port(),
            gateway_core::uplink::UPLINK_PATH
        )
    }

    /// `http://host:port/mcp` (`https://` with TLS).
    pub fn mcp_url(&self) -> String {
        format!("{}/mcp", self)
    }
}

impl std::str::FromStr for GatewayAddr {
    type Err = UrlError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GatewayAddr::parse(s)
    }
}

impl std::fmt::Display for GatewayAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let http = if self.tls { "https" } else { "http" };
        write!(f, "{http}://{}", self.host_port())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_addr() {
        let g: GatewayAddr = "http://127.0.0.1:3000".parse().unwrap();
        assert_eq!(g.uplink_url(), "ws://127.0.0.1:3000/uplink");
        assert_eq!(g.mcp_url(), "http://127.0.0.1:3000/mcp");
        assert_eq!(g.to_string(), "http://127.0.0.1:3000");
        assert!(GatewayAddr::parse("http://127.0.0.1:3000/").is_ok());
        let e = GatewayAddr::parse("http://127.0.0.1:3000/mcp").unwrap_err();
        assert!(e.to_string().contains("without a path"), "{e}");
        let g: GatewayAddr = "https://gw.example".parse().unwrap();
        assert!(g.tls());
        assert_eq!(g.uplink_url(), "wss://gw.example:443/uplink");
        assert_eq!(g.mcp_url(), "https://gw.example:443/mcp");
        assert_eq!(g.to_string(), "https://gw.example:443");
    }
}
