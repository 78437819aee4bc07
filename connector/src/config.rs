//! What `gateway-sled` runs: the gateway to dial and, per project, the MCP server behind it.
//!
//! One server comes from flags (`--gateway URL --project NAME -- COMMAND ARGS...`); several
//! from a file (`--config sleds.toml`):
//!
//! ```toml
//! gateway = "https://gateway.example.com:7878"   # the gateway's base URL (wss:// uplinks with https);
//!                                                 # none for `gateway serve --connector`
//! state_dir = "/var/lib/gateway-sled"             # optional: identity keys (default ./gateway-sled-state)
//!
//! [[project]]
//! name = "memory"                                  # the project's name in the gateway's projects.toml
//! command = ["npx", "-y", "@modelcontextprotocol/server-memory"]
//! cwd = "/srv/memory"                              # optional: the child's working directory
//! env = { MEMORY_FILE_PATH = "/srv/memory/memory.json" }   # optional: added to its environment
//! token_file = "/run/secrets/memory-uplink-token"  # optional: the project's uplink token, or
//! # token_env = "MEMORY_UPLINK_TOKEN"             # the variable holding it (never on the command line)
//!
//! [[project]]
//! name = "search"
//! url = "http://127.0.0.1:3001/mcp"               # a Streamable HTTP server instead of a command
//! bearer_token_env = "SEARCH_TOKEN"                # optional: its bearer token (or bearer_token_file)
//! # Leases for a server that knows nothing of them: the argument naming what a tool writes.
//! leases = { "write_doc" = { argument = "title", kind = "doc" } }
//! # An argument may also name each string of an array ("names[]") or a field of each object
//! # of one ("docs[].title"): a call then writes one resource per item.
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gateway_core::Secret;

use crate::leases::LeasedArgument;
use gateway_core::lease_spot::LeaseSpot;
use serde::Deserialize;

/// The default directory of the identity keys, relative to the working directory.
pub const DEFAULT_STATE_DIR: &str = "gateway-sled-state";

/// What the connector runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectorConfig {
    /// The gateway's base URL (`http://host:port` or `https://host:port`); none in a file for
    /// `gateway serve --connector`, whose projects are served inside the gateway.
    pub gateway: Option<String>,
    /// Where each project's identity key is kept (`<name>.key`).
    pub state_dir: PathBuf,
    pub projects: Vec<ProjectConfig>,
}

/// One project: the MCP server that serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectConfig {
    pub name: String,
    pub upstream: Upstream,
    /// Where the uplink token comes from, if the project has one.
    pub token: TokenSource,
    /// The tools whose calls write a leasable resource, and the argument that names it.
    pub leases: BTreeMap<String, LeasedArgument>,
}

/// Where the project's MCP server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upstream {
    /// A child over stdio.
    Stdio {
        /// The child's program and arguments.
        command: Vec<String>,
        cwd: Option<PathBuf>,
        /// Added to the child's environment (which is otherwise the connector's).
        env: BTreeMap<String, String>,
    },
    /// A server over Streamable HTTP at `url`, with a bearer token for it if it wants one.
    Http { url: String, bearer: TokenSource },
}

/// Where a project's uplink token is read from: a file or an environment variable, never a
/// command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    None,
    File(PathBuf),
    Env(String),
}

