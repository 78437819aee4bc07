//! Every way nats-server authenticates a client, against real processes (issue 24, "NATS
//! credentials and TLS"): a nats-server configured for the method, a `gateway serve
//! --cluster` replica with the right credentials that serves (a sled-sim sled's call through
//! it works, its claim in NATS naming the replica), and replicas with none or wrong ones that
//! are refused at start with a clear error that holds no secret.
//!
//! - user and password, token, nkey, creds file (operator, account and user JWTs made here,
//!   with the `nkeys` crate and `nats-io-jwt`, since `nsc` cannot be installed), TLS with a CA
//!   file, and TLS required against a server without TLS;
//! - mutual TLS with the shipped `examples/nats-server.conf`, run as it is (the test makes the
//!   certificates it names, with `rcgen`, in its working directory): two replicas relay a call
//!   through it, a replica's certificate gives it its own subjects only, and everything a
//!   replica does is allowed it;
//! - a server without JetStream, refused at start.
//!
//! One nats-server per test. Skipped with a note when nats-server cannot be installed; failing
//! when `CI` is set (see `support/nats.rs`).

#[path = "support/nats.rs"]
mod nats;
#[path = "support/processes.rs"]
mod processes;
#[path = "support/shipped_nats.rs"]
mod shipped_nats;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use processes::{GatewayProcess, Launch};
use serde_json::{json, Value};
use shipped_nats::Ca;

const PROJECTS: &str = r#"default = "alpha"
call_timeout_ms = 10000

[[project]]
name = "alpha"
url = "http://127.0.0.1:9101"
token = "test-uplink-token-0123456789"   # support::processes::SLED_TOKEN
"#;

/// JetStream for the servers of the methods' tests, which are about who gets in: with the
/// default lazy fsync (the shipped file syncs every write), so that their servers making
/// their buckets all at once do not wait on a busy disk.
const JETSTREAM: &str = "listen: 127.0.0.1:4222\njetstream {\n  store_dir: \"store\"\n}\n";

/// A scenario's directory: projects.toml, and the files the test writes for the replicas.
struct Scene {
    dir: PathBuf,
    config: PathBuf,
}

impl Scene {
    fn new(what: &str) -> Scene {
        let dir = processes::scratch(&format!("nats-auth-{what}"));
        let config = dir.join("projects.toml");
        std::fs::write(&config, PROJECTS).unwrap();
        Scene { dir, config }
    }

    /// Writes `text` to `name` in the scene's directory; returns its path.
    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A nats-server whose configuration is `config` (written into its own directory).
async fn server_with(config: &str) -> Option<nats::NatsServer> {
    let dir = processes::scratch("nats-auth-server");
    std::fs::write(dir.join("nats.conf"), config).unwrap();
    nats::NatsServer::start_with_config(&dir.join("nats.conf"), dir).await
}

fn args<const N: usize>(a: [&dyn AsRef<std::ffi::OsStr>; N]) -> Vec<OsString> {
    a.iter().map(|s| s.as_ref().to_owned()).collect()
}

fn env(k: &str, v: impl Into<OsString>) -> (String, OsString) {
    (k.to_owned(), v.into())
}

/// Starts `gateway serve --cluster url --replica name` with `extra` and `env`, which must be
/// refused: it exits with a failure within 20 s. Returns what it printed (stderr, its logs).
async fn refused(
    scene: &Scene,
    url: &str,
    name: &str,
    extra: Vec<OsString>,
    env: Vec<(String, OsString)>,
) -> String {
    let log = scene.dir.join(format!("refused-{name}.log"));
    let file = std::fs::File::create(&log).unwrap();
    let mut child = tokio::process::Command::new(processes::workspace_bin("gateway"))
        .args(["serve", "--config"])
        .arg(&scene.config)
        .args([
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            url,
            "--replica",
            name,
        ])
        .arg("--pin-file")
        .arg(scene.dir.join(format!("pins-{name}.toml")))
        .args(extra)
        .env("RUST_LOG", "debug")
        .env(
            gateway_server::cluster::seal::SECRET_ENV,
            gateway_tests::TEST_CLUSTER_SECRET,
        )
        .envs(env)
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .expect("the gateway runs");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let Ok(status) = status else {
        panic!("replica {name} was not refused within 20 s:\n{text}");
    };
    let out = status.expect("waitable");
    assert!(
        !out.success(),
        "replica {name} should have been refused:\n{text}"
    );
    assert!(
        !last_line(&text).is_empty(),
        "replica {name}: no error line:\n{text}"
    );
    text
}

/// The line the refused gateway ended with.
fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| l.starts_with("gateway: "))
        .unwrap_or("")
}

