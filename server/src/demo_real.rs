//! `gateway demo --real`: besides the emulated fleet, one real MCP server as a fourth project,
//! `everything`: npm's `@modelcontextprotocol/server-everything` run over stdio by
//! gateway-sled's connector (the `gateway-connector` library), in the demo's own process, its
//! uplink made in memory as `gateway serve --connector` makes its projects' (through the same
//! `/uplink` checks), with an uplink token of its own like the demo's sleds. Without Node on
//! PATH the demo starts without it and says why.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use gateway_connector::serve::{Served, Uplink};
use gateway_connector::{ProjectConfig, TokenSource, Upstream};
use gateway_server::in_process::InProcessConnect;

/// The real server's project.
pub(crate) const PROJECT: &str = "everything";
/// At the demo's stop, how long the calls running on the real server may take.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(5);
/// The npm package it runs, pinned (the version the tests run).
pub(crate) const PACKAGE: &str = "@modelcontextprotocol/server-everything@2026.8.31";
/// Where the gateway would probe the project while it has no uplink: nothing listens there
/// (the connector's projects have no inbound port), so a probe says it is down.
pub(crate) const URL: &str = "http://127.0.0.1:9";

/// `--real` and `--real-command`.
#[derive(Debug, Default, Clone, clap::Args)]
pub(crate) struct RealFlags {
    /// Also run one real MCP server as a fourth project, `everything`: npm's
    /// @modelcontextprotocol/server-everything over stdio, through gateway-sled's connector in
    /// this process (`npx -y @modelcontextprotocol/server-everything@2026.8.31 stdio`; needs
    /// Node). Without `npx` on PATH the demo starts without it and says why.
    #[arg(long)]
    pub(crate) real: bool,
    /// The command that starts the real server over stdio instead of npx, split at spaces (no
    /// quoting), e.g. "node /path/to/server-everything/dist/index.js stdio".
    #[arg(long = "real-command", value_name = "COMMAND", requires = "real",
          value_parser = parse_command)]
    pub(crate) real_command: Option<RealCommand>,
}

/// A command line, split at spaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RealCommand(pub(crate) Vec<String>);

fn parse_command(text: &str) -> Result<RealCommand, String> {
    let words: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
    if words.is_empty() {
        return Err("the command is empty; e.g. \"node /path/to/dist/index.js stdio\"".into());
    }
    Ok(RealCommand(words))
}

/// The default command: npx fetches the pinned package on first use.
pub(crate) fn default_command() -> Vec<String> {
    ["npx", "-y", PACKAGE, "stdio"].map(str::to_owned).to_vec()
}

/// What `--real` comes to, decided before the gateway starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Real {
    /// The real server runs with this command.
    Run(Vec<String>),
    /// It is not started, for this reason (the demo says so and goes on without it).
    Skipped(String),
}

impl Real {
    /// `--real`'s plan, with `path` as PATH: the command, or why it cannot run here. `None`
    /// without `--real`.
    pub(crate) fn resolve(flags: &RealFlags, path: Option<&OsStr>) -> Option<Real> {
        if !flags.real {
            return None;
        }
        let (command, given) = match &flags.real_command {
            Some(RealCommand(c)) => (c.clone(), true),
            None => (default_command(), false),
        };
        let program = &command[0];
        if found(program, path) {
            return Some(Real::Run(command));
        }
        Some(Real::Skipped(if !given {
            format!("Node is not installed (no `{program}` on PATH)")
        } else if program.contains('/') {
            format!("`{program}` (from --real-command) is not an executable file")
        } else {
            format!("`{program}` (from --real-command) is not on PATH")
        }))
    }

    /// The line the demo prints when the real server is not started.
    pub(crate) fn skipped_notice(why: &str) -> String {
        format!("gateway demo --real: {why}; starting without the real server")
    }
}

/// Whether `program` would start: a path to an executable file, or a name found so in one of
/// `path`'s directories (an empty entry is the working directory, as for execvp).
fn found(program: &str, path: Option<&OsStr>) -> bool {
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return executable(Path::new(program));
    }
    path.is_some_and(|path| {
        std::env::split_paths(path).any(|dir| {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".").to_path_buf()
            } else {
                dir
            };
            executable(&dir.join(program))
        })
    })
}

/// The real server and its uplink, running until [`Running::stop`].
pub(crate) struct Running {
    served: Served,
}

