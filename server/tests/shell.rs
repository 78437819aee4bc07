//! Issue 14's "done when", through the real `gateway` binary against a real `gateway demo`:
//! every gateway tool is a command whose flags are its arguments and whose JSON is the MCP
//! result (the parity test walks `tools/list`); a claim in one command refuses another
//! identity's write, naming the holder; `listen` exits 0 on a channel message and 2 at its
//! deadline; `doctor` passes on the demo and names exactly the broken projects of a broken
//! one; a closed port is named with the setting that chose it.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sled_sim::{McpClient, TokioConnect};

const BIN: &str = env!("CARGO_BIN_EXE_gateway");

/// The flags every shell command has besides its tool's arguments: the shell's own, and the
/// binary's global ones.
const COMMON_FLAGS: &[&str] = &[
    "--url",
    "--token-file",
    "--ca-file",
    "--agent-file",
    "--json",
    "--help",
    "--version",
    "--log-json",
    "--worker-threads",
];

struct Demo {
    child: Child,
    url: String,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `gateway demo` with `args` and reads its MCP endpoint from the banner.
fn start(args: &[&str]) -> Demo {
    let mut child = Command::new(BIN)
        .arg("demo")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the gateway binary runs");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut url = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("the banner is text");
        if let Some(u) = line.trim().strip_prefix("MCP endpoint: ") {
            url = Some(u.to_owned());
            break;
        }
    }
    Demo {
        child,
        url: url.expect("the demo prints its MCP endpoint"),
    }
}

/// A scratch directory for one test's identity files (and its HOME).
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gateway-shell-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A shell user: the gateway's URL in MCP_GATEWAY_URL and an identity file of their own.
struct User {
    url: String,
    home: PathBuf,
    agent_file: PathBuf,
}

