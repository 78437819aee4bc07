//! `gateway serve --connector sleds.toml`: the MCP servers of a gateway-sled config file served
//! inside the gateway's process. Each project is what gateway-sled would make of it (its
//! server, supervised; its leases; its identity key, made on first run; its uplink token), and
//! its uplink the same protocol, dialed through the gateway's in-process connections
//! ([`gateway_server::in_process`]) instead of a socket: no port, no second process, one hop
//! less on every call (BENCHMARKS.md).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use gateway_connector::serve::{Served, Uplink};
use gateway_connector::GatewayAddr;
use gateway_connector::{identity, ConnectorConfig};
use gateway_server::in_process::InProcessConnect;

/// How long, at shutdown, the calls running on a connector project may take to be answered
/// (the gateway's own drain comes first: it answers or fails every call before it closes the
/// uplinks, so this is a bound, seldom waited for).
const DRAIN: Duration = Duration::from_secs(5);

/// A connector config read and checked before anything listens.
pub(crate) struct Planned {
    config: ConnectorConfig,
    file: std::path::PathBuf,
}

impl Planned {
    /// Reads `file`: a gateway-sled config without `gateway =` (its projects are served here).
    /// Every project's token and identity key are read (or the key made) later, at
    /// [`Planned::start`]; what is wrong with the file is said now.
    pub(crate) fn read(file: &Path) -> Result<Planned, String> {
        let text = std::fs::read_to_string(file)
            .map_err(|e| format!("--connector {}: {e}", file.display()))?;
        let config = ConnectorConfig::parse(file, &text).map_err(|e| format!("--connector {e}"))?;
        if let Some(gateway) = &config.gateway {
            return Err(format!(
                "--connector {}: the file names a gateway ({gateway}); the projects of \
                 `gateway serve --connector` are served inside this gateway: remove the line \
                 (it is for gateway-sled, which dials a gateway from a process of its own)",
                file.display()
            ));
        }
        Ok(Planned {
            config,
            file: file.to_owned(),
        })
    }

    /// Starts every project's server and uplink, dialing through `connect`. The uplinks name
    /// the gateway as a sled dialing `listen` would (`public_name` when the gateway has one),
    /// so their identity proofs are checked as any sled's.
    pub(crate) fn start(
        self,
        connect: InProcessConnect,
        listen: SocketAddr,
        public_name: Option<&str>,
    ) -> Result<Served, String> {
        let host = match public_name {
            Some(name) => name.to_owned(),
            None if listen.ip().is_unspecified() => "127.0.0.1".to_owned(),
            None => listen.ip().to_string(),
        };
        let host = match host.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => host,
        };
        let gateway =
            GatewayAddr::parse(&format!("http://{host}:{}", listen.port())).map_err(|e| {
                format!(
                    "the gateway's name for its in-process uplinks: {}",
                    e.reason
                )
            })?;
        let env = |k: &str| std::env::var(k).ok();
        // For servers at https:// URLs: the system's authorities, or GATEWAY_CA_FILE's.
        let tls =
            gateway_client::TlsTrust::from_flag_or_env(None, &env).map_err(|e| e.to_string())?;
        let mut served = Served::new(DRAIN);
        for project in &self.config.projects {
            let at = |e: String| {
                format!(
                    "--connector {}: project '{}': {e}",
                    self.file.display(),
                    project.name
                )
            };
            let token = project.token.read().map_err(at)?;
            let key =
                identity::load_or_create(&self.config.state_dir, &project.name).map_err(at)?;
            let uplink = Uplink {
                gateway: gateway.clone(),
                token,
                identity: key,
                tls: tls.clone(),
            };
            served
                .spawn_with(connect.clone(), project, &self.config.state_dir, uplink)
                .map_err(at)?;
            tracing::info!(project = %project.name, "serving in the gateway's process (--connector)");
        }
        Ok(served)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("serve-connector-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_file_naming_a_gateway_is_refused_with_the_reason() {
        let path = file(
            "with-gateway.toml",
            "gateway = \"http://127.0.0.1:7878\"\n[[project]]\nname = \"a\"\ncommand = [\"x\"]\n",
        );
        let Err(e) = Planned::read(&path) else {
            panic!("a file naming a gateway was taken")
        };
        assert!(e.contains("remove the line"), "{e}");
        let path = file(
            "without.toml",
            "[[project]]\nname = \"a\"\ncommand = [\"x\"]\n",
        );
        assert!(Planned::read(&path).is_ok());
        let path = file("none.toml", "");
        let Err(e) = Planned::read(&path) else {
            panic!("a file without projects was taken")
        };
        assert!(e.contains("no project"), "{e}");
    }
}
