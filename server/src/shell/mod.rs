//! The gateway from a shell: `gateway list-projects`, `gateway claim story:beta-1 --project
//! beta`, `gateway call show --project beta story_id=beta-1`, `gateway listen`,
//! `gateway doctor`.
//!
//! # How it works
//!
//! - **Generated commands.** Every gateway tool but `switch_project` (which needs a session)
//!   is a subcommand built at run time from [`gateway_core::gateway_tool_definitions`]: the
//!   name with `_` → `-`, one flag per `inputSchema` property (typed by the schema), and the
//!   required properties also positional ([`tools`]). A tool and its command cannot drift.
//! - **No session.** Each command POSTs `tools/call` without `Mcp-Session-Id` (the gateway
//!   serves sessionless requests; every call names its `project` or goes to the file's
//!   default), so a command is one request, leaves nothing open and needs no `DELETE`. Only
//!   `doctor` initializes, to report the agreed protocol version, and ends its session.
//! - **Who.** A caller without a session is an agent by the handle `checkin` issued. The
//!   handle is kept in a file ([`agent`]); the first command that needs it checks in, and a
//!   gateway that no longer knows it (it restarted) gets a fresh one, transparently.
//! - **Where.** `--url`, else `MCP_GATEWAY_URL`, else the demo's URL; every connection failure
//!   is one line naming the URL and which of the three chose it. `--token-file`, else
//!   `MCP_GATEWAY_TOKEN`, is sent as a bearer token; a 401 names the token's source. An
//!   `https://` gateway is verified against the CA certificates in `--ca-file`, else in the file
//!   `MCP_GATEWAY_CA_FILE` names, else the system's.
//! - **Output.** The tool's `structuredContent` as JSON (`--json`, the default when stdout is
//!   not a terminal), else readable lines and tables ([`render`]). A tool error (a JSON-RPC
//!   error or an `isError` result) prints its message and `data.kind` on stderr and exits 1.

mod agent;
mod doctor;
mod listen;
mod render;
mod tools;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Arg, ArgAction, ArgMatches, Command};
use gateway_client::{ClientError, HttpUrl, McpClient, TlsTrust, TokioConnect};
use serde_json::{json, Map, Value};

/// The gateway's MCP endpoint when neither `--url` nor [`URL_ENV`] says: the demo's.
pub(crate) const DEFAULT_URL: &str = "http://127.0.0.1:7878/mcp";
/// The environment variable naming the gateway's MCP endpoint.
pub(crate) const URL_ENV: &str = "MCP_GATEWAY_URL";
/// The environment variable holding a bearer token (the token itself, not a file).
pub(crate) const TOKEN_ENV: &str = "MCP_GATEWAY_TOKEN";
/// The environment variable naming the agent identity file.
pub(crate) const AGENT_FILE_ENV: &str = "MCP_GATEWAY_AGENT_FILE";

/// How long one request may take, unless the tool says longer (`wait`, the fan-out).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The commands the shell adds beside the generated ones.
const CALL: &str = "call";
const LISTEN: &str = "listen";
const DOCTOR: &str = "doctor";

/// The `gateway` subcommands that are not the shell's.
const SERVER_COMMANDS: &[&str] = &["serve", "demo", "stdio"];

