//! TLS on every hop, over the real binaries: `gateway serve --tls-cert --tls-key` serves HTTPS
//! and WSS on one port; `sled-sim` dials its uplink over `wss://`, the shell and `gateway stdio`
//! call over `https://`, each trusting the test's own CA; a client trusting another CA, or
//! naming the gateway by a name its certificate does not hold, or speaking plain HTTP, is
//! refused; and the certificate is reloaded on SIGHUP and when its files change, a bad one
//! keeping the one in force.
//!
//! The CA and certificates are made at run time (`support/certs.rs`). Needs the `gateway` and
//! `sled-sim` binaries (`cargo test --workspace` builds them).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use gateway_client::{HttpUrl, TlsTrust, TokioConnect};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::process::{Child, Command};

#[path = "support/certs.rs"]
mod certs;
#[path = "support/processes.rs"]
mod processes;
#[path = "support/stdio.rs"]
mod stdio;

use certs::TestCa;
use processes::{free_port, scratch, workspace_bin};

const ALPHA_TOKEN: &str = "uplink-token-for-alpha-0001";
const BETA_TOKEN: &str = "uplink-token-for-beta-00001";

/// A `gateway serve` with TLS, logging JSON lines to a file.
struct TlsGateway {
    port: u16,
    log: PathBuf,
    child: Child,
}

impl TlsGateway {
    /// Starts it on a free loopback port with `config`, `cert` and `key`, known to its sleds as
    /// `localhost` (`--public-name`), and waits until it answers over TLS (trusting `ca`, by the
    /// name `localhost`).
    async fn start(dir: &Path, config: &Path, cert: &Path, key: &Path, ca: &TlsTrust) -> Self {
        let port = free_port();
        let log = dir.join("gateway.log");
        let child = Command::new(workspace_bin("gateway"))
            .args(["--log-json", "serve", "--config"])
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--tls-cert")
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .args(["--probe-interval-ms", "0", "--public-name", "localhost"])
            .arg("--pin-file")
            .arg(dir.join("pins.toml"))
            .arg("--state-dir")
            .arg(dir.join("state"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("the log can be made"))
            .kill_on_drop(true)
            .spawn()
            .expect("the gateway starts");
        let g = TlsGateway { port, log, child };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while open(port, "localhost", ca).await.is_err() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the gateway did not answer over TLS within 20 s:\n{}",
                g.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        g
    }

    fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.port)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log's lines (JSON objects).
    fn log_lines(&self) -> Vec<Value> {
        self.log_text()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Whether a log line's message starts with `message_start`.
    fn logged(&self, message_start: &str) -> bool {
        self.log_lines().iter().any(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with(message_start))
        })
    }

    /// How many log lines have this message and `fields.trigger`.
    fn count(&self, message_start: &str, trigger: &str) -> usize {
        self.log_lines()
            .iter()
            .filter(|l| {
                l["fields"]["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with(message_start))
                    && l["fields"]["trigger"] == trigger
            })
            .count()
    }

    async fn hup(&self) {
        let pid = self.child.id().expect("running").to_string();
        let sent = Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .await
            .expect("kill runs");
        assert!(sent.success());
    }
}

/// A TLS connection to `https://host:port/` trusting `trust`: the certificate the server
/// presented, and an HTTP/1 sender on the connection.
async fn open(
    port: u16,
    host: &str,
    trust: &TlsTrust,
) -> std::io::Result<(Vec<u8>, SendRequest<Empty<Bytes>>)> {
    let url = HttpUrl::parse(&format!("https://{host}:{port}/")).expect("a URL");
    let stream = gateway_client::dial(&TokioConnect, &url, trust).await?;
    let cert = stream
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .expect("a TLS server presents a certificate");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    Ok((cert, sender))
}

/// `GET path` on an open connection: status and body.
async fn get(sender: &mut SendRequest<Empty<Bytes>>, path: &str) -> (u16, String) {
    sender.ready().await.expect("the connection is usable");
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, "localhost")
        .body(Empty::new())
        .expect("a request");
    let response = sender.send_request(request).await.expect("an answer");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a body")
        .to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The certificate a new connection sees.
async fn served_cert(port: u16, trust: &TlsTrust) -> Vec<u8> {
    let (cert, mut sender) = open(port, "localhost", trust)
        .await
        .expect("a TLS connection");
    assert_eq!(get(&mut sender, "/healthz").await.0, 200);
    cert
}

/// A `sled-sim` serving `project` with `token`, dialing `gateway` with these more arguments.
fn sled_sim(gateway: &str, project: &str, token: &str, args: &[&str]) -> Child {
    Command::new(workspace_bin("sled-sim"))
        .args(["--gateway", gateway, "--project", project])
        .args(args)
        .env("SLED_UPLINK_TOKEN", token)
        .env_remove("MCP_GATEWAY_CA_FILE")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("sled-sim starts")
}

