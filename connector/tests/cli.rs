//! `gateway-sled`'s command line, as a user meets it: help, and what it refuses before it
//! dials anything (exit 2, one line saying what is wrong). Building this test also builds the
//! binary, which `tests/tests/connector.rs` runs against a real gateway.

use std::process::Command;

fn sled(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gateway-sled"))
        .args(args)
        .env_remove("SLED_UPLINK_TOKEN")
        .output()
        .expect("gateway-sled runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn help_names_both_kinds_of_server() {
    let (code, text) = sled(&["--help"]);
    assert_eq!(code, 0, "{text}");
    for flag in [
        "--gateway",
        "--project",
        "--url",
        "--config",
        "--lease",
        "--token-file",
    ] {
        assert!(text.contains(flag), "{flag}: {text}");
    }
}

#[test]
fn what_cannot_run_is_refused_before_anything_is_dialed() {
    let (code, text) = sled(&["--gateway", "http://127.0.0.1:9", "--project", "a"]);
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("command (after `--`) or --url is required"),
        "{text}"
    );
    let (code, text) = sled(&["--gateway", "ftp://x", "--project", "a", "--", "true"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("gateway"), "{text}");
    let (code, text) = sled(&[
        "--gateway",
        "http://127.0.0.1:9",
        "--project",
        "a",
        "--url",
        "http://127.0.0.1:9",
    ]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("names no path"), "{text}");
    let (code, text) = sled(&["--config", "/nonexistent/sleds.toml"]);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("/nonexistent/sleds.toml"), "{text}");
}