fn assert_secret_free(text: &str, secrets: &[&str]) {
    for s in secrets {
        assert!(!text.contains(s), "a secret was printed:\n{text}");
    }
}

/// A replica that joins with `launch` and serves: a sled for alpha dials it, a call through it
/// works, and its claim (in NATS) names it. Returns the replica (killed on drop) and its sled.
async fn serving(
    scene: &Scene,
    url: &str,
    name: &str,
    launch: Launch,
) -> (GatewayProcess, tokio::process::Child) {
    let replica = GatewayProcess::start_with(&scene.config, url, name, 10, launch).await;
    let sled = processes::sled_sim(&replica.url(), &["alpha"], 0);
    assert_eq!(
        holder(&replica.url(), "alpha").await,
        name,
        "{}",
        replica.log()
    );
    let r = call(&replica.url(), "create_story").await;
    assert_eq!(
        r["result"]["structuredContent"]["project"],
        "alpha",
        "{r}\n{}",
        replica.log()
    );
    (replica, sled)
}

async fn holder(base: &str, project: &str) -> String {
    processes::holder(base, None, project).await
}

async fn call(base: &str, tool: &str) -> Value {
    call_tool(
        base,
        tool,
        json!({"project": "alpha", "name": "s", "acceptance_criteria": []}),
    )
    .await
}