/// `gateway <args>` (a shell command): exit success, stdout, stderr.
async fn shell(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(workspace_bin("gateway"));
    cmd.args(args)
        .arg("--json")
        .env_remove("MCP_GATEWAY_URL")
        .env_remove("MCP_GATEWAY_TOKEN")
        .env_remove("MCP_GATEWAY_CA_FILE")
        .env("MCP_GATEWAY_AGENT_FILE", dir.join("agent"))
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(30), cmd.output())
        .await
        .expect("the shell command ends within 30 s")
        .expect("the shell command runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether `project` is live according to `gateway list-projects` over `url` trusting `ca`.
async fn live(dir: &Path, url: &str, ca: &Path, project: &str) -> bool {
    let ca = ca.to_str().expect("a UTF-8 path");
    let (ok, out, err) = shell(dir, &["list-projects", "--url", url, "--ca-file", ca], &[]).await;
    assert!(ok, "list-projects over TLS failed: {err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    v["projects"]
        .as_array()
        .expect("projects")
        .iter()
        .any(|p| p["name"] == project && p["live"] == true)
}

fn write_config(dir: &Path) -> PathBuf {
    let config = dir.join("projects.toml");
    let text = format!(
        "default = \"alpha\"\n\
         [[project]]\nname = \"alpha\"\nurl = \"http://127.0.0.1:9\"\ntoken = \"{ALPHA_TOKEN}\"\n\
         [[project]]\nname = \"beta\"\nurl = \"http://127.0.0.1:9\"\ntoken = \"{BETA_TOKEN}\"\n"
    );
    std::fs::write(&config, text).expect("the config can be written");
    config
}

/// One metric's value from an OpenMetrics text.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleds_the_shell_and_stdio_reach_a_tls_gateway_and_untrusting_clients_are_refused() {
    let dir = scratch("tls-e2e");
    let ca = TestCa::new("gateway tests CA");
    let ca_file = ca.write(&dir, "ca.pem");
    let other_ca_file = TestCa::new("someone else's CA").write(&dir, "other-ca.pem");
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    // `localhost` only: a client that dials 127.0.0.1 finds its name missing.
    ca.issue("gateway", &["localhost"]).write(&cert, &key);
    let trust = TlsTrust::from_ca_file(&ca_file).unwrap();
    let config = write_config(&dir);
    let gateway = TlsGateway::start(&dir, &config, &cert, &key, &trust).await;
    let base = format!("https://localhost:{}", gateway.port);
    let mcp = gateway.url("localhost", "/mcp");
    let ca_path = ca_file.to_str().unwrap();

    // A sled over wss://, trusting the CA: alpha comes up, as the shell sees over https://.
    let _alpha = sled_sim(&base, "alpha", ALPHA_TOKEN, &["--ca-file", ca_path]);
    // One trusting another CA: it never gets through the handshake, so beta stays down.
    let other = other_ca_file.to_str().unwrap();
    let _beta = sled_sim(&base, "beta", BETA_TOKEN, &["--ca-file", other]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !live(&dir, &mcp, &ca_file, "alpha").await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "alpha's sled never came up over wss://:\n{}",
            gateway.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The shell calls a sled's tool over https://, the CA from the environment this time.
    let (ok, out, err) = shell(
        &dir,
        &["call", "whoami", "--project", "alpha", "--url", &mcp],
        &[("MCP_GATEWAY_CA_FILE", ca_path)],
    )
    .await;
    assert!(ok, "gateway call over https:// failed: {err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["project"], "alpha", "{v}");

    // gateway stdio over https://, trusting the CA through MCP_GATEWAY_CA_FILE.
    let messages = stdio::session(&[json!({"jsonrpc":"2.0","id":2,"method":"tools/call",
        "params":{"name":"whoami","arguments":{"project":"alpha"}}})]);
    let lines = stdio::run_with(
        &workspace_bin("gateway"),
        &mcp,
        stdio::Token::None,
        &[],
        &[("MCP_GATEWAY_CA_FILE", ca_path)],
        &messages,
    )
    .await;
    let answer = stdio::answer(&lines, 2);
    assert_eq!(
        answer["result"]["structuredContent"]["project"], "alpha",
        "{answer}"
    );

    // Refused: another CA (the shell and stdio), a name the certificate does not hold, plain
    // HTTP to the TLS port.
    let (ok, _, err) = shell(
        &dir,
        &["list-projects", "--url", &mcp, "--ca-file", other],
        &[],
    )
    .await;
    assert!(!ok && err.contains("UnknownIssuer"), "{err}");
    let lines = stdio::run_with(
        &workspace_bin("gateway"),
        &mcp,
        stdio::Token::None,
        &["--ca-file", other],
        &[],
        &stdio::session(&[]),
    )
    .await;
    let refused = stdio::answer(&lines, 1);
    assert!(
        refused["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("UnknownIssuer")),
        "{refused}"
    );
    let by_ip = gateway.url("127.0.0.1", "/mcp");
    let (ok, _, err) = shell(
        &dir,
        &["list-projects", "--url", &by_ip, "--ca-file", ca_path],
        &[],
    )
    .await;
    assert!(!ok && err.contains("not valid for name"), "{err}");
    let plain = format!("http://localhost:{}/mcp", gateway.port);
    let (ok, _, err) = shell(&dir, &["list-projects", "--url", &plain], &[]).await;
    assert!(
        !ok && err.contains("HTTP 400") && err.contains("use https://"),
        "{err}"
    );
    // No system CA trusts the test's CA either.
    let (ok, _, err) = shell(&dir, &["list-projects", "--url", &mcp], &[]).await;
    assert!(!ok && err.contains("certificate"), "{err}");

    // beta's sled is still refused at the handshake, and every refusal was counted.
    assert!(!live(&dir, &mcp, &ca_file, "beta").await);
    let (_, mut sender) = open(gateway.port, "localhost", &trust).await.unwrap();
    let (status, metrics) = get(&mut sender, "/metrics").await;
    assert_eq!(status, 200);
    let failed = series(&metrics, "gateway_tls_handshakes_failed_total").unwrap();
    assert!(failed >= 4.0, "{failed} handshakes failed:\n{metrics}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_certificate_is_reloaded_on_sighup_and_on_change_and_a_bad_one_is_refused() {
    let dir = scratch("tls-reload");
    let ca = TestCa::new("gateway tests CA");
    let trust = TlsTrust::from_ca_file(&ca.write(&dir, "ca.pem")).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let first = ca.issue("gateway-first", &["localhost"]);
    first.write(&cert, &key);
    let config = write_config(&dir);
    let gateway = TlsGateway::start(&dir, &config, &cert, &key, &trust).await;
    assert_eq!(served_cert(gateway.port, &trust).await, first.der);
    // A connection made before the reload keeps its certificate and goes on working.
    let (old_cert, mut old) = open(gateway.port, "localhost", &trust).await.unwrap();
    assert_eq!(old_cert, first.der);

    // SIGHUP: the new pair is in force for new connections.
    let second = ca.issue("gateway-second", &["localhost"]);
    second.write(&cert, &key);
    gateway.hup().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while gateway.count("TLS certificate reloaded", "SIGHUP") == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no reload logged after SIGHUP:\n{}",
            gateway.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(served_cert(gateway.port, &trust).await, second.der);
    assert_eq!(get(&mut old, "/healthz").await, (200, "ok".to_owned()));

    // A bad certificate on SIGHUP: refused and logged; the second stays in force.
    std::fs::write(
        &cert,
        "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    gateway.hup().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while gateway.count("TLS certificate and key refused", "SIGHUP") == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no refusal logged after SIGHUP:\n{}",
            gateway.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(served_cert(gateway.port, &trust).await, second.der);

    // Without a signal: a changed pair is picked up by the watcher within a few seconds.
    let third = ca.issue("gateway-third", &["localhost"]);
    third.write(&cert, &key);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while served_cert(gateway.port, &trust).await != third.der {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the changed certificate was never served:\n{}",
            gateway.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gateway.count("TLS certificate reloaded", "file change") >= 1);
    // The key never reaches the log.
    let key_line = third.key_pem.lines().nth(1).unwrap();
    assert!(!gateway.log_text().contains(key_line));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sled's identity proof is bound to the name it dialed the gateway by: with the gateway's
/// public name `localhost`, a sled that reached it (over TLS, with a certificate that also
/// names 127.0.0.1) as `127.0.0.1` made its proof for `127.0.0.1`, and is refused; one that
/// dialed `localhost` is welcomed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sled_identity_proof_made_for_another_gateway_name_is_refused() {
    let dir = scratch("tls-proof-name");
    let ca = TestCa::new("gateway tests CA");
    let ca_file = ca.write(&dir, "ca.pem");
    let trust = TlsTrust::from_ca_file(&ca_file).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    ca.issue("gateway", &["localhost", "127.0.0.1"])
        .write(&cert, &key);
    let config = write_config(&dir);
    let gateway = TlsGateway::start(&dir, &config, &cert, &key, &trust).await;
    let ca_path = ca_file.to_str().unwrap();
    let mcp = gateway.url("localhost", "/mcp");
    let by_name = format!("https://localhost:{}", gateway.port);
    let by_ip = format!("https://127.0.0.1:{}", gateway.port);
    let _beta = sled_sim(&by_ip, "beta", BETA_TOKEN, &["--ca-file", ca_path]);
    let _alpha = sled_sim(&by_name, "alpha", ALPHA_TOKEN, &["--ca-file", ca_path]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let refusal = "sled identity refused: the identity proof was made for gateway '127.0.0.1', \
                   and this gateway is 'localhost'";
    while !(live(&dir, &mcp, &ca_file, "alpha").await && gateway.logged(refusal)) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "alpha never came up, or beta's proof for 127.0.0.1 was not refused:\n{}",
            gateway.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!live(&dir, &mcp, &ca_file, "beta").await);
    let _ = std::fs::remove_dir_all(&dir);
}
