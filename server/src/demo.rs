//! `gateway demo`: the gateway with an emulated fleet, all in this process, optionally with a
//! fleet that has problems (stopped sleds, slow ones, stalled relays, impostors, sleds reachable
//! only over HTTP), to try the fleet tools on; with `--real`, also one real MCP server through
//! gateway-sled's connector (`demo_real`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use gateway_core::{ProjectSpec, ReadOnlyTools, Registry};
use gateway_server::ServerOptions;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::demo_real::{self, Real, RealFlags};
use crate::{bind, log_registry, shutdown_signal, McpFlags};

/// How often the demo's gateway probes a project without a live uplink.
pub(crate) const DEMO_PROBE_INTERVAL: Duration = Duration::from_secs(2);
/// How often each demo sled sends a relay `sync` event.
pub(crate) const DEMO_RELAY_INTERVAL: Duration = Duration::from_secs(5);
/// How long without a relay event makes a demo sled's relay stale.
pub(crate) const DEMO_RELAY_STALE_AFTER: Duration = Duration::from_secs(15);
/// How long the impostors wait at most for the real sleds to be live (and pinned).
const IMPOSTOR_WAIT: Duration = Duration::from_secs(10);

/// The fleet's problems, for `gateway demo`. Each takes comma-separated project names.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct DemoFaults {
    /// Projects with no sled at all: no uplink, nothing on their HTTP port.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub(crate) stopped: Vec<String>,
    /// Slow sleds: NAME=MS makes that sled take MS milliseconds per call.
    #[arg(long, value_name = "NAME=MS", value_delimiter = ',', value_parser = parse_slow)]
    pub(crate) slow: Vec<(String, u64)>,
    /// Sleds whose event relay is stalled: they answer calls but send no relay events.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub(crate) stalled: Vec<String>,
    /// Besides the real sled, an impostor with the wrong identity key tries to connect (once
    /// the real one is pinned); it is refused (close 4007) and retries with backoff.
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub(crate) impostor: Vec<String>,
    /// Sleds that serve only their HTTP port, no uplink: their health comes from probes.
    #[arg(long = "http-only", value_name = "NAMES", value_delimiter = ',')]
    pub(crate) http_only: Vec<String>,
    /// Sleds with no uplink whose HTTP port accepts connections but never answers: the probes
    /// time out.
    #[arg(long = "http-silent", value_name = "NAMES", value_delimiter = ',')]
    pub(crate) http_silent: Vec<String>,
    /// Keep the pinned sled keys in this file (default: in memory, for the demo's life).
    #[arg(long = "pin-file", value_name = "PATH")]
    pub(crate) pin_file: Option<PathBuf>,
    /// Turn on client authentication with the token in FILE (repeatable, one caller per file;
    /// at least 16 characters, surrounding white space ignored). Without it the demo lets
    /// every caller in without a token.
    #[arg(long = "client-token-file", value_name = "FILE")]
    pub(crate) client_token_file: Vec<PathBuf>,
}

/// The client tokens in `files`, each checked as projects.toml's `client_tokens` are.
fn client_tokens(files: &[PathBuf]) -> Result<Vec<gateway_core::Secret>, String> {
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f)
                .map_err(|e| format!("--client-token-file {}: {e}", f.display()))?;
            let token = text.trim();
            if token.len() < 16 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "--client-token-file {}: a client token is at least 16 characters, without white space",
                    f.display()
                ));
            }
            Ok(gateway_core::Secret::new(token))
        })
        .collect()
}

/// Reads one `--slow` item, `NAME=MS`.
fn parse_slow(item: &str) -> Result<(String, u64), String> {
    let (name, ms) = item
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=MS, e.g. eta=4000; got {item:?}"))?;
    let ms = ms
        .trim()
        .parse::<u64>()
        .map_err(|_| format!("the milliseconds in {item:?} are not a whole number"))?;
    Ok((name.trim().to_owned(), ms))
}