impl Running {
    /// Starts `command` as project [`PROJECT`]'s server over stdio and dials the gateway
    /// through `connect` for it, naming it `gateway` (`http://host:port`, what its identity
    /// proof is made for), with `token` and a key derived from `seed` (as the demo's sleds'
    /// are, so a `--pin-file` keeps matching).
    pub(crate) fn start(
        command: Vec<String>,
        connect: InProcessConnect,
        gateway: &str,
        token: gateway_core::Secret,
        seed: u64,
        state_dir: &Path,
    ) -> Result<Running, String> {
        let project = ProjectConfig::from_flags(
            PROJECT.to_owned(),
            Upstream::Stdio {
                command,
                cwd: None,
                env: BTreeMap::new(),
            },
            TokenSource::None,
            BTreeMap::new(),
        )?;
        let gateway = sled_sim::GatewayAddr::parse(gateway)
            .map_err(|e| format!("the demo's gateway address: {}", e.reason))?;
        let uplink = Uplink {
            gateway,
            token: Some(token),
            identity: sled_sim::sled_key(seed, PROJECT),
            tls: gateway_client::TlsTrust::default(),
        };
        let mut served = Served::new(DRAIN);
        served.spawn_with(connect, &project, state_dir, uplink)?;
        Ok(Running { served })
    }

    /// Closes the uplink (answering the calls running on it, up to [`DRAIN`]), then stops the
    /// server (its stdin closed, killed after 2 s).
    pub(crate) async fn stop(self) {
        self.served.stop().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(real: bool, command: Option<&str>) -> RealFlags {
        RealFlags {
            real,
            real_command: command.map(|c| parse_command(c).unwrap()),
        }
    }

    /// A directory holding an executable `name` (and nothing else).
    fn bin_dir(tag: &str, name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("demo-real-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(name);
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    #[test]
    fn without_real_nothing_is_planned() {
        assert_eq!(Real::resolve(&flags(false, None), None), None);
    }

    #[test]
    fn the_default_command_is_npx_with_the_pinned_package() {
        let dir = bin_dir("npx", "npx");
        let got = Real::resolve(&flags(true, None), Some(dir.as_os_str()));
        assert_eq!(
            got,
            Some(Real::Run(vec![
                "npx".into(),
                "-y".into(),
                "@modelcontextprotocol/server-everything@2026.8.31".into(),
                "stdio".into()
            ]))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn without_node_the_demo_says_why() {
        let empty = bin_dir("empty", "something-else");
        let Some(Real::Skipped(why)) = Real::resolve(&flags(true, None), Some(empty.as_os_str()))
        else {
            panic!("npx is not there")
        };
        assert_eq!(why, "Node is not installed (no `npx` on PATH)");
        assert_eq!(
            Real::skipped_notice(&why),
            "gateway demo --real: Node is not installed (no `npx` on PATH); starting without the real server"
        );
        assert!(matches!(
            Real::resolve(&flags(true, None), None),
            Some(Real::Skipped(_))
        ));
        let _ = std::fs::remove_dir_all(&empty);
    }

    #[test]
    fn a_given_command_is_split_and_checked() {
        let dir = bin_dir("node", "node");
        let got = Real::resolve(
            &flags(true, Some("node  /x/dist/index.js stdio")),
            Some(dir.as_os_str()),
        );
        assert_eq!(
            got,
            Some(Real::Run(vec![
                "node".into(),
                "/x/dist/index.js".into(),
                "stdio".into()
            ]))
        );
        let node = dir.join("node").display().to_string();
        let got = Real::resolve(&flags(true, Some(&format!("{node} a stdio"))), None);
        assert!(matches!(got, Some(Real::Run(c)) if c[0] == node));
        let Some(Real::Skipped(why)) =
            Real::resolve(&flags(true, Some("nodejs a")), Some(dir.as_os_str()))
        else {
            panic!("nodejs is not there")
        };
        assert!(
            why.contains("`nodejs` (from --real-command) is not on PATH"),
            "{why}"
        );
        let Some(Real::Skipped(why)) = Real::resolve(&flags(true, Some("/nope/node a")), None)
        else {
            panic!("/nope/node is not there")
        };
        assert!(why.contains("not an executable file"), "{why}");
        assert!(parse_command("  ").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