impl TokenSource {
    /// The token, or why it cannot be read. An empty file or variable is an error: a project
    /// that names a source means to present a token.
    pub fn read(&self) -> Result<Option<Secret>, String> {
        let text = match self {
            TokenSource::None => return Ok(None),
            TokenSource::File(path) => std::fs::read_to_string(path).map_err(|e| {
                format!("cannot read the uplink token file {}: {e}", path.display())
            })?,
            TokenSource::Env(var) => std::env::var(var)
                .map_err(|_| format!("the uplink token variable {var} is not set"))?,
        };
        let token = text.trim();
        if token.is_empty() {
            return Err(match self {
                TokenSource::File(path) => {
                    format!("the uplink token file {} is empty", path.display())
                }
                _ => "the uplink token variable is empty".to_owned(),
            });
        }
        Ok(Some(Secret::new(token.to_owned())))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    gateway: Option<String>,
    state_dir: Option<PathBuf>,
    #[serde(default)]
    project: Vec<RawProject>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProject {
    name: String,
    command: Option<Vec<String>>,
    cwd: Option<PathBuf>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    url: Option<String>,
    bearer_token_file: Option<PathBuf>,
    bearer_token_env: Option<String>,
    token_file: Option<PathBuf>,
    token_env: Option<String>,
    #[serde(default)]
    leases: BTreeMap<String, LeasedArgument>,
}

/// A secret from a file or a variable, at most one of them (`what_file`, `what_env`).
fn source(file: Option<PathBuf>, env: Option<String>, what: &str) -> Result<TokenSource, String> {
    match (file, env) {
        (Some(_), Some(_)) => Err(format!("set {what}_file or {what}_env, not both")),
        (Some(f), None) => Ok(TokenSource::File(f)),
        (None, Some(v)) => Ok(TokenSource::Env(v)),
        (None, None) => Ok(TokenSource::None),
    }
}

impl RawProject {
    fn upstream(
        self,
    ) -> Result<
        (
            String,
            Upstream,
            TokenSource,
            BTreeMap<String, LeasedArgument>,
        ),
        String,
    > {
        let token = source(self.token_file, self.token_env, "token")?;
        let bearer = source(
            self.bearer_token_file,
            self.bearer_token_env,
            "bearer_token",
        )?;
        let upstream = match (self.command, self.url) {
            (Some(_), None) if bearer != TokenSource::None => {
                return Err("a bearer token is for a server at a url, not a command".into())
            }
            (Some(command), None) => Upstream::Stdio {
                command,
                cwd: self.cwd,
                env: self.env,
            },
            (None, Some(_)) if self.cwd.is_some() || !self.env.is_empty() => {
                return Err("cwd and env are for a command, not a server at a url".into())
            }
            (None, Some(url)) => Upstream::Http { url, bearer },
            _ => {
                return Err(
                    "set either command (a stdio server) or url (a Streamable HTTP server)".into(),
                )
            }
        };
        Ok((self.name, upstream, token, self.leases))
    }
}

impl ConnectorConfig {
    /// Parses a `sleds.toml`; `file` names it in errors.
    pub fn parse(file: &Path, text: &str) -> Result<ConnectorConfig, String> {
        let raw: RawFile =
            toml::from_str(text).map_err(|e| format!("{}: {}", file.display(), e.message()))?;
        let mut projects = Vec::with_capacity(raw.project.len());
        for (i, p) in raw.project.into_iter().enumerate() {
            let at = |m: String| format!("{}: project[{i}]: {m}", file.display());
            let (name, upstream, token, leases) = p.upstream().map_err(at)?;
            projects.push(ProjectConfig::from_flags(name, upstream, token, leases).map_err(at)?);
        }
        let config = ConnectorConfig {
            gateway: raw.gateway,
            state_dir: raw
                .state_dir
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR)),
            projects,
        };
        config
            .checked()
            .map_err(|m| format!("{}: {m}", file.display()))
    }