/// How one demo project runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// A sled with an uplink and an HTTP port: the usual.
    Uplink,
    /// Nothing at all.
    Stopped,
    /// Only the HTTP port, answering.
    HttpOnly,
    /// Only the HTTP port, silent.
    HttpSilent,
}

/// The checked fleet plan: how each project runs, and its problems.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub(crate) modes: BTreeMap<String, Mode>,
    pub(crate) slow: BTreeMap<String, Duration>,
    pub(crate) stalled: BTreeSet<String>,
    pub(crate) impostor: BTreeSet<String>,
}

impl Plan {
    /// Checks the faults against the demo's project names: every name must be one of them,
    /// a project has at most one of --stopped, --http-only and --http-silent, and --slow,
    /// --stalled and --impostor need the project's real sled on its uplink.
    pub(crate) fn new(names: &[String], f: &DemoFaults) -> Result<Plan, String> {
        let known: BTreeSet<&str> = names.iter().map(String::as_str).collect();
        let check = |flag: &str, list: &mut dyn Iterator<Item = &String>| -> Result<(), String> {
            for name in list {
                if !known.contains(name.as_str()) {
                    return Err(format!(
                        "{flag}: unknown project {name:?}; the demo's projects are {} (--projects N runs more)",
                        names.join(", ")
                    ));
                }
            }
            Ok(())
        };
        check("--stopped", &mut f.stopped.iter())?;
        check("--slow", &mut f.slow.iter().map(|(n, _)| n))?;
        check("--stalled", &mut f.stalled.iter())?;
        check("--impostor", &mut f.impostor.iter())?;
        check("--http-only", &mut f.http_only.iter())?;
        check("--http-silent", &mut f.http_silent.iter())?;

        let mut modes: BTreeMap<String, Mode> =
            names.iter().map(|n| (n.clone(), Mode::Uplink)).collect();
        let mut flag_of: BTreeMap<&str, &str> = BTreeMap::new();
        for (flag, mode, list) in [
            ("--stopped", Mode::Stopped, &f.stopped),
            ("--http-only", Mode::HttpOnly, &f.http_only),
            ("--http-silent", Mode::HttpSilent, &f.http_silent),
        ] {
            for name in list {
                if let Some(other) = flag_of.insert(name, flag) {
                    if other != flag {
                        return Err(format!(
                            "project {name:?} is in both {other} and {flag}; give it one"
                        ));
                    }
                }
                modes.insert(name.clone(), mode);
            }
        }
        let needs_uplink = |flag: &str, name: &str| -> Result<(), String> {
            match flag_of.get(name) {
                Some(other) => Err(format!(
                    "{flag} {name}: project {name:?} is {other}, so it has no sled on an uplink"
                )),
                None => Ok(()),
            }
        };
        for (name, _) in &f.slow {
            needs_uplink("--slow", name)?;
        }
        for name in &f.stalled {
            needs_uplink("--stalled", name)?;
        }
        for name in &f.impostor {
            needs_uplink("--impostor", name)?;
        }
        Ok(Plan {
            modes,
            slow: f
                .slow
                .iter()
                .map(|(n, ms)| (n.clone(), Duration::from_millis(*ms)))
                .collect(),
            stalled: f.stalled.iter().cloned().collect(),
            impostor: f.impostor.iter().cloned().collect(),
        })
    }