async fn call_tool(base: &str, tool: &str, arguments: Value) -> Value {
    processes::call_tool(base, None, tool, arguments).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password() {
    let password = "s3cret-pass-of-the-test-0123456789";
    let config = format!(
        "{JETSTREAM}accounts {{\n  MCPGW {{\n    jetstream: enabled\n    users: [{{user: \"gw\", password: \"{password}\"}}]\n  }}\n}}\n"
    );
    let Some(nats) = server_with(&config).await else {
        return;
    };
    let scene = Scene::new("password");
    let good = scene.file("password", &format!("{password}\n"));
    let wrong = scene.file("wrong", "wrong-s3cret-of-the-test\n");
    // Named after the host (no --replica), the password from its file.
    let host = gethostname::gethostname();
    let named = gateway_server::cluster::replica::name_from_host(&host.to_string_lossy())
        .expect("this host's name makes a replica name");
    let launch = Launch {
        args: args([&"--nats-user", &"gw", &"--nats-password-file", &good]),
        env: vec![env("RUST_LOG", "debug,async_nats=trace")],
        unnamed: true,
    };
    let (replica, _sled) = serving(&scene, &nats.url(), &named, launch).await;
    assert!(
        replica
            .log()
            .contains("the replica is named after the host"),
        "{}",
        replica.log()
    );
    assert_secret_free(&replica.log(), &[password]);
    // The password from the environment, the user too.
    let by_env = Launch {
        env: vec![
            env("MCP_GATEWAY_NATS_USER", "gw"),
            env("MCP_GATEWAY_NATS_PASSWORD", password),
        ],
        ..Launch::default()
    };
    let r2 = GatewayProcess::start_with(&scene.config, &nats.url(), "r2", 10, by_env).await;
    assert_eq!(holder(&r2.url(), "alpha").await, named);
    assert_eq!(
        call(&r2.url(), "create_story").await["result"]["structuredContent"]["project"],
        "alpha",
        "relayed through NATS to {named}"
    );

    let none = refused(&scene, &nats.url(), "r3", vec![], vec![]).await;
    assert!(
        last_line(&none).contains("wants credentials and none were given"),
        "{none}"
    );
    let bad = refused(
        &scene,
        &nats.url(),
        "r3",
        args([&"--nats-user", &"gw", &"--nats-password-file", &wrong]),
        vec![],
    )
    .await;
    assert!(
        last_line(&bad).contains("authorization violation")
            && last_line(&bad).contains("user \"gw\" with a password"),
        "{bad}"
    );
    assert_secret_free(&bad, &["wrong-s3cret", password]);
    // In the URL: refused, and not echoed.
    let url = nats
        .url()
        .replace("nats://", &format!("nats://gw:{password}@"));
    let in_url = refused(&scene, &url, "r3", vec![], vec![]).await;
    assert!(
        last_line(&in_url).contains("--nats-password-file"),
        "{in_url}"
    );
    assert_secret_free(&in_url, &[password]);
    // A user without its password is refused before anything connects.
    let half = refused(
        &scene,
        &nats.url(),
        "r3",
        args([&"--nats-user", &"gw"]),
        vec![],
    )
    .await;
    assert!(last_line(&half).contains("needs its password"), "{half}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token() {
    let token = "s3cret-token-of-the-test-0123456789";
    let config = format!("{JETSTREAM}authorization {{\n  token: \"{token}\"\n}}\n");
    let Some(nats) = server_with(&config).await else {
        return;
    };
    let scene = Scene::new("token");
    let launch = Launch {
        env: vec![
            env("MCP_GATEWAY_NATS_TOKEN", token),
            env("RUST_LOG", "debug,async_nats=trace"),
        ],
        ..Launch::default()
    };
    let (replica, _sled) = serving(&scene, &nats.url(), "r1", launch).await;
    assert_secret_free(&replica.log(), &[token]);
    let wrong = scene.file("wrong", "wrong-s3cret-token\n");
    let bad = refused(
        &scene,
        &nats.url(),
        "r2",
        args([&"--nats-token-file", &wrong]),
        vec![],
    )
    .await;
    assert!(last_line(&bad).contains("refused a token"), "{bad}");
    assert_secret_free(&bad, &["wrong-s3cret", token]);
    let none = refused(&scene, &nats.url(), "r2", vec![], vec![]).await;
    assert!(last_line(&none).contains("none were given"), "{none}");
    let url = nats.url().replace("nats://", &format!("nats://{token}@"));
    let in_url = refused(&scene, &url, "r2", vec![], vec![]).await;
    assert_secret_free(&in_url, &[token]);
    assert!(last_line(&in_url).contains("--nats-token-file"), "{in_url}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nkey() {
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let config = format!(
        "{JETSTREAM}accounts {{\n  MCPGW {{\n    jetstream: enabled\n    users: [{{nkey: \"{}\"}}]\n  }}\n}}\n",
        user.public_key()
    );
    let Some(nats) = server_with(&config).await else {
        return;
    };
    let scene = Scene::new("nkey");
    let file = scene.file("r1.nk", &format!("{seed}\n"));
    let launch = Launch {
        args: args([&"--nats-nkey-seed-file", &file]),
        env: vec![env("RUST_LOG", "debug,async_nats=trace")],
        ..Launch::default()
    };
    let (replica, _sled) = serving(&scene, &nats.url(), "r1", launch).await;
    assert_secret_free(&replica.log(), &[&seed]);
    assert!(
        replica.log().contains(&user.public_key()),
        "{}",
        replica.log()
    );
    // A seed the server does not know.
    let stranger = nkeys::KeyPair::new_user().seed().unwrap();
    let bad = refused(
        &scene,
        &nats.url(),
        "r2",
        vec![],
        vec![env("MCP_GATEWAY_NATS_NKEY_SEED", &stranger)],
    )
    .await;
    assert!(last_line(&bad).contains("authorization violation"), "{bad}");
    assert_secret_free(&bad, &[&stranger, &seed]);
    // Not a seed at all: refused before connecting, without quoting it.
    let garbage = scene.file("garbage.nk", "SUs3cretbutnotaseed\n");
    let bad = refused(
        &scene,
        &nats.url(),
        "r2",
        args([&"--nats-nkey-seed-file", &garbage]),
        vec![],
    )
    .await;
    assert!(last_line(&bad).contains("not a valid nkey seed"), "{bad}");
    assert_secret_free(&bad, &["s3cretbutnotaseed"]);
}

/// A creds file, as `nsc` writes them: the user JWT and the user's seed.
fn creds(jwt: &str, seed: &str) -> String {
    format!(
        "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

/// An account's JWT, signed by `operator`; with `jetstream`, JetStream without limits.
fn account_jwt(
    account: &nkeys::KeyPair,
    operator: &nkeys::KeyPair,
    name: &str,
    jetstream: bool,
) -> String {
    let mut limits = nats_io_jwt::OperatorLimits {
        // Its users must prove they hold their seed.
        disallow_bearer: true,
        ..Default::default()
    };
    if !jetstream {
        (limits.mem_storage, limits.disk_storage) = (0, 0);
        (limits.streams, limits.consumer) = (0, 0);
    }
    let claims: nats_io_jwt::Account = nats_io_jwt::Account::builder()
        .limits(limits)
        .try_into()
        .unwrap();
    nats_io_jwt::Token::new(account.public_key())
        .name(name)
        .claims(claims)
        .sign(operator)
}

/// A user's JWT, signed by its account. Not a bearer token (`nats-io-jwt`'s default is one:
/// the server would then not ask for the seed's signature of its nonce).
fn user_jwt(user: &nkeys::KeyPair, account: &nkeys::KeyPair) -> String {
    let claims: nats_io_jwt::User = nats_io_jwt::User::builder()
        .bearer_token(false)
        .try_into()
        .unwrap();
    nats_io_jwt::Token::new(user.public_key())
        .name("r1")
        .claims(claims)
        .sign(account)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creds_file() {
    // Operator mode: the operator's JWT, the account's preloaded in a memory resolver.
    let operator = nkeys::KeyPair::new_operator();
    let account = nkeys::KeyPair::new_account();
    let operator_claims: nats_io_jwt::Operator =
        nats_io_jwt::Operator::builder().try_into().unwrap();
    let operator_jwt = nats_io_jwt::Token::new(operator.public_key())
        .name("test operator")
        .claims(operator_claims)
        .sign(&operator);
    // JetStream in operator mode needs a system account.
    let system = nkeys::KeyPair::new_account();
    let config = format!(
        "{JETSTREAM}operator: \"{operator_jwt}\"\nsystem_account: {sys}\nresolver: MEMORY\nresolver_preload: {{\n  {sys}: \"{}\"\n  {}: \"{}\"\n}}\n",
        account_jwt(&system, &operator, "SYS", false),
        account.public_key(),
        account_jwt(&account, &operator, "MCPGW", true),
        sys = system.public_key(),
    );
    let Some(nats) = server_with(&config).await else {
        return;
    };
    let scene = Scene::new("creds");
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let jwt = user_jwt(&user, &account);
    let file = scene.file("r1.creds", &creds(&jwt, &seed));
    let launch = Launch {
        env: vec![
            env("MCP_GATEWAY_NATS_CREDS", &file),
            env("RUST_LOG", "debug,async_nats=trace"),
        ],
        ..Launch::default()
    };
    let (replica, _sled) = serving(&scene, &nats.url(), "r1", launch).await;
    assert_secret_free(&replica.log(), &[&seed, &jwt]);
    // A user of an account the server does not know.
    let stranger_account = nkeys::KeyPair::new_account();
    let stranger = nkeys::KeyPair::new_user();
    let stranger_seed = stranger.seed().unwrap();
    let stranger_jwt = user_jwt(&stranger, &stranger_account);
    let other = scene.file("stranger.creds", &creds(&stranger_jwt, &stranger_seed));
    let bad = refused(
        &scene,
        &nats.url(),
        "r2",
        args([&"--nats-creds", &other]),
        vec![],
    )
    .await;
    assert!(
        last_line(&bad).contains("authorization violation")
            && last_line(&bad).contains("stranger.creds"),
        "{bad}"
    );
    assert_secret_free(&bad, &[&stranger_seed, &stranger_jwt, &seed]);
    // The right JWT with another user's seed: its signature of the server's nonce fails.
    let mismatched = scene.file("mismatched.creds", &creds(&jwt, &stranger_seed));
    let bad = refused(
        &scene,
        &nats.url(),
        "r2",
        args([&"--nats-creds", &mismatched]),
        vec![],
    )
    .await;
    assert!(last_line(&bad).contains("authorization violation"), "{bad}");
    assert_secret_free(&bad, &[&stranger_seed, &seed]);
    let none = refused(&scene, &nats.url(), "r2", vec![], vec![]).await;
    assert!(last_line(&none).contains("none were given"), "{none}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_ca_file() {
    let ca = Ca::new("test CA");
    let dir = processes::scratch("nats-auth-tls");
    ca.write_server_files(&dir);
    let config = format!(
        "{JETSTREAM}tls {{\n  cert_file: \"tls/nats-server.pem\"\n  key_file: \"tls/nats-server-key.pem\"\n}}\n"
    );
    std::fs::write(dir.join("nats.conf"), config).unwrap();
    let Some(nats) = nats::NatsServer::start_with_config(&dir.join("nats.conf"), dir).await else {
        return;
    };
    let scene = Scene::new("tls");
    let ca_file = nats.dir().join("tls/ca.pem");
    let launch = Launch {
        args: args([&"--nats-ca-file", &ca_file]),
        ..Launch::default()
    };
    let (_replica, _sled) = serving(&scene, &nats.url(), "r1", launch).await;
    // The host name in the URL must be in the certificate too: `localhost` is.
    let by_name = Launch {
        env: vec![env("MCP_GATEWAY_NATS_CA_FILE", &ca_file)],
        ..Launch::default()
    };
    let url = format!("tls://localhost:{}", nats.port);
    let r2 = GatewayProcess::start_with(&scene.config, &url, "r2", 10, by_name).await;
    assert_eq!(holder(&r2.url(), "alpha").await, "r1");
    // Without the CA (the system's roots), and with another CA: refused.
    let none = refused(&scene, &nats.url(), "r3", vec![], vec![]).await;
    assert!(
        last_line(&none).contains("not signed by a CA this replica trusts"),
        "{none}"
    );
    let other = scene.file("other-ca.pem", &Ca::new("another CA").cert_pem);
    let wrong = refused(
        &scene,
        &nats.url(),
        "r3",
        args([&"--nats-ca-file", &other]),
        vec![],
    )
    .await;
    assert!(
        last_line(&wrong).contains("not signed by a CA this replica trusts"),
        "{wrong}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_required_is_never_clear_text() {
    let Some(nats) = nats::NatsServer::start().await else {
        return;
    };
    let scene = Scene::new("require-tls");
    let password = "s3cret-pass-never-in-clear-0123456789";
    let file = scene.file("password", password);
    let with_password = || args([&"--nats-user", &"gw", &"--nats-password-file", &file]);
    let mut flag = with_password();
    flag.push("--nats-require-tls".into());
    let bad = refused(&scene, &nats.url(), "r1", flag.clone(), vec![]).await;
    assert!(last_line(&bad).contains("does not speak TLS"), "{bad}");
    assert_secret_free(&bad, &[password]);
    let bad = refused(
        &scene,
        &nats.url(),
        "r1",
        with_password(),
        vec![env("MCP_GATEWAY_NATS_REQUIRE_TLS", "1")],
    )
    .await;
    assert!(last_line(&bad).contains("does not speak TLS"), "{bad}");

    // What such a replica sends to a server that offers no TLS: a TLS handshake, and not a
    // byte of its CONNECT (nor its password).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let heard = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut socket, _) = listener.accept().await.unwrap();
        let info = format!(
            "INFO {{\"server_id\":\"fake\",\"version\":\"2.15.1\",\"proto\":1,\"host\":\"127.0.0.1\",\"port\":{port},\"max_payload\":1048576,\"headers\":true,\"auth_required\":true,\"nonce\":\"abc\"}}\r\n"
        );
        socket.write_all(info.as_bytes()).await.unwrap();
        let mut heard = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let mut buf = [0u8; 4096];
            while let Ok(n) = socket.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                heard.extend_from_slice(&buf[..n]);
                if heard.len() > 5 {
                    break;
                }
            }
        })
        .await;
        heard
    });
    let fake = format!("nats://127.0.0.1:{port}");
    let _ = refused(&scene, &fake, "r1", flag, vec![]).await;
    let heard = heard.await.unwrap();
    assert_eq!(
        heard.first(),
        Some(&0x16),
        "the first byte is a TLS handshake record: {heard:?}"
    );
    let text = String::from_utf8_lossy(&heard);
    assert!(
        !text.contains("CONNECT") && !text.contains(password),
        "{text}"
    );
}

/// The shipped configuration, as it is: mutual TLS in which a replica's certificate is its
/// NATS user, and each replica's subjects are its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_the_shipped_configuration() {
    let Some(shipped) = shipped_nats::ShippedNats::start(&["r1", "r2"]).await else {
        return;
    };
    let nats = &shipped.nats;
    assert!(
        nats.log().contains("TLS required for client connections")
            && nats.log().contains("127.0.0.1"),
        "{}",
        nats.log()
    );
    let scene = Scene::new("shipped");
    let ca_file = shipped.ca_file.clone();
    let (r1_cert, r1_key) = shipped.client("r1");
    let (r2_cert, r2_key) = shipped.client("r2");
    let r1 = shipped.replica_launch("r1");
    let (replica1, _sled) = serving(&scene, &nats.url(), "r1", r1).await;
    let r2 = Launch {
        env: vec![
            env("MCP_GATEWAY_NATS_CA_FILE", &ca_file),
            env("MCP_GATEWAY_NATS_CLIENT_CERT", &r2_cert),
            env("MCP_GATEWAY_NATS_CLIENT_KEY", &r2_key),
        ],
        ..Launch::default()
    };
    let replica2 = GatewayProcess::start_with(&scene.config, &nats.url(), "r2", 10, r2).await;
    // Through r2, relayed to r1 (which holds alpha's sled) and back, over the account's
    // subjects; and gateway_health asks r1 for alpha's row.
    assert_eq!(holder(&replica2.url(), "alpha").await, "r1");
    let r = call(&replica2.url(), "create_story").await;
    assert_eq!(r["result"]["structuredContent"]["project"], "alpha", "{r}");
    let health = call_tool(&replica2.url(), "gateway_health", json!({})).await;
    let rows = health["result"]["structuredContent"]["projects"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        rows.iter()
            .any(|p| p["project"] == "alpha" && p["status"] == "up" && p["replica"] == "r1"),
        "{health}"
    );
    // The replicas needed nothing their permissions refuse (nats-server logs a refusal as a
    // "Publish Violation" or "Subscription Violation", a replica as a "Permissions Violation").
    for log in [nats.log(), replica1.log(), replica2.log()] {
        assert!(!log.contains(" Violation"), "{log}");
    }

    // Refused: no client certificate; one from another CA; r1's certificate for a replica
    // named r3 (r1's NATS user may not take r3's subjects).
    let none = refused(
        &scene,
        &nats.url(),
        "r3",
        args([&"--nats-ca-file", &ca_file]),
        vec![],
    )
    .await;
    assert!(
        last_line(&none).contains("admits only clients with a certificate"),
        "{none}"
    );
    let stranger = Ca::new("another CA");
    let (s_cert, s_key) = stranger.write_client(&scene.dir, "r3");
    let foreign = refused(
        &scene,
        &nats.url(),
        "r3",
        args([
            &"--nats-ca-file",
            &ca_file,
            &"--nats-client-cert",
            &s_cert,
            &"--nats-client-key",
            &s_key,
        ]),
        vec![],
    )
    .await;
    assert!(
        last_line(&foreign).contains("does not accept this replica's client certificate"),
        "{foreign}"
    );
    let key_text = std::fs::read_to_string(&r1_key).unwrap();
    let key_body = key_text.lines().nth(1).unwrap();
    let misnamed = refused(
        &scene,
        &nats.url(),
        "r3",
        args([
            &"--nats-ca-file",
            &ca_file,
            &"--nats-client-cert",
            &r1_cert,
            &"--nats-client-key",
            &r1_key,
        ]),
        vec![],
    )
    .await;
    assert!(
        last_line(&misnamed).contains("permissions of replica \"r3\""),
        "{misnamed}"
    );
    assert_secret_free(&misnamed, &[key_body]);
    let without_ca = refused(
        &scene,
        &nats.url(),
        "r3",
        args([
            &"--nats-client-cert",
            &r1_cert,
            &"--nats-client-key",
            &r1_key,
        ]),
        vec![],
    )
    .await;
    assert!(
        last_line(&without_ca).contains("not signed by a CA this replica trusts"),
        "{without_ca}"
    );

    // With r1's certificate, a process can take none of r2's subjects, nor delete or purge a
    // bucket: the server refuses each, and r2's traffic is not delivered to it.
    let (spy, mut refusals) = shipped.client_as("r1", "_INBOX.mcpgw.r1.spy").await;
    let (mut taps, mut taps_allowed) = (Vec::new(), Vec::new());
    for subject in [
        "mcpgw.relay.r2",
        "mcpgw.inbox.r2.>",
        "_INBOX.mcpgw.r2.>",
        "_INBOX.>",
        "$KV.mcpgw_sessions.>",
        ">",
    ] {
        taps.push(spy.subscribe(subject).await.unwrap());
    }
    for subject in [
        "$JS.API.STREAM.DELETE.KV_mcpgw_directory",
        "$JS.API.STREAM.PURGE.KV_mcpgw_sessions",
        "$JS.API.STREAM.CREATE.SPY",
    ] {
        spy.publish(subject, "{}".into()).await.unwrap();
    }
    spy.flush().await.unwrap();
    let mut heard = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while heard.len() < 9 {
        match tokio::time::timeout_at(deadline, refusals.recv()).await {
            Ok(Some(e)) => heard.push(e),
            _ => break,
        }
    }
    let heard = heard.join("\n");
    for what in [
        "Subscription to \"mcpgw.relay.r2\"",
        "Subscription to \"mcpgw.inbox.r2.>\"",
        "Subscription to \"_INBOX.mcpgw.r2.>\"",
        "Subscription to \"_INBOX.>\"",
        "Subscription to \"$KV.mcpgw_sessions.>\"",
        "Subscription to \">\"",
        "Publish to \"$JS.API.STREAM.DELETE.KV_mcpgw_directory\"",
        "Publish to \"$JS.API.STREAM.PURGE.KV_mcpgw_sessions\"",
        "Publish to \"$JS.API.STREAM.CREATE.SPY\"",
    ] {
        assert!(heard.contains(what), "not refused: {what}; heard:\n{heard}");
    }
    // A call relayed to r1 still works, and none of its traffic reached the taps.
    let r = call(&replica2.url(), "create_story").await;
    assert_eq!(r["result"]["structuredContent"]["project"], "alpha", "{r}");
    for mut tap in taps {
        let got = tokio::time::timeout(
            Duration::from_millis(200),
            futures_util::StreamExt::next(&mut tap),
        )
        .await;
        assert!(
            !matches!(got, Ok(Some(_))),
            "a refused subscription got a message"
        );
    }
    // And everything a replica does is allowed it: its own subjects, the others' relay and
    // inbox subjects, the news, a write to each bucket (a delete of a key nobody reads), and
    // the JetStream requests for the buckets. (Each would be a refusal heard here otherwise.)
    for subject in [
        "mcpgw.relay.r1",
        "mcpgw.inbox.r1.spy.>",
        "_INBOX.mcpgw.r1.spy.>",
        "mcpgw.news",
    ] {
        taps_allowed.push(spy.subscribe(subject).await.unwrap());
    }
    let mut delete = async_nats::HeaderMap::new();
    delete.insert("KV-Operation", "DEL");
    for bucket in ["directory", "sessions", "pins", "tools"] {
        spy.publish_with_headers(
            format!("$KV.mcpgw_{bucket}.permission-probe"),
            delete.clone(),
            "".into(),
        )
        .await
        .unwrap();
    }
    for subject in [
        "mcpgw.relay.r2",
        "mcpgw.inbox.r2.spy.0",
        "mcpgw.news",
        "$JS.API.INFO",
        "$JS.API.STREAM.INFO.KV_mcpgw_directory",
        "$JS.API.STREAM.MSG.GET.KV_mcpgw_directory",
        "$JS.API.DIRECT.GET.KV_mcpgw_directory.$KV.mcpgw_directory.p.alpha",
        "$JS.API.CONSUMER.DELETE.KV_mcpgw_directory.nobody",
    ] {
        spy.publish(subject, "{}".into()).await.unwrap();
    }
    spy.flush().await.unwrap();
    // The server answers a request sent after them only once it has judged them.
    spy.request("$JS.API.INFO", "".into()).await.unwrap();
    if let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(300), refusals.recv()).await {
        panic!("a replica's subject was refused: {e}");
    }
    // The engine says so too: r1's identity cannot subscribe to r2's relay subject.
    use gateway_server::cluster::Engine;
    let mut opts = gateway_server::cluster::nats::NatsOptions::new(nats.url(), "r1");
    opts.inbox_prefix = Some(gateway_server::cluster::nats::replica_inbox_prefix(
        "mcpgw", "r1",
    ));
    opts.auth.tls = gateway_server::cluster::nats_auth::TlsSettings {
        ca_file: Some(ca_file),
        client: Some((r1_cert, r1_key)),
        required: true,
    };
    let engine = gateway_server::cluster::nats::NatsEngine::connect(opts)
        .await
        .unwrap();
    engine.subscribe("mcpgw.relay.r1").await.unwrap();
    let e = engine.subscribe("mcpgw.relay.r2").await.unwrap_err();
    assert!(
        e.to_string()
            .contains("refused the subscription to mcpgw.relay.r2"),
        "{e}"
    );
}

/// A server (or an account) without JetStream is refused at start, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_account_without_jetstream_is_refused_at_start() {
    let Some(nats) = server_with("listen: 127.0.0.1:4222\n").await else {
        return;
    };
    let scene = Scene::new("no-jetstream");
    let text = refused(&scene, &nats.url(), "r1", vec![], vec![]).await;
    assert!(
        last_line(&text).contains("JetStream is not enabled"),
        "{text}"
    );
}
