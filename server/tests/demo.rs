//! Issue 4's "done when", tried the way a new user would: the real `gateway demo` binary with a
//! fleet where some sleds are stopped, slow, stalled, or impersonated, asked over HTTP. Each
//! fleet tool answers within its deadline and names exactly the projects with problems; the
//! impostor is refused and shown; only an explicit re-pin changes a pin, and it lasts.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sled_sim::{McpClient, TokioConnect};

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
    let mut child = Command::new(env!("CARGO_BIN_EXE_gateway"))
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

async fn tool(url: &str, name: &str, arguments: Value) -> (Value, Duration) {
    let mut c = McpClient::connect(TokioConnect, url)
        .await
        .expect("the demo listens");
    let t = Instant::now();
    let r = c
        .tools_call(json!(1), name, arguments)
        .await
        .expect("an answer");
    (r, t.elapsed())
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("a list: {v}"))
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect()
}

/// Polls `check` on gateway_health every 250 ms until it holds or `limit` passes.
async fn health_until(url: &str, limit: Duration, check: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + limit;
    loop {
        let (r, _) = tool(url, "gateway_health", json!({})).await;
        let s = r["result"]["structuredContent"].clone();
        if check(&s) {
            return s;
        }
        assert!(
            Instant::now() < until,
            "gateway_health never got there: {}",
            s["summary"]
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_tools_name_exactly_the_projects_with_problems() {
    let dir = std::env::temp_dir().join(format!("gateway-demo-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pins = dir.join("pins.toml");
    let _ = std::fs::remove_file(&pins);
    let pins_arg = pins.display().to_string();
    let demo = start(&[
        "--projects",
        "12",
        "--stopped",
        "delta,zeta",
        "--slow",
        "eta=4000",
        "--stalled",
        "theta",
        "--impostor",
        "iota",
        "--http-only",
        "lambda",
        "--http-silent",
        "mu",
        "--pin-file",
        &pins_arg,
    ]);
    let url = demo.url.clone();

    // list_projects: every registered project, live only where a sled is connected.
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let (r, _) = tool(&url, "list_projects", json!({})).await;
        let live: Vec<String> = r["result"]["structuredContent"]["projects"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["live"] == true)
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect();
        if live.len() == 8 {
            assert_eq!(
                live,
                ["alpha", "beta", "gamma", "epsilon", "eta", "theta", "iota", "kappa"]
            );
            break;
        }
        assert!(Instant::now() < until, "sleds not live: {live:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // gateway_health: the stopped and silent ones down, the HTTP-only one up through its
    // probe, and the stalled relay stale once its 15 s threshold has passed.
    let s = health_until(&url, Duration::from_secs(30), |s| {
        s["summary"]["stale"] == json!(["theta"]) && s["summary"]["unknown"] == json!([])
    })
    .await;
    assert_eq!(names(&s["summary"]["down"]), ["delta", "zeta", "mu"]);
    assert_eq!(
        names(&s["summary"]["up"]),
        ["alpha", "beta", "gamma", "epsilon", "eta", "iota", "kappa", "lambda"]
    );
    let row = |p: &str| {
        s["projects"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["project"] == p)
            .unwrap()
            .clone()
    };
    assert_eq!(row("lambda")["via"], "http");
    assert!(row("mu")["reasons"][0]
        .as_str()
        .unwrap()
        .contains("no answer within"));
    assert!(row("delta")["reasons"][0]
        .as_str()
        .unwrap()
        .contains("refused"));
    assert_eq!(row("theta")["relay"]["status"], "stale");
    assert_eq!(row("alpha")["relay"]["status"], "fresh");

    // aggregate_pipeline_status: within its deadline, every project once, the slow one timed
    // out and the ones without a sled named.
    let (r, took) = tool(
        &url,
        "aggregate_pipeline_status",
        json!({"timeout_ms": 3000, "per_project_timeout_ms": 1500}),
    )
    .await;
    assert!(took < Duration::from_millis(3000), "took {took:?}");
    let s = &r["result"]["structuredContent"];
    assert_eq!(s["projects"].as_array().unwrap().len(), 12);
    let missing: Vec<(String, String)> = s["not_answered"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["project"].as_str().unwrap().to_owned(),
                n["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("delta", "no_uplink"),
        ("eta", "timed_out"),
        ("lambda", "no_uplink"),
        ("mu", "no_uplink"),
        ("zeta", "no_uplink"),
    ]
    .iter()
    .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
    .collect();
    assert_eq!(missing, want);
    assert_eq!(s["totals"]["answered"], 7);

    // fleet_identity: the impostor refused and shown, the real iota still verified.
    let (r, _) = tool(&url, "fleet_identity", json!({})).await;
    let s = &r["result"]["structuredContent"];
    assert_eq!(names(&s["summary"]["refused"]), ["iota"]);
    let iota = &s["projects"][8];
    assert_eq!(iota["project"], "iota");
    assert_eq!(iota["status"], "verified");
    let real_key = iota["pinned"].as_str().unwrap().to_owned();
    let impostor_key = iota["refused"]["key"].as_str().unwrap().to_owned();
    assert_ne!(real_key, impostor_key);
    assert_eq!(iota["live"], real_key.as_str());
    let on_disk = std::fs::read_to_string(&pins).unwrap();
    assert!(on_disk.contains(&real_key), "{on_disk}");
    assert!(!on_disk.contains(&impostor_key));

    // Only an explicit re-pin naming the project and the key changes the pin, and it is saved.
    let (r, _) = tool(&url, "fleet_identity", json!({"action": "repin"})).await;
    assert_eq!(r["error"]["code"], -32602);
    let (r, _) = tool(
        &url,
        "fleet_identity",
        json!({"action": "repin", "project": "iota"}),
    )
    .await;
    assert_eq!(r["error"]["code"], -32602, "a re-pin names its key");
    let (r, _) = tool(
        &url,
        "fleet_identity",
        json!({"action": "repin", "project": "iota", "key": impostor_key}),
    )
    .await;
    assert_eq!(
        r["result"]["structuredContent"]["pinned"],
        impostor_key.as_str()
    );
    let until = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&pins)
        .unwrap()
        .contains(&impostor_key)
    {
        assert!(Instant::now() < until, "the re-pin was not saved");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(demo);

    // The pins outlive the gateway: restarted on the same pin file, the demo's own iota sled
    // (the key pinned before the re-pin) is now the one refused.
    let demo = start(&["--projects", "12", "--pin-file", &pins_arg]);
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let (r, _) = tool(&demo.url, "fleet_identity", json!({"project": "iota"})).await;
        let iota = r["result"]["structuredContent"]["projects"][0].clone();
        if iota["refused"].is_object() {
            assert_eq!(iota["pinned"], impostor_key.as_str());
            assert_eq!(iota["refused"]["key"], real_key.as_str());
            assert_eq!(iota["status"], "offline");
            break;
        }
        assert!(
            Instant::now() < until,
            "iota's old key was not refused: {iota}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(demo);
    let _ = std::fs::remove_dir_all(&dir);
}