    fn with_mode(&self, mode: Mode) -> Vec<String> {
        self.modes
            .iter()
            .filter(|(_, m)| **m == mode)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// What the banner says about the fleet's problems, one line each; empty when none.
    pub(crate) fn summary(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let mut line = |label: &str, names: Vec<String>| {
            if !names.is_empty() {
                lines.push(format!("{label}: {}", names.join(", ")));
            }
        };
        line("stopped (no sled)", self.with_mode(Mode::Stopped));
        line(
            "slow",
            self.slow
                .iter()
                .map(|(n, d)| format!("{n} ({} ms per call)", d.as_millis()))
                .collect(),
        );
        line(
            "stalled relay",
            self.stalled.iter().cloned().collect::<Vec<_>>(),
        );
        line(
            "impostor (wrong key, refused with 4007)",
            self.impostor.iter().cloned().collect::<Vec<_>>(),
        );
        line(
            "HTTP only (no uplink, probed)",
            self.with_mode(Mode::HttpOnly),
        );
        line(
            "HTTP silent (no uplink, probes time out)",
            self.with_mode(Mode::HttpSilent),
        );
        lines
    }
}

/// Runs the demo until Ctrl-C.
pub(crate) async fn run(
    listen: SocketAddr,
    n: usize,
    seed: u64,
    latency_ms: Option<u64>,
    mcp: McpFlags,
    faults: DemoFaults,
    real: RealFlags,
) -> Result<(), String> {
    let names = sled_sim::demo_project_names(n);
    let plan = Plan::new(&names, &faults)?;
    // The real server, when asked for and Node is here; else the demo goes on without it and
    // says why (here, before the log, and in what it prints).
    let real = Real::resolve(&real, std::env::var_os("PATH").as_deref());
    if let Some(Real::Skipped(why)) = &real {
        eprintln!("{}", Real::skipped_notice(why));
    }

    // Each sled's HTTP port first, so the registry can name the real address and the
    // gateway's probes reach something. A stopped project's port is bound and let go: nothing
    // listens there, so a probe is refused.
    let mut ports: BTreeMap<String, TcpListener> = BTreeMap::new();
    let mut specs = Vec::new();
    for name in &names {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot bind a port for {name}'s sled: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("cannot read the bound address: {e}"))?;
        let mut spec = ProjectSpec::new(name.clone(), format!("http://{addr}"));
        // The demo's sleds are sled-sim: its `readOnlyHint`s say which tools `read` covers.
        spec.read_only_tools = ReadOnlyTools::Hints;
        specs.push(spec);
        if plan.modes[name] != Mode::Stopped {
            ports.insert(name.clone(), listener);
        }
    }
    // Uplinks are closed by default: the demo's projects take the sleds it starts, which
    // present this run's token, and nobody else's.
    let uplink_token = demo_uplink_token();
    for spec in &mut specs {
        spec.token = Some(uplink_token.clone());
    }
    // The real server's project is registered like the sleds' (its uplink must present a token
    // of this run, its own), with no HTTP port (the connector's projects need none), and its
    // `readOnlyHint`s are not trusted: a server nobody here wrote.
    let real_token = demo_uplink_token();
    if let Some(Real::Run(_)) = &real {
        let mut spec = ProjectSpec::new(demo_real::PROJECT.to_owned(), demo_real::URL.to_owned());
        spec.token = Some(real_token.clone());
        specs.push(spec);
    }
    let mut registry = Registry::from_projects(specs, names.first().map(String::as_str))
        .map_err(|e| format!("demo registry: {e}"))?;
    if !faults.client_token_file.is_empty() {
        let tokens = client_tokens(&faults.client_token_file)?;
        tracing::info!(
            tokens = tokens.len(),
            "client authentication on: every request to /mcp needs one of the demo's client tokens"
        );
        registry = registry.with_client_tokens(tokens);
    }

    let (listener, addr) = bind(listen).await?;
    log_registry(&registry);
    tracing::info!(%addr, "gateway listening");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut opts = ServerOptions::new(registry, rand::random());
    opts.core.wall_clock_ms = gateway_server::wall_clock_ms();
    mcp.apply(&mut opts);
    opts.core.probe_interval = DEMO_PROBE_INTERVAL;
    opts.core.relay_stale_after = DEMO_RELAY_STALE_AFTER;
    opts.pin_file = faults.pin_file.clone();
    // Sessions outlive nothing but the demo's own run: a temporary state directory.
    let state_dir = std::env::temp_dir().join(format!(
        "mcp-gateway-demo-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let store = crate::state_flags::open(&state_dir, false).await?;
    tracing::info!(dir = %state_dir.display(),
        "the demo keeps its sessions in a temporary state directory, removed when it stops");
    opts.store = Some(store.clone());
    // The real server's uplink is made in memory, as `gateway serve --connector` makes its
    // projects' (the same `/uplink` checks, no port dialed, one hop less).
    let real_connect = match &real {
        Some(Real::Run(_)) => {
            let (accept, connect) = gateway_server::in_process::pair();
            opts.in_process = Some(accept);
            Some(connect)
        }
        _ => None,
    };
    let server = tokio::spawn(gateway_server::serve(listener, opts, async {
        let _ = stop_rx.await;
    }));
    let gateway = format!("http://{addr}");

    let mut sled_opts = sled_sim::SledOptions {
        seed,
        jitter: Duration::ZERO,
        relay_interval: DEMO_RELAY_INTERVAL,
        latency_overrides: plan.slow.clone(),
        stalled_relay: plan.stalled.clone(),
        uplink_token: Some(uplink_token),
        ..Default::default()
    };
    if let Some(ms) = latency_ms {
        sled_opts.latency = Duration::from_millis(ms);
    }
    let on_uplink = plan.with_mode(Mode::Uplink);
    let fleet = sled_sim::Fleet::spawn(&gateway, &on_uplink, sled_opts.clone());
    let real_server = match (&real, real_connect) {
        (Some(Real::Run(command)), Some(connect)) => {
            tracing::info!(project = demo_real::PROJECT, command = %command.join(" "),
                "starting the real MCP server through gateway-sled's connector, in this process");
            Some(demo_real::Running::start(
                command.clone(),
                connect,
                &gateway,
                real_token,
                seed,
                &state_dir,
            )?)
        }
        _ => None,
    };

    // Each sled's own HTTP port.
    let mut http: Vec<JoinHandle<()>> = Vec::new();
    for (name, listener) in ports {
        let router = match plan.modes[&name] {
            Mode::HttpSilent => sled_sim::http::silent_router(),
            Mode::Uplink => match fleet.sled(&name) {
                Some(sled) => sled_sim::http::router(sled),
                None => continue,
            },
            Mode::HttpOnly => sled_sim::http::router(sled_sim::SharedSled::new(
                sled_sim::Sled::seeded(&name, sled_sim::fleet::sled_seed(seed, &name)),
            )),
            Mode::Stopped => continue,
        };
        http.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::warn!(project = %name, error = %e, "the sled's HTTP port stopped");
            }
        }));
    }

    // The impostors come once the real sleds are live, so the real keys are pinned first.
    let impostors: Vec<String> = plan.impostor.iter().cloned().collect();
    let impostor_fleet: Option<JoinHandle<sled_sim::Fleet>> = (!impostors.is_empty()).then(|| {
        let gateway = gateway.clone();
        let opts = sled_sim::SledOptions {
            wrong_key: plan.impostor.clone(),
            ..sled_opts.clone()
        };
        tokio::spawn(async move {
            wait_live(&gateway, &impostors).await;
            tracing::info!(projects = ?impostors, "starting the impostor sleds");
            sled_sim::Fleet::spawn(&gateway, &impostors, opts)
        })
    });

    print!(
        "{}",
        instructions(
            addr,
            &names,
            &plan,
            faults.pin_file.as_deref(),
            real.as_ref()
        )
    );

    shutdown_signal().await;
    // The real server first, so its uplink closes before the gateway goes.
    if let Some(r) = real_server {
        r.stop().await;
    }
    let _ = stop_tx.send(());
    let served = match server.await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(format!("the gateway task failed: {e}")),
    };
    store.close().await;
    if let Err(e) = std::fs::remove_dir_all(&state_dir) {
        tracing::warn!(dir = %state_dir.display(), error = %e, "the demo's state directory was not removed");
    }
    if let Some(task) = impostor_fleet {
        if task.is_finished() {
            if let Ok(f) = task.await {
                f.shutdown().await;
            }
        } else {
            task.abort();
        }
    }
    fleet.shutdown().await;
    for task in http {
        task.abort();
    }
    served
}