/// Adds the shell's subcommands to the `gateway` command line.
pub(crate) fn augment(cmd: Command) -> Command {
    let examples = "\nFrom a shell (against `gateway demo`):\n  \
        gateway list-projects                          # every gateway tool is a command\n  \
        gateway health\n  \
        gateway call show --project beta story_id=beta-1\n  \
        gateway claim story:beta-1 --project beta      # as this shell's agent identity\n  \
        gateway listen --project beta --until +60      # exits 0 on an event, 2 at the deadline\n  \
        gateway doctor                                 # checks the deployment end to end";
    let after = cmd
        .get_after_help()
        .map(|h| format!("{h}\n{examples}"))
        .unwrap_or_else(|| examples.to_owned());
    let footer = help_footer();
    let mut cmd = cmd
        .after_help(after)
        .args(common_args().map(|a| a.help_heading(CLIENT_HEADING)))
        .allow_external_subcommands(true)
        .external_subcommand_value_parser(clap::value_parser!(String));
    for def in tools::shell_tools() {
        cmd = cmd.subcommand(
            tools::command_for(&def)
                .args(common_args())
                .after_help(footer.clone()),
        );
    }
    cmd.subcommand(
        tools::call_command()
            .args(common_args())
            .after_help(footer.clone()),
    )
    .subcommand(
        listen::command()
            .args(common_args())
            .after_help(footer.clone()),
    )
    .subcommand(doctor::command().args(common_args()).after_help(footer))
}

/// Runs a shell command, if `matches` names one (else `None`: a server command).
pub(crate) fn dispatch(matches: &ArgMatches) -> Option<ExitCode> {
    let (name, sub) = matches.subcommand()?;
    if SERVER_COMMANDS.contains(&name) {
        return None;
    }
    init_logs();
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let job = match name {
        CALL | LISTEN | DOCTOR => Job::Named(name.to_owned(), sub.clone()),
        _ => match tools::shell_tools()
            .into_iter()
            .find(|d| tools::command_name(d) == name)
        {
            Some(def) => Job::Tool(def, sub.clone()),
            None => {
                // Not a gateway command: a project tool by name (`gateway move-story …`),
                // read as `gateway call move_story …`.
                let rest: Vec<String> = sub
                    .get_many::<String>("")
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect();
                let argv = [format!("gateway {name}"), name.replace('-', "_")]
                    .into_iter()
                    .chain(rest);
                match tools::call_command()
                    .args(common_args())
                    .name(format!("gateway {name}"))
                    .try_get_matches_from(argv)
                {
                    Ok(m) => Job::External(name.to_owned(), m),
                    Err(e) => e.exit(),
                }
            }
        },
    };
    let m = match &job {
        Job::Named(_, m) | Job::Tool(_, m) | Job::External(_, m) => m,
    };
    let settings = match Settings::resolve(matches, m, &env) {
        Ok(s) => s,
        Err(line) => {
            eprintln!("gateway: {line}");
            return Some(ExitCode::from(2));
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gateway: cannot start the runtime: {e}");
            return Some(ExitCode::FAILURE);
        }
    };
    let code = rt.block_on(async move {
        let mut conn = Conn::new(settings);
        match job {
            Job::Named(n, m) if n == LISTEN => listen::run(&mut conn, &m).await,
            Job::Named(n, m) if n == DOCTOR => doctor::run(&mut conn, &m).await,
            Job::Named(_, m) => tools::run_call(&mut conn, &m, None).await,
            Job::Tool(def, m) => tools::run_tool(&mut conn, &def, &m).await,
            Job::External(n, m) => tools::run_call(&mut conn, &m, Some(&n)).await,
        }
    });
    rt.shutdown_timeout(Duration::from_millis(100));
    Some(ExitCode::from(code))
}

/// A shell command to run.
enum Job {
    /// `call`, `listen` or `doctor`.
    Named(String, ArgMatches),
    /// A generated gateway tool command, with the tool's definition.
    Tool(Value, ArgMatches),
    /// A project tool by its name, parsed as `call`.
    External(String, ArgMatches),
}

/// Logs go to stderr, quiet unless RUST_LOG says otherwise: stdout is the command's answer.
fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

/// The heading of the common flags given before the command (`gateway --url U list-projects`).
const CLIENT_HEADING: &str =
    "Client options (the shell's commands and stdio; here or after the command)";