    /// Refuses what cannot run: no project, one named twice, a gateway URL that is not one.
    pub fn checked(self) -> Result<ConnectorConfig, String> {
        if let Some(gateway) = &self.gateway {
            sled_uplink::GatewayAddr::parse(gateway)
                .map_err(|e| format!("gateway: {}", e.reason))?;
        }
        if self.projects.is_empty() {
            return Err(
                "no project: add a [[project]] table (or pass --project and a command)".into(),
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        for p in &self.projects {
            if !seen.insert(p.name.as_str()) {
                return Err(format!("project '{}' is named twice", p.name));
            }
        }
        Ok(self)
    }
}

impl ProjectConfig {
    /// One project, checked: its name, and a command or a URL with a path.
    pub fn from_flags(
        name: String,
        upstream: Upstream,
        token: TokenSource,
        leases: BTreeMap<String, LeasedArgument>,
    ) -> Result<ProjectConfig, String> {
        for (tool, l) in &leases {
            if tool.is_empty() {
                return Err(format!("project '{name}': a lease needs a tool name"));
            }
            LeaseSpot::parse(&l.argument, &l.kind)
                .map_err(|e| format!("project '{name}': the lease of '{tool}': {e}"))?;
        }
        let name_ok = (1..=64).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !name_ok {
            return Err(format!(
                "'{name}' is not a project name (1 to 64 of A-Z a-z 0-9 _ . -)"
            ));
        }
        match &upstream {
            Upstream::Stdio { command, .. } if command.first().is_none_or(|c| c.is_empty()) => {
                return Err(format!("project '{name}' has no command"));
            }
            Upstream::Http { url, .. } => {
                let parsed = gateway_client::net::HttpUrl::parse(url)
                    .map_err(|e| format!("project '{name}': url: {}", e.reason))?;
                if parsed.path == "/" {
                    return Err(format!(
                        "project '{name}': the url names no path (a server's MCP endpoint is usually /mcp)"
                    ));
                }
            }
            Upstream::Stdio { .. } => {}
        }
        Ok(ProjectConfig {
            name,
            upstream,
            token,
            leases,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_file() {
        let text = r#"
gateway = "https://gateway.example.com:7878"
state_dir = "/var/lib/gateway-sled"

[[project]]
name = "memory"
command = ["npx", "-y", "@modelcontextprotocol/server-memory"]
cwd = "/srv/memory"
env = { MEMORY_FILE_PATH = "/srv/memory/memory.json" }
token_file = "/run/secrets/memory-uplink-token"

[[project]]
name = "everything"
command = ["node", "index.js", "stdio"]
token_env = "EVERYTHING_UPLINK_TOKEN"

leases = { "gzip-file-as-resource" = { argument = "name", kind = "file" } }

[[project]]
name = "search"
url = "http://127.0.0.1:3001/mcp"
bearer_token_env = "SEARCH_TOKEN"
"#;
        let c = ConnectorConfig::parse(Path::new("sleds.toml"), text).unwrap();
        assert_eq!(
            c.projects[1].leases["gzip-file-as-resource"],
            LeasedArgument {
                argument: "name".into(),
                kind: "file".into()
            }
        );
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/gateway-sled"));
        assert_eq!(c.projects.len(), 3);
        let Upstream::Stdio { env, cwd, .. } = &c.projects[0].upstream else {
            panic!("a command is a stdio server")
        };
        assert_eq!(env["MEMORY_FILE_PATH"], "/srv/memory/memory.json");
        assert_eq!(cwd.as_deref(), Some(Path::new("/srv/memory")));
        assert_eq!(
            c.projects[0].token,
            TokenSource::File("/run/secrets/memory-uplink-token".into())
        );
        assert_eq!(
            c.projects[1].token,
            TokenSource::Env("EVERYTHING_UPLINK_TOKEN".into())
        );
        assert_eq!(
            c.projects[2].upstream,
            Upstream::Http {
                url: "http://127.0.0.1:3001/mcp".into(),
                bearer: TokenSource::Env("SEARCH_TOKEN".into())
            }
        );
    }

    #[test]
    fn the_shipped_example_parses() {
        let path = Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/sleds.toml"
        ));
        let c = ConnectorConfig::parse(path, &std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(c.gateway.as_deref(), Some("http://127.0.0.1:7878"));
        let names: Vec<&str> = c.projects.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["memory", "everything"]);
        assert_eq!(c.projects[1].leases["gzip-file-as-resource"].kind, "file");
        let memory: Vec<(&str, &str)> = c.projects[0]
            .leases
            .iter()
            .map(|(tool, l)| (tool.as_str(), l.argument.as_str()))
            .collect();
        assert_eq!(
            memory,
            [
                ("add_observations", "observations[].entityName"),
                ("create_entities", "entities[].name"),
                ("delete_entities", "entityNames[]"),
                ("delete_observations", "deletions[].entityName"),
            ]
        );
        assert_eq!(
            c.projects[0].token,
            TokenSource::Env("MEMORY_UPLINK_TOKEN".into())
        );
        assert_eq!(
            c.projects[1].token,
            TokenSource::File("everything.token".into())
        );
    }

    #[test]
    fn refuses_what_cannot_run() {
        let parse = |t: &str| ConnectorConfig::parse(Path::new("s.toml"), t).unwrap_err();
        let one = |p: &str| {
            parse(&format!(
                "gateway = \"http://h:1\"\n[[project]]\nname=\"a\"\n{p}"
            ))
        };
        assert!(parse("gateway = \"http://h:1\"\n").contains("no project"));
        assert!(
            parse("gateway = \"ftp://h\"\n[[project]]\nname=\"a\"\ncommand=[\"x\"]\n")
                .contains("gateway")
        );
        assert!(
            parse("gateway = \"http://h:1\"\n[[project]]\nname=\"a b\"\ncommand=[\"x\"]\n")
                .contains("not a project name")
        );
        assert!(one("command=[]\n").contains("no command"));
        assert!(
            one("command=[\"x\"]\n[[project]]\nname=\"a\"\ncommand=[\"y\"]\n")
                .contains("named twice")
        );
        assert!(one("command=[\"x\"]\ntoken_env=\"A\"\ntoken_file=\"b\"\n").contains("not both"));
        assert!(parse("gateway = \"http://h:1\"\nshell = true\n").contains("unknown field"));
        assert!(one("command=[\"x\"]\nurl=\"http://h:2/mcp\"\n").contains("either command"));
        assert!(one("\n").contains("either command"));
        assert!(one("url=\"http://h:2\"\n").contains("no path"));
        assert!(one("url=\"http://h:2/mcp\"\ncwd=\"/\"\n").contains("not a server at a url"));
        assert!(one("command=[\"x\"]\nbearer_token_env=\"T\"\n").contains("not a command"));
    }
}