/// Waits until the gateway's `list_projects` says every one of `projects` is live, or
/// [`IMPOSTOR_WAIT`] has passed.
/// The uplink token of a demo's projects: random per run, known only to the demo's sleds.
pub(crate) fn demo_uplink_token() -> gateway_core::Secret {
    let bytes: [u8; 16] = rand::random();
    gateway_core::Secret::new(hex::encode(bytes))
}

async fn wait_live(gateway: &str, projects: &[String]) {
    let url = format!("{gateway}/mcp");
    let deadline = tokio::time::Instant::now() + IMPOSTOR_WAIT;
    while tokio::time::Instant::now() < deadline {
        let live = async {
            let mut c = gateway_client::McpClient::connect(gateway_client::TokioConnect, &url)
                .await
                .ok()?;
            let r = c
                .tools_call(json!(1), "list_projects", json!({}))
                .await
                .ok()?;
            let listed = r["result"]["structuredContent"]["projects"].as_array()?;
            Some(projects.iter().all(|name| {
                listed
                    .iter()
                    .any(|p| p["name"] == name.as_str() && p["live"] == true)
            }))
        };
        if live.await == Some(true) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::warn!(
        ?projects,
        "the real sleds are not live yet; starting the impostors anyway"
    );
}

/// What the demo prints: the MCP URL, the fleet's problems and settings, and curl lines; with
/// `--real`, the real server (or why it was not started) and a call of its `echo`.
pub(crate) fn instructions(
    addr: SocketAddr,
    names: &[String],
    plan: &Plan,
    pin_file: Option<&std::path::Path>,
    real: Option<&Real>,
) -> String {
    let second = names
        .get(1)
        .or(names.first())
        .map_or("alpha", String::as_str);
    let repin = plan.impostor.first().map_or(second, String::as_str);
    let json =
        "-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream'";
    let version = "-H 'MCP-Protocol-Version: 2025-11-25'";
    let problems = plan.summary();
    let problems = if problems.is_empty() {
        "  none: every sled is up (see `gateway demo --help` for --stopped, --slow, --stalled,\n  --impostor, --http-only, --http-silent)\n".to_owned()
    } else {
        problems.iter().map(|l| format!("  {l}\n")).collect()
    };
    let pins = match pin_file {
        Some(p) => format!("pinned in {}", p.display()),
        None => "pinned in memory (--pin-file PATH keeps them)".to_owned(),
    };
    let call = |id: u32, name: &str, args: &str| {
        format!(
            r#"  curl -s http://{addr}/mcp {json} -d '{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{name}","arguments":{args}}}}}'"#
        )
    };
    let (real_intro, real_step) = match real {
        None => (String::new(), String::new()),
        Some(Real::Skipped(why)) => (
            format!(
                "\nReal server: not started: {why} (`gateway demo --real` runs npm's\n\
                 {package} as project {project} when Node is installed).\n",
                package = demo_real::PACKAGE,
                project = demo_real::PROJECT,
            ),
            String::new(),
        ),
        Some(Real::Run(command)) => (
            format!(
                "\nAnd one real MCP server, project {project}: npm's {package}\n\
                 over stdio, through gateway-sled's connector in this process, with an uplink token\n\
                 of this run like the sleds'. Its command: {command}\n{fetch}",
                project = demo_real::PROJECT,
                package = demo_real::PACKAGE,
                command = command.join(" "),
                fetch = if command.first().is_some_and(|c| c == "npx") {
                    "(npx fetches the package on first use, which may take a minute; meanwhile\n\
                     gateway_health shows the server's state under `upstream`.)\n"
                } else {
                    ""
                },
            ),
            format!(
                "\n5. The real server: after `switch_project` to {project} in a session, tools/list shows\n\
                 its tools (echo, get-sum, ...), each with a `project` property; or name it in a call:\n\n{echo}\n",
                project = demo_real::PROJECT,
                echo = call(
                    8,
                    "echo",
                    &format!(
                        r#"{{"message":"hello from the gateway","project":"{}"}}"#,
                        demo_real::PROJECT
                    )
                ),
            ),
        ),
    };
    format!(
        r#"
MCP gateway demo: {n} projects ({list}), each with an emulated sled.
{real_intro}
  MCP endpoint: http://{addr}/mcp

Fleet problems:
{problems}
Fleet settings: probes every {probe} s for projects without an uplink; each sled relays an
event every {relay} s, and a relay silent for {stale} s is stale. Sled identity keys are
{pins}.

1. Start a session (note the Mcp-Session-Id header in the answer):

  curl -si http://{addr}/mcp {json} -d '{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{{}},"clientInfo":{{"name":"curl","version":"0"}}}}}}'

2. Finish the handshake and call a project's tool, naming the project in the arguments:

  curl -si http://{addr}/mcp {json} {version} -H 'Mcp-Session-Id: <id from above>' -d '{{"jsonrpc":"2.0","method":"notifications/initialized"}}'
  curl -s http://{addr}/mcp {json} {version} -H 'Mcp-Session-Id: <id from above>' -d '{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"create_story","arguments":{{"name":"Try the gateway","acceptance_criteria":["it answers"],"project":"{second}"}}}}}}'

3. List the projects without a session:

{list_projects}

4. The fleet tools (no session needed):

{health}
{aggregate}
{identity}

   Accept a new key for a project (after an impostor, or a sled really re-keyed):

{repin_call}
{real_step}
Ctrl-C stops the gateway and the sleds.
"#,
        n = names.len(),
        list = names.join(", "),
        probe = DEMO_PROBE_INTERVAL.as_secs(),
        relay = DEMO_RELAY_INTERVAL.as_secs(),
        stale = DEMO_RELAY_STALE_AFTER.as_secs(),
        list_projects = call(3, "list_projects", "{}"),
        health = call(4, "gateway_health", "{}"),
        aggregate = call(5, "aggregate_pipeline_status", "{}"),
        identity = call(6, "fleet_identity", "{}"),
        repin_call = call(
            7,
            "fleet_identity",
            &format!(r#"{{"action":"repin","project":"{repin}","key":"<its refused key>"}}"#)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        sled_sim::demo_project_names(10)
    }

    #[derive(Debug, clap::Parser)]
    struct P {
        #[command(flatten)]
        f: DemoFaults,
    }

    fn faults(args: &[&str]) -> DemoFaults {
        let mut argv = vec!["p"];
        argv.extend_from_slice(args);
        <P as clap::Parser>::try_parse_from(argv).unwrap().f
    }

    #[test]
    fn the_flags_parse_into_a_plan() {
        let f = faults(&[
            "--stopped",
            "delta,zeta",
            "--slow",
            "eta=4000,beta=10",
            "--stalled",
            "theta",
            "--impostor",
            "iota",
            "--http-only",
            "gamma",
            "--http-silent",
            "epsilon",
            "--pin-file",
            "/tmp/p.toml",
        ]);
        assert_eq!(f.stopped, ["delta", "zeta"]);
        assert_eq!(f.slow, [("eta".into(), 4000), ("beta".into(), 10)]);
        assert_eq!(
            f.pin_file.as_deref(),
            Some(std::path::Path::new("/tmp/p.toml"))
        );
        let plan = Plan::new(&names(), &f).unwrap();
        assert_eq!(plan.modes["delta"], Mode::Stopped);
        assert_eq!(plan.modes["gamma"], Mode::HttpOnly);
        assert_eq!(plan.modes["epsilon"], Mode::HttpSilent);
        assert_eq!(plan.modes["alpha"], Mode::Uplink);
        assert_eq!(plan.slow["eta"], Duration::from_millis(4000));
        assert!(plan.stalled.contains("theta") && plan.impostor.contains("iota"));
        let summary = plan.summary().join("\n");
        for part in [
            "stopped (no sled): delta, zeta",
            "eta (4000 ms per call)",
            "stalled relay: theta",
            "impostor",
            "iota",
            "HTTP only (no uplink, probed): gamma",
            "HTTP silent (no uplink, probes time out): epsilon",
        ] {
            assert!(summary.contains(part), "{part} in {summary}");
        }
    }

    #[test]
    fn an_unknown_name_lists_the_demo_projects() {
        for args in [
            &["--stopped", "alpha,nope"][..],
            &["--slow", "nope=5"],
            &["--stalled", "nope"],
            &["--impostor", "nope"],
            &["--http-only", "nope"],
            &["--http-silent", "nope"],
        ] {
            let e = Plan::new(&names(), &faults(args)).unwrap_err();
            assert!(e.contains(args[0]) && e.contains("\"nope\""), "{e}");
            assert!(e.contains("alpha, beta, gamma"), "{e}");
        }
    }

    #[test]
    fn contradictions_are_refused() {
        let e = Plan::new(
            &names(),
            &faults(&["--stopped", "beta", "--http-only", "beta"]),
        )
        .unwrap_err();
        assert!(e.contains("--stopped") && e.contains("--http-only"), "{e}");
        let e = Plan::new(
            &names(),
            &faults(&["--stopped", "beta", "--impostor", "beta"]),
        )
        .unwrap_err();
        assert!(e.contains("--impostor beta"), "{e}");
        let e = Plan::new(
            &names(),
            &faults(&["--http-silent", "beta", "--slow", "beta=1"]),
        )
        .unwrap_err();
        assert!(e.contains("--slow beta"), "{e}");
    }

    #[test]
    fn a_bad_slow_item_is_a_parse_error() {
        for bad in ["eta", "eta=", "eta=fast", "eta=-1"] {
            let e = <P as clap::Parser>::try_parse_from(["p", "--slow", bad]).unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{bad}");
        }
    }

    #[test]
    fn the_instructions_show_the_fleet_tools_and_problems() {
        let f = faults(&["--stopped", "delta", "--impostor", "iota"]);
        let plan = Plan::new(&names(), &f).unwrap();
        let text = instructions(
            "127.0.0.1:7878".parse().unwrap(),
            &names(),
            &plan,
            None,
            None,
        );
        for part in [
            r#""name":"gateway_health""#,
            r#""name":"aggregate_pipeline_status""#,
            r#""name":"fleet_identity","arguments":{}"#,
            r#""name":"fleet_identity","arguments":{"action":"repin","project":"iota","key":"<its refused key>"}"#,
            "stopped (no sled): delta",
            "probes every 2 s",
            "event every 5 s",
            "for 15 s is stale",
            "pinned in memory",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
        let text = instructions(
            "127.0.0.1:7878".parse().unwrap(),
            &names(),
            &Plan::new(&names(), &DemoFaults::default()).unwrap(),
            Some(std::path::Path::new("/tmp/pins.toml")),
            None,
        );
        assert!(text.contains("none: every sled is up"), "{text}");
        assert!(text.contains("pinned in /tmp/pins.toml"), "{text}");
        assert!(!text.contains("everything"), "{text}");
    }

    #[test]
    fn the_instructions_show_the_real_server_or_why_it_is_not_there() {
        let plan = Plan::new(&names(), &DemoFaults::default()).unwrap();
        let addr = "127.0.0.1:7878".parse().unwrap();
        let run = Real::Run(demo_real::default_command());
        let text = instructions(addr, &names(), &plan, None, Some(&run));
        for part in [
            "real MCP server, project everything: npm's @modelcontextprotocol/server-everything@2026.8.31",
            "npx -y @modelcontextprotocol/server-everything@2026.8.31 stdio",
            "npx fetches the package on first use",
            r#""name":"echo","arguments":{"message":"hello from the gateway","project":"everything"}"#,
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
        let run = Real::Run(vec!["node".into(), "/x/index.js".into(), "stdio".into()]);
        let text = instructions(addr, &names(), &plan, None, Some(&run));
        assert!(
            text.contains("Its command: node /x/index.js stdio"),
            "{text}"
        );
        assert!(!text.contains("npx fetches"), "{text}");
        let skipped = Real::Skipped("Node is not installed (no `npx` on PATH)".into());
        let text = instructions(addr, &names(), &plan, None, Some(&skipped));
        assert!(
            text.contains("Real server: not started: Node is not installed (no `npx` on PATH)"),
            "{text}"
        );
        assert!(!text.contains(r#""name":"echo""#), "{text}");
    }
}