/// The flags every shell command takes, after the command or before it: where the gateway is,
/// how to authenticate, the agent identity file, and the output format.
fn common_args() -> [Arg; 5] {
    [
        Arg::new("url").long("url").value_name("URL").help(format!(
            "The gateway's MCP endpoint [env: {URL_ENV}] [default: {DEFAULT_URL}]"
        )),
        Arg::new("token-file")
            .long("token-file")
            .value_name("FILE")
            .help(format!(
                "A file holding the bearer token for the gateway's client_tokens [else env \
                 {TOKEN_ENV}, the token itself]"
            )),
        Arg::new("ca-file")
            .long("ca-file")
            .value_name("FILE")
            .help(format!(
                "The CA certificates (PEM) an https:// gateway's certificate must chain to [env: \
                 {}] [default: the system's]",
                gateway_client::tls::CA_FILE_ENV
            )),
        Arg::new("agent-file")
            .long("agent-file")
            .value_name("FILE")
            .help(format!(
                "Where this shell's agent identity (the handle checkin issued) is kept [env: \
                 {AGENT_FILE_ENV}] (see below)"
            )),
        Arg::new("json")
            .long("json")
            .action(ArgAction::SetTrue)
            .help("Print JSON (the default when stdout is not a terminal)"),
    ]
}

/// Where the agent identity lives, for `--help`.
fn help_footer() -> String {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (url, _) = pick_url(None, &env);
    let (path, from) = agent::default_path(&url, &env);
    format!(
        "Agent identity: the handle from checkin is kept in a file you can read and delete, \
         one per gateway URL; the next command that needs it checks in again. For {url}: {} \
         ({from}).",
        path.display()
    )
}

/// Where the gateway is, who we are, how to print: from flags, then the environment. Its
/// `Debug` names where the token came from, never the token.
#[derive(Clone)]
pub(crate) struct Settings {
    /// The MCP endpoint.
    pub(crate) url: String,
    /// Which setting chose it, as a phrase ("from --url").
    pub(crate) url_from: String,
    /// The bearer token and where it came from.
    pub(crate) token: Option<(String, String)>,
    /// The certificate authorities an `https://` gateway is verified against.
    pub(crate) trust: TlsTrust,
    /// The agent identity file and what chose it.
    pub(crate) agent_file: PathBuf,
    pub(crate) agent_file_from: String,
    /// Print JSON rather than tables.
    pub(crate) json: bool,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("url", &self.url)
            .field("url_from", &self.url_from)
            .field("token_from", &self.token.as_ref().map(|(_, from)| from))
            .field("trust", &self.trust)
            .field("agent_file", &self.agent_file)
            .field("agent_file_from", &self.agent_file_from)
            .field("json", &self.json)
            .finish()
    }
}

/// The bearer token and where it came from: the file `--token-file` names (trimmed; empty is an
/// error), else `MCP_GATEWAY_TOKEN`, else none. The token is never taken from a flag's value,
/// so it stays off the command line. An error is a line to print (exit 2).
pub(crate) fn read_token(
    file: Option<&String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(String, String)>, String> {
    match (file, env(TOKEN_ENV)) {
        (Some(file), _) => {
            let text = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read the token file {file} (--token-file): {e}"))?;
            let token = text.trim().to_owned();
            if token.is_empty() {
                return Err(format!("the token file {file} (--token-file) is empty"));
            }
            Ok(Some((token, format!("--token-file {file}"))))
        }
        (None, Some(t)) if !t.trim().is_empty() => {
            Ok(Some((t.trim().to_owned(), TOKEN_ENV.to_owned())))
        }
        (None, _) => Ok(None),
    }
}

/// A common flag's value: given after the command, else before it
/// (`gateway --token-file F list-projects`, as `gateway list-projects --token-file F`).
pub(crate) fn common_flag<'a>(
    top: &'a ArgMatches,
    sub: &'a ArgMatches,
    id: &str,
) -> Option<&'a String> {
    let get = |m: &'a ArgMatches| m.try_get_one::<String>(id).ok().flatten();
    get(sub).or_else(|| get(top))
}