impl User {
    fn new(url: &str, dir: &Path, name: &str) -> User {
        User {
            url: url.to_owned(),
            home: dir.to_owned(),
            agent_file: dir.join(format!("{name}.agent")),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("MCP_GATEWAY_URL", &self.url)
            .env("MCP_GATEWAY_AGENT_FILE", &self.agent_file)
            .env("HOME", &self.home)
            .env_remove("XDG_STATE_HOME")
            .env_remove("MCP_GATEWAY_TOKEN")
            .env("RUST_LOG", "error");
        c
    }

    /// Runs `gateway ARGS` to the end (stdout is a pipe: JSON output).
    fn run(&self, args: &[&str]) -> Output {
        self.command(args)
            .output()
            .expect("the gateway binary runs")
    }

    /// Runs a command that must succeed; its JSON output.
    fn json(&self, args: &[&str]) -> Value {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "gateway {args:?}: {:?}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("gateway {args:?} printed no JSON ({e}): {out:?}"))
    }

    /// The identity file's handle and public name.
    fn identity(&self) -> (String, String) {
        let v: Value =
            serde_json::from_str(&std::fs::read_to_string(&self.agent_file).unwrap()).unwrap();
        (
            v["handle"].as_str().unwrap().to_owned(),
            v["agent"].as_str().unwrap().to_owned(),
        )
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The same call over MCP, without a session: the result's structuredContent.
async fn mcp(url: &str, tool: &str, arguments: Value) -> Value {
    let mut c = McpClient::connect(TokioConnect, url)
        .await
        .expect("the demo listens");
    let r = c
        .tools_call(json!(1), tool, arguments)
        .await
        .expect("an answer");
    assert!(r.get("error").is_none(), "{tool}: {r}");
    r["result"]["structuredContent"].clone()
}

/// Drops what changes from one moment to the next (ages, durations, event counts), so two
/// answers a few milliseconds apart compare equal.
fn steady(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| {
                    !(k.ends_with("ms_ago")
                        || k.as_str() == "took_ms"
                        || k.as_str() == "expires_in_ms"
                        || k.as_str() == "events")
                })
                .map(|(k, v)| (k.clone(), steady(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(steady).collect()),
        v => v.clone(),
    }
}

/// Waits until every project of the demo in `live` has a live uplink.
async fn wait_live(url: &str, live: &[&str]) {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let s = mcp(url, "list_projects", json!({})).await;
        let now: Vec<&str> = s["projects"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["live"] == true)
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        if live.iter().all(|p| now.contains(p)) {
            return;
        }
        assert!(Instant::now() < until, "not live: {now:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The long flags in a command's `--help`.
fn help_flags(help: &str) -> BTreeSet<String> {
    help.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-h, ")
                .or_else(|| {
                    l.split_once(", ")
                        .filter(|(s, _)| s.len() == 2)
                        .map(|(_, r)| r)
                })
                .unwrap_or(l);
            let flag: String = l
                .strip_prefix("--")?
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
                .collect();
            Some(format!("--{flag}"))
        })
        .collect()
}

/// The parity test: `tools/list`'s gateway tools against the commands, their flags, and their
/// JSON output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gateway_tool_is_a_command_with_its_arguments_and_the_same_answer() {
    let demo = start(&[]);
    wait_live(&demo.url, &["alpha", "beta", "gamma"]).await;
    let dir = scratch("parity");
    let user = User::new(&demo.url, &dir, "parity");

    // tools/list, walked: the gateway's own tools are the ones the core names.
    let mut c = McpClient::connect(TokioConnect, &demo.url).await.unwrap();
    let listed = c.tools_list(json!(1), None).await.unwrap();
    let gateway_tools: Vec<Value> = listed["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| gateway_core::GATEWAY_TOOLS.contains(&t["name"].as_str().unwrap()))
        .cloned()
        .collect();
    assert_eq!(gateway_tools.len(), gateway_core::GATEWAY_TOOLS.len());

    let help = text(&user.run(&["--help"]).stdout);
    let commands: BTreeSet<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .map(|s| s.trim_end_matches(',').to_owned())
        .collect();
    for tool in &gateway_tools {
        let name = tool["name"].as_str().unwrap();
        // switch_project sets a session's default project; the shell has no session.
        if name == "switch_project" {
            assert!(!commands.contains("switch-project"));
            continue;
        }
        let command = name.replace('_', "-");
        assert!(
            commands.contains(&command),
            "the gateway tool {name} has no command `gateway {command}`; commands: {commands:?}"
        );
        let out = user.run(&[&command, "--help"]);
        assert!(out.status.success(), "gateway {command} --help: {out:?}");
        let flags: BTreeSet<String> = help_flags(&text(&out.stdout))
            .into_iter()
            .filter(|f| !COMMON_FLAGS.contains(&f.as_str()))
            .collect();
        let arguments: BTreeSet<String> = tool["inputSchema"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .map(|p| format!("--{}", p.replace('_', "-")))
            .collect();
        assert_eq!(
            flags, arguments,
            "gateway {command}'s flags against {name}'s arguments"
        );
    }
    assert!(
        help.contains("[alias: health]"),
        "`gateway health` is an alias:\n{help}"
    );

    // Each read-only command's JSON is the MCP result of the same call.
    let (handle, _) = {
        user.json(&["checkin", "--project", "beta"]);
        user.identity()
    };
    user.json(&[
        "board-set",
        "shell/parity",
        "{\"n\":1}",
        "--project",
        "beta",
    ]);
    let cases: Vec<(Vec<&str>, &str, Value)> = vec![
        (vec!["list-projects"], "list_projects", json!({})),
        (vec!["health"], "gateway_health", json!({})),
        (vec!["gateway-health"], "gateway_health", json!({})),
        (vec!["fleet-identity"], "fleet_identity", json!({})),
        (
            vec!["fleet-identity", "--project", "gamma"],
            "fleet_identity",
            json!({"project": "gamma"}),
        ),
        (
            vec!["aggregate-pipeline-status", "--timeout-ms", "3000"],
            "aggregate_pipeline_status",
            json!({"timeout_ms": 3000}),
        ),
        (
            vec!["roster", "--project", "beta"],
            "roster",
            json!({"project": "beta", "agent": handle}),
        ),
        (
            vec!["claims", "--project", "beta"],
            "claims",
            json!({"project": "beta", "agent": handle}),
        ),
        (
            vec!["board-get", "shell/parity", "--project", "beta"],
            "board_get",
            json!({"key": "shell/parity", "project": "beta", "agent": handle}),
        ),
        (
            vec!["board-list", "--project", "beta", "--prefix", "shell/"],
            "board_list",
            json!({"prefix": "shell/", "project": "beta", "agent": handle}),
        ),
        (
            vec!["call", "show", "--project", "beta", "story_id=beta-1"],
            "show",
            json!({"story_id": "beta-1", "project": "beta"}),
        ),
    ];
    for (args, tool, arguments) in cases {
        // Two answers a moment apart can differ (a relay event between them): compare again.
        let mut tries = 0;
        loop {
            let shell = user.json(&args);
            let direct = mcp(&demo.url, tool, arguments.clone()).await;
            if steady(&shell) == steady(&direct) {
                break;
            }
            tries += 1;
            assert!(
                tries < 3,
                "gateway {args:?} printed\n{shell}\nbut MCP {tool} answered\n{direct}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_refuses_another_identitys_write_naming_the_holder() {
    let demo = start(&[]);
    wait_live(&demo.url, &["alpha", "beta", "gamma"]).await;
    let dir = scratch("claim");
    let (ann, bob) = (
        User::new(&demo.url, &dir, "ann"),
        User::new(&demo.url, &dir, "bob"),
    );

    let claim = ann.json(&["claim", "story:beta-1", "--project", "beta"]);
    assert_eq!(claim["acquired"], true, "{claim}");
    let fence = claim["fence"].as_u64().unwrap();
    let (_, holder) = ann.identity();

    // Another identity's write is refused at the gateway, naming the holder.
    let move_to = |user: &User, stage: &str| {
        user.run(&[
            "move-story",
            "--project",
            "beta",
            "story_id=beta-1",
            &format!("stage={stage}"),
        ])
    };
    let refused = move_to(&bob, "review");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let err = text(&refused.stderr);
    assert!(
        err.contains(&format!("leased by {holder}")) && err.contains("[lease_held]"),
        "{err}"
    );
    assert!(refused.stdout.is_empty());

    // The holder, in a later command, writes (fenced) and releases: the same holder.
    let moved = move_to(&ann, "review");
    assert!(moved.status.success(), "{moved:?}");
    let again = ann.json(&["claim", "story:beta-1", "--project", "beta"]);
    assert_eq!(again["reentrant"], true, "{again}");
    assert_eq!(again["fence"].as_u64(), Some(fence));
    let released = ann.json(&["release", "story:beta-1", "--project", "beta"]);
    assert_eq!(released["released"], true, "{released}");
    assert!(move_to(&bob, "done").status.success());

    // Releasing what one does not hold is an error, with its kind.
    let out = bob.run(&["release", "story:beta-1", "--project", "beta"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("[no_lease]"), "{out:?}");

    // beta's sled has accepted ann's fence: doctor sees it below the gateway's next grant.
    let out = ann.run(&["doctor"]);
    let report = text(&out.stdout);
    assert!(
        report.lines().any(|l| l.starts_with(&format!(
            "ok   fences beta: the sled's highest accepted fence ({fence}, from whoami's"
        ))),
        "{report}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_exits_0_on_a_channel_message_and_2_at_its_deadline() {
    let demo = start(&[]);
    wait_live(&demo.url, &["alpha", "beta", "gamma"]).await;
    let dir = scratch("listen");
    let listener = User::new(&demo.url, &dir, "listener");

    let started = Instant::now();
    let child = listener
        .command(&["listen", "--project", "beta", "--until", "+60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It waits: its agent is on beta's roster.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if listener.agent_file.exists() {
            let (_, name) = listener.identity();
            let roster = mcp(
                &demo.url,
                "roster",
                json!({"project": "beta", "agent": listener.identity().0}),
            )
            .await;
            if roster["agents"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["agent"] == name.as_str())
            {
                break;
            }
        }
        assert!(Instant::now() < until, "listen never checked in");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Another session sends to beta's channel.
    let mut other = McpClient::connect(TokioConnect, &demo.url).await.unwrap();
    other.initialize().await.unwrap();
    let sent = other
        .tools_call(
            json!(2),
            "send",
            json!({"project": "beta", "body": "build is green"}),
        )
        .await
        .unwrap();
    let id = sent["result"]["structuredContent"]["id"].clone();
    assert!(id.is_u64(), "{sent}");

    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(30));
    let wake: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(wake["woke"], true, "{wake}");
    assert_eq!(wake["project"], "beta");
    assert!(
        wake["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["kind"] == "message" && r["to"] == "channel" && r["id"] == id),
        "{wake}"
    );

    // Unread, the message wakes the next listen at once too: a listen never takes it.
    let t = Instant::now();
    let out = listener.run(&["listen", "--project", "beta", "--until", "+20"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let again: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(again["reasons"], wake["reasons"], "{again}");

    // Nothing for a newcomer: exit 2 at the deadline, not before.
    let quiet = User::new(&demo.url, &dir, "quiet");
    let t = Instant::now();
    let out = quiet.run(&["listen", "--project", "gamma", "--until", "+2"]);
    let took = t.elapsed();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty());
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(10),
        "{took:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The FAIL lines of a doctor run, by check.
fn failing(out: &Output) -> Vec<String> {
    text(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("FAIL "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_passes_on_the_demo_and_names_exactly_the_broken_projects() {
    let dir = scratch("doctor");
    let healthy = start(&[]);
    let broken = start(&["--stopped", "beta", "--impostor", "gamma"]);
    wait_live(&healthy.url, &["alpha", "beta", "gamma"]).await;

    let doctor = User::new(&healthy.url, &dir, "doctor");
    let out = doctor.run(&["doctor"]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    let report = text(&out.stdout);
    for check in [
        "mcp:",
        "auth:",
        "project alpha:",
        "project gamma:",
        "whoami beta:",
        "leases alpha:",
        "message alpha:",
        "board alpha:",
        "fences gamma:",
        "agent:",
    ] {
        assert!(
            report
                .lines()
                .any(|l| l.starts_with(&format!("ok   {check}"))),
            "no passing `{check}` line:\n{report}"
        );
    }
    assert!(report.contains("protocol 2025-11-25 agreed"), "{report}");

    // The broken fleet: exactly beta (no uplink) and gamma (identity refused), failing first.
    let doctor = User::new(&broken.url, &dir, "doctor");
    let until = Instant::now() + Duration::from_secs(30);
    let out = loop {
        let out = doctor.run(&["doctor"]);
        if failing(&out).len() == 2 || Instant::now() > until {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    let fails = failing(&out);
    assert_eq!(fails.len(), 2, "{}", text(&out.stdout));
    assert!(
        fails[0].starts_with("project beta: no live uplink"),
        "{fails:?}"
    );
    assert!(
        fails[1].starts_with("project gamma: identity refused"),
        "{fails:?}"
    );
    assert!(text(&out.stdout)
        .lines()
        .take(2)
        .all(|l| l.starts_with("FAIL")));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_closed_port_is_named_with_the_setting_that_chose_it() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/mcp");
    let dir = scratch("closed");
    let user = User::new(&url, &dir, "closed");

    let one_line = |out: &Output| {
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        err
    };
    let err = one_line(&user.run(&["list-projects"]));
    assert!(
        err.contains(&url) && err.contains("from MCP_GATEWAY_URL"),
        "{err}"
    );
    let err = one_line(&user.run(&["claim", "x", "--url", &url]));
    assert!(err.contains(&url) && err.contains("from --url"), "{err}");
    let err = one_line(&user.run(&["listen", "--until", "+1", "--url", &url]));
    assert!(err.contains(&url), "{err}");

    let out = user.run(&["doctor", "--url", &url]);
    assert_eq!(out.status.code(), Some(1));
    let report = text(&out.stdout);
    assert_eq!(report.lines().count(), 1, "{report}");
    assert!(
        report.starts_with("FAIL mcp: cannot reach the gateway at")
            && report.contains("from --url"),
        "{report}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