/// The common flags given before a command that does not take them (`serve`, `demo`; `stdio`
/// takes `--url`, `--token-file` and `--ca-file`), by their names: a mistake to refuse, not to
/// ignore.
pub(crate) fn misplaced_common_flags(top: &ArgMatches, command: &str) -> Vec<String> {
    let stdio_takes = ["url", "token-file", "ca-file"];
    common_args()
        .iter()
        .map(|a| a.get_id().as_str().to_owned())
        .filter(|id| top.value_source(id) == Some(clap::parser::ValueSource::CommandLine))
        .filter(|id| command != "stdio" || !stdio_takes.contains(&id.as_str()))
        .map(|id| format!("--{id}"))
        .collect()
}

/// The URL and the phrase that says where it came from.
pub(crate) fn pick_url(
    flag: Option<&String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> (String, String) {
    match (flag, env(URL_ENV)) {
        (Some(u), _) => (u.clone(), "from --url".to_owned()),
        (None, Some(u)) => (u, format!("from {URL_ENV}")),
        (None, None) => (
            DEFAULT_URL.to_owned(),
            format!("the default; set --url or {URL_ENV}"),
        ),
    }
}

impl Settings {
    /// Reads the common flags of the command's matches `m`, then those given before the
    /// command (`top`), then `env`. An error is a line to print (exit 2).
    pub(crate) fn resolve(
        top: &ArgMatches,
        m: &ArgMatches,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, String> {
        let (url, url_from) = pick_url(common_flag(top, m, "url"), env);
        HttpUrl::parse(&url).map_err(|e| format!("{e} ({url_from})"))?;
        let token = read_token(common_flag(top, m, "token-file"), env)?;
        let ca_file = common_flag(top, m, "ca-file").map(std::path::Path::new);
        let trust = TlsTrust::from_flag_or_env(ca_file, env).map_err(|e| e.to_string())?;
        let (agent_file, agent_file_from) = match common_flag(top, m, "agent-file") {
            Some(f) => (PathBuf::from(f), "from --agent-file".to_owned()),
            None => agent::default_path(&url, env),
        };
        Ok(Settings {
            url,
            url_from,
            token,
            trust,
            agent_file,
            agent_file_from,
            json: [m, top]
                .iter()
                .any(|m| m.try_get_one::<bool>("json").ok().flatten() == Some(&true))
                || !std::io::stdout().is_terminal(),
        })
    }
}

/// Why a command failed.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// The gateway could not be asked, or did not answer MCP: a line naming the URL.
    Transport(String),
    /// The gateway (or a sled) answered with an error: a JSON-RPC error, or an `isError`
    /// result.
    Tool {
        message: String,
        kind: Option<String>,
    },
}

impl Failure {
    /// The error's `data.kind` (or an `isError` result's `kind`).
    pub(crate) fn kind(&self) -> Option<&str> {
        match self {
            Failure::Tool { kind, .. } => kind.as_deref(),
            Failure::Transport(_) => None,
        }
    }

    /// The one line that says what went wrong.
    pub(crate) fn line(&self) -> String {
        match self {
            Failure::Transport(line) => line.clone(),
            Failure::Tool {
                message,
                kind: Some(kind),
            } => format!("{message} [{kind}]"),
            Failure::Tool {
                message,
                kind: None,
            } => message.clone(),
        }
    }
}

/// The shell's connection to the gateway: one HTTP/1 connection, opened on first use.
pub(crate) struct Conn {
    pub(crate) settings: Settings,
    client: Option<McpClient<TokioConnect>>,
    next_id: u64,
}

impl Conn {
    pub(crate) fn new(settings: Settings) -> Conn {
        Conn {
            settings,
            client: None,
            next_id: 0,
        }
    }

    /// A client for the gateway, connected (with the token, if any).
    pub(crate) async fn connect(&self) -> Result<McpClient<TokioConnect>, Failure> {
        let s = &self.settings;
        let mut c = McpClient::connect_with(TokioConnect, &s.url, s.trust.clone())
            .await
            .map_err(|e| self.transport(ClientError::Io(e)))?;
        c.set_bearer_token(self.settings.token.as_ref().map(|(t, _)| t.clone()));
        c.set_client_name("gateway-shell");
        Ok(c)
    }

    /// `tools/call` of `tool` with `arguments` (and `_meta`, if given), without a session: the
    /// result's `structuredContent` (or its text, as JSON if it is JSON), or why not.
    pub(crate) async fn call(
        &mut self,
        tool: &str,
        arguments: &Map<String, Value>,
        meta: Option<Value>,
        timeout: Option<Duration>,
    ) -> Result<Value, Failure> {
        if self.client.is_none() {
            self.client = Some(self.connect().await?);
        }
        self.next_id += 1;
        let mut params = json!({ "name": tool, "arguments": arguments });
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        let client = self.client.as_mut().expect("connected just above");
        client.set_timeout(Some(timeout.unwrap_or(REQUEST_TIMEOUT)));
        let response = client
            .request(json!(self.next_id), "tools/call", params)
            .await;
        match response {
            Ok(r) => tool_outcome(&r),
            Err(e) => Err(self.transport(e)),
        }
    }

    /// The one line for a request that failed before an MCP answer came.
    pub(crate) fn transport(&self, e: ClientError) -> Failure {
        let s = &self.settings;
        let (url, from) = (&s.url, &s.url_from);
        Failure::Transport(match e {
            ClientError::Io(e) => format!("cannot reach the gateway at {url} ({from}): {e}"),
            ClientError::Http { status: 401, .. } => match &s.token {
                Some((_, source)) => format!(
                    "{url} ({from}) refused the token from {source} (HTTP 401): it is not one \
                     of the gateway's client_tokens"
                ),
                None => format!(
                    "{url} ({from}) requires a bearer token (HTTP 401) and none was given: set \
                     --token-file FILE or {TOKEN_ENV}"
                ),
            },
            ClientError::Http { status, body } => {
                // A JSON-RPC error with an HTTP status (the stateless era's, a 400): the
                // gateway's own words.
                if let Ok(v) = serde_json::from_str::<Value>(&body) {
                    if v.get("error").is_some() {
                        if let Err(f) = tool_outcome(&v) {
                            return f;
                        }
                    }
                }
                let body: String = body.split_whitespace().collect::<Vec<_>>().join(" ");
                let body: String = body.chars().take(200).collect();
                format!("{url} ({from}) answered HTTP {status}: {body}")
            }
            ClientError::Json(e) => format!(
                "{url} ({from}) answered something that is not MCP (not JSON: {e}); is it the \
                 gateway's /mcp endpoint?"
            ),
            ClientError::Timeout(d) => {
                format!("no answer from {url} ({from}) within {} s", d.as_secs())
            }
            ClientError::Protocol(m) => format!("{url} ({from}): {m}"),
        })
    }
}

/// A JSON-RPC response to a `tools/call`: the result's structured content, or the failure.
pub(crate) fn tool_outcome(response: &Value) -> Result<Value, Failure> {
    if let Some(error) = response.get("error") {
        return Err(Failure::Tool {
            message: error["message"]
                .as_str()
                .map_or_else(|| error.to_string(), str::to_owned),
            kind: error["data"]["kind"].as_str().map(str::to_owned),
        });
    }
    let Some(result) = response.get("result") else {
        return Err(Failure::Tool {
            message: format!("an answer with neither result nor error: {response}"),
            kind: None,
        });
    };
    let text = result["content"][0]["text"].as_str();
    if result["isError"] == true {
        return Err(Failure::Tool {
            message: text.map_or_else(|| result.to_string(), str::to_owned),
            kind: result["structuredContent"]["kind"]
                .as_str()
                .map(str::to_owned),
        });
    }
    if let Some(s) = result.get("structuredContent") {
        return Ok(s.clone());
    }
    Ok(match text {
        Some(t) => serde_json::from_str(t).unwrap_or_else(|_| json!({ "text": t })),
        None => result.clone(),
    })
}

/// Prints a command's answer on stdout: JSON, or readable lines.
pub(crate) fn print_answer(settings: &Settings, value: &Value) {
    if settings.json {
        if std::io::stdout().is_terminal() {
            println!(
                "{}",
                serde_json::to_string_pretty(value).expect("a JSON value serialises")
            );
        } else {
            println!("{value}");
        }
    } else {
        print!("{}", render::render(value));
    }
}

/// Prints a failure on stderr; the exit status of a failed command.
pub(crate) fn fail(failure: &Failure) -> u8 {
    eprintln!("gateway: {}", failure.line());
    1
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<ArgMatches, clap::Error> {
        augment(crate::Cli::command()).try_get_matches_from(args)
    }

    #[test]
    fn the_augmented_cli_is_well_formed() {
        augment(crate::Cli::command()).debug_assert();
    }

    #[test]
    fn server_commands_are_not_the_shells() {
        let m = parse(&["gateway", "demo"]).unwrap();
        assert!(dispatch(&m).is_none());
    }

    /// Security review finding 16: the shell's settings hold the bearer token; their `Debug`
    /// names its source only. So do the stdio bridge's.
    #[test]
    fn debug_shows_no_token() {
        let secret = "Sup3rSecretToken-0123456789";
        let m = parse(&["gateway", "list-projects"]).unwrap();
        let env = |k: &str| (k == TOKEN_ENV).then(|| secret.to_owned());
        let s = Settings::resolve(&m, m.subcommand().unwrap().1, &env).unwrap();
        assert_eq!(s.token.as_ref().map(|(t, _)| t.as_str()), Some(secret));
        let shown = format!("{s:?}");
        assert!(
            !shown.contains(secret) && shown.contains(TOKEN_ENV),
            "{shown}"
        );
        let bridge = gateway_server::stdio::BridgeOptions {
            token: Some(gateway_server::stdio::BridgeToken {
                token: secret.into(),
                from: TOKEN_ENV.into(),
            }),
            ..gateway_server::stdio::BridgeOptions::default()
        };
        let shown = format!("{bridge:?}");
        assert!(
            !shown.contains(secret) && shown.contains(TOKEN_ENV),
            "{shown}"
        );
    }

    #[test]
    fn settings_come_from_flags_then_the_environment_then_defaults() {
        let m = parse(&["gateway", "list-projects"]).unwrap();
        let none = |_: &str| None;
        let s = Settings::resolve(&m, m.subcommand().unwrap().1, &none).unwrap();
        assert_eq!(s.url, DEFAULT_URL);
        assert!(s.url_from.contains("default"), "{}", s.url_from);
        assert!(s.token.is_none());

        let env = |k: &str| match k {
            URL_ENV => Some("http://10.0.0.1:9/mcp".to_owned()),
            TOKEN_ENV => Some("sekrit-token-value".to_owned()),
            AGENT_FILE_ENV => Some("/tmp/agent-x".to_owned()),
            _ => None,
        };
        let s = Settings::resolve(&m, m.subcommand().unwrap().1, &env).unwrap();
        assert_eq!(s.url, "http://10.0.0.1:9/mcp");
        assert_eq!(s.url_from, format!("from {URL_ENV}"));
        assert_eq!(s.token.as_ref().unwrap().1, TOKEN_ENV);
        assert_eq!(s.agent_file, PathBuf::from("/tmp/agent-x"));

        let m = parse(&["gateway", "list-projects", "--url", "http://h:1/mcp"]).unwrap();
        let s = Settings::resolve(&m, m.subcommand().unwrap().1, &env).unwrap();
        assert_eq!(
            (s.url.as_str(), s.url_from.as_str()),
            ("http://h:1/mcp", "from --url")
        );

        let m = parse(&["gateway", "list-projects", "--url", "https://h/mcp"]).unwrap();
        let s = Settings::resolve(&m, m.subcommand().unwrap().1, &none).unwrap();
        assert_eq!(s.url, "https://h/mcp");
        let m = parse(&["gateway", "list-projects", "--url", "wss://h/mcp"]).unwrap();
        let e = Settings::resolve(&m, m.subcommand().unwrap().1, &none).unwrap_err();
        assert!(e.contains("wss://h/mcp") && e.contains("--url"), "{e}");
        let m = parse(&[
            "gateway",
            "list-projects",
            "--ca-file",
            "/nonexistent/ca.pem",
        ])
        .unwrap();
        let e = Settings::resolve(&m, m.subcommand().unwrap().1, &none).unwrap_err();
        assert!(e.contains("/nonexistent/ca.pem"), "{e}");
    }

    /// Issue 31: the common flags work before the command too; after it, they win.
    #[test]
    fn common_flags_before_the_command() {
        let none = |_: &str| None;
        let m = parse(&[
            "gateway",
            "--url",
            "http://a:1/mcp",
            "--json",
            "list-projects",
        ])
        .unwrap();
        let s = Settings::resolve(&m, m.subcommand().unwrap().1, &none).unwrap();
        assert_eq!((s.url.as_str(), s.json), ("http://a:1/mcp", true));
        let m = parse(&[
            "gateway",
            "--url",
            "http://a:1/mcp",
            "call",
            "show",
            "--url",
            "http://b:2/mcp",
        ])
        .unwrap();
        let s = Settings::resolve(&m, m.subcommand().unwrap().1, &none).unwrap();
        assert_eq!(s.url, "http://b:2/mcp");
        let m = parse(&["gateway", "--token-file", "/nonexistent/tok", "health"]).unwrap();
        let e = Settings::resolve(&m, m.subcommand().unwrap().1, &none).unwrap_err();
        assert!(e.contains("/nonexistent/tok"), "{e}");

        let m = parse(&["gateway", "--url", "http://a:1/mcp", "--json", "stdio"]).unwrap();
        assert_eq!(misplaced_common_flags(&m, "stdio"), ["--json"]);
        let m = parse(&["gateway", "--token-file", "t", "serve", "--config", "p"]).unwrap();
        assert_eq!(misplaced_common_flags(&m, "serve"), ["--token-file"]);
        let m = parse(&["gateway", "list-projects", "--url", "http://a:1/mcp"]).unwrap();
        assert!(misplaced_common_flags(&m, "list-projects").is_empty());
    }

    #[test]
    fn tool_outcomes() {
        let ok = json!({"result": {"content": [{"type": "text", "text": "{}"}], "structuredContent": {"a": 1}}});
        assert_eq!(tool_outcome(&ok).unwrap(), json!({"a": 1}));
        let text = json!({"result": {"content": [{"type": "text", "text": "{\"b\":2}"}]}});
        assert_eq!(tool_outcome(&text).unwrap(), json!({"b": 2}));
        let err = json!({"error": {"code": -32000, "message": "Refused: held", "data": {"kind": "lease_held"}}});
        let f = tool_outcome(&err).unwrap_err();
        assert_eq!(f.kind(), Some("lease_held"));
        assert_eq!(f.line(), "Refused: held [lease_held]");
        let is_error = json!({"result": {"isError": true, "content": [{"type": "text", "text": "stale"}], "structuredContent": {"kind": "stale_fence"}}});
        assert_eq!(
            tool_outcome(&is_error).unwrap_err().line(),
            "stale [stale_fence]"
        );
    }
}
