//! The fleet tools: identity pins, health, and the pipeline fan-out.

use std::time::Duration;

use ed25519_dalek::SigningKey;
use serde_json::{json, Value};

use super::Harness;
use crate::identity::{encode_key, sign_challenge, Pin, Pins};
use crate::{Input, ProbeOutcome, UplinkId};

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

impl Harness {
    /// Says hello with `key`, answers the challenge (signing for `sign_as`), and returns the
    /// uplink and the frames after the proof.
    fn hello_signed(
        &mut self,
        project: &str,
        k: &SigningKey,
        sign_as: &str,
    ) -> (UplinkId, Vec<Value>) {
        let u = self.open_uplink();
        self.sled_says(
            u,
            json!({"uplink":"hello","protocol":1,"project":project,"sled":format!("{project}-sled"),"key":encode_key(&k.verifying_key())}),
        );
        let f = self.take_frames(u);
        assert_eq!(f[0]["uplink"], "challenge", "{f:?}");
        let sig = sign_challenge(k, "gw", sign_as, f[0]["nonce"].as_str().unwrap()).unwrap();
        self.sled_says(u, json!({"uplink":"proof","signature":sig,"gateway":"gw"}));
        (u, self.take_frames(u))
    }

    fn tool(&mut self, tool: &str, arguments: Value) -> Value {
        self.rpc(
            None,
            json!(9),
            "tools/call",
            json!({"name": tool, "arguments": arguments}),
        )
    }

    fn structured(&mut self, tool: &str, arguments: Value) -> Value {
        let r = self.tool(tool, arguments);
        assert!(r["result"]["structuredContent"].is_object(), "{r}");
        r["result"]["structuredContent"].clone()
    }

    /// Keeps `uplinks` alive (a pong each) while the clock moves `by`, in 1 s steps.
    fn advance_alive(&mut self, by: Duration, uplinks: &[UplinkId]) {
        let mut left = by;
        while !left.is_zero() {
            let step = left.min(Duration::from_secs(1));
            self.advance(step);
            left -= step;
            for u in uplinks {
                self.sled_says(*u, json!({"uplink":"pong","seq":0}));
            }
        }
    }
}

#[test]
fn the_first_key_is_pinned_an_impostor_is_refused_and_shown_and_only_a_repin_changes_that() {
    let mut h = Harness::new();
    let (real, f) = h.hello_signed("alpha", &key(1), "alpha");
    assert_eq!(f[0]["uplink"], "welcome");
    assert!(h.saved_pins.is_empty(), "saved after the delay");
    let delay = h.gw.config_mut().pin_save_delay;
    h.advance_alive(delay, &[real]);
    assert_eq!(h.saved_pins.len(), 1, "pinned on first use");
    let pins = Pins::parse(&h.saved_pins[0]).unwrap();
    assert_eq!(
        pins.get("alpha").unwrap().key,
        encode_key(&key(1).verifying_key())
    );

    // Another key for alpha: refused with 4007, and the real sled keeps its place.
    let (impostor, _) = h.hello_signed("alpha", &key(2), "alpha");
    assert_eq!(h.closed[&impostor].0, 4007);
    assert!(
        h.closed[&impostor].1.contains("pinned"),
        "{:?}",
        h.closed[&impostor]
    );
    assert!(!h.closed.contains_key(&real));
    assert!(h.gw.is_live("alpha"));
    let t = h.call(
        None,
        json!(1),
        "show",
        json!({"project":"alpha","story_id":"a"}),
    );
    let sent = h.take_frames(real);
    assert_eq!(
        sent.last().map(|f| f["method"].clone()),
        Some(json!("tools/call")),
        "{sent:?} {:?}",
        h.replies.get(&t)
    );
    h.sled_says(
        real,
        json!({"jsonrpc":"2.0","id":sent.last().unwrap()["id"],"result":{"content":[]}}),
    );
    assert!(h.reply_json(t).unwrap()["result"].is_object());

    let shown = h.structured("fleet_identity", json!({}));
    let alpha = &shown["projects"][0];
    assert_eq!(alpha["status"], "verified");
    assert_eq!(alpha["pinned"], encode_key(&key(1).verifying_key()));
    assert_eq!(alpha["live"], alpha["pinned"]);
    assert_eq!(alpha["refused"]["key"], encode_key(&key(2).verifying_key()));
    assert_eq!(alpha["refused"]["attempts"], 1);
    assert_eq!(shown["summary"]["refused"], json!(["alpha"]));
    assert_eq!(shown["summary"]["offline"], json!(["beta", "gamma"]));

    // A second attempt with the same key counts; nothing is re-pinned by itself.
    let (again, _) = h.hello_signed("alpha", &key(2), "alpha");
    assert_eq!(h.closed[&again].0, 4007);
    let shown = h.structured("fleet_identity", json!({"project":"alpha"}));
    assert_eq!(shown["projects"][0]["refused"]["attempts"], 2);
    assert_eq!(shown["projects"].as_array().unwrap().len(), 1);
    assert_eq!(h.saved_pins.len(), 1);

    // A re-pin must name its action, its project and the key: never "whoever knocked last".
    let r = h.tool("fleet_identity", json!({"action":"repin"}));
    assert_eq!(r["error"]["code"], -32602);
    let r = h.tool(
        "fleet_identity",
        json!({"action":"repin","project":"alpha"}),
    );
    assert_eq!(r["error"]["code"], -32602);
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("must name the key"),
        "{r}"
    );
    let r = h.tool(
        "fleet_identity",
        json!({"action":"repin","project":"alpha","key":"not a key"}),
    );
    assert_eq!(r["error"]["code"], -32602);
    let r = h.tool(
        "fleet_identity",
        json!({"action":"forget","project":"alpha"}),
    );
    assert_eq!(r["error"]["code"], -32602);
    assert_eq!(h.saved_pins.len(), 1);

    let done = h.structured(
        "fleet_identity",
        json!({"action":"repin","project":"alpha","key":encode_key(&key(2).verifying_key())}),
    );
    assert_eq!(done["pinned"], encode_key(&key(2).verifying_key()));
    assert_eq!(done["previous"], encode_key(&key(1).verifying_key()));
    assert_eq!(done["closed_live_uplink"], true);
    assert_eq!(h.closed[&real].0, 4007, "the old key's uplink goes");
    assert_eq!(h.saved_pins.len(), 2);
    let pins = Pins::parse(h.saved_pins.last().unwrap()).unwrap();
    assert_eq!(
        pins.get("alpha").unwrap().key,
        encode_key(&key(2).verifying_key())
    );
    let (new, f) = h.hello_signed("alpha", &key(2), "alpha");
    assert_eq!(f[0]["uplink"], "welcome");
    assert!(!h.closed.contains_key(&new));
    let (old, _) = h.hello_signed("alpha", &key(1), "alpha");
    assert_eq!(h.closed[&old].0, 4007);
}

#[test]
fn a_pinned_project_refuses_no_key_a_bad_proof_and_a_late_proof() {
    let mut h = Harness::new();
    let mut pins = Pins::default();
    pins.pins.insert(
        "beta".into(),
        Pin {
            key: encode_key(&key(5).verifying_key()),
            sled: "beta-sled".into(),
        },
    );
    h.gw.load_pins(pins);
    // Loaded pins hold from the first connection.
    let (u, _) = h.hello_signed("beta", &key(6), "beta");
    assert_eq!(h.closed[&u].0, 4007);
    // No key at all.
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"b"}),
    );
    assert_eq!(h.closed[&u].0, 4007);
    assert!(h.closed[&u].1.contains("presented none"));
    // The right key, but a signature made for another project.
    let (u, _) = h.hello_signed("beta", &key(5), "alpha");
    assert_eq!(h.closed[&u].0, 4007);
    assert!(
        h.closed[&u].1.contains("proof failed"),
        "{:?}",
        h.closed[&u]
    );
    // A bad key.
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"b","key":"AAAA"}),
    );
    assert_eq!(h.closed[&u].0, 4007);
    // No proof in time.
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"b","key":encode_key(&key(5).verifying_key())}),
    );
    h.advance(Duration::from_secs(11));
    assert_eq!(h.closed[&u].0, 4005);
    // Anything but a proof while one is awaited.
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":"beta","sled":"b","key":encode_key(&key(5).verifying_key())}),
    );
    h.sled_says(u, json!({"uplink":"pong","seq":1}));
    assert_eq!(h.closed[&u].0, 4004);
    // And the right one is accepted; no pin is saved (nothing changed).
    let (u, f) = h.hello_signed("beta", &key(5), "beta");
    assert_eq!(f[0]["uplink"], "welcome");
    assert!(!h.closed.contains_key(&u));
    let delay = h.gw.config_mut().pin_save_delay;
    h.advance_alive(delay * 2, &[u]);
    assert!(h.saved_pins.is_empty());
    // Unsigned sleds of unpinned projects are accepted unless identity is required.
    let a = h.connect_sled("alpha");
    assert!(!h.closed.contains_key(&a));
    let shown = h.structured("fleet_identity", json!({}));
    assert_eq!(shown["summary"]["unsigned"], json!(["alpha"]));
    h.gw.config_mut().require_identity = true;
    let g = h.open_uplink();
    h.sled_says(
        g,
        json!({"uplink":"hello","protocol":1,"project":"gamma","sled":"g"}),
    );
    assert_eq!(h.closed[&g].0, 4007);
}

#[test]
fn health_names_up_down_stale_and_unknown_projects_with_reasons() {
    let mut h = Harness::with(&["alpha", "beta", "gamma", "delta"], Some("alpha"));
    h.gw.config_mut().relay_stale_after = Duration::from_secs(10);
    let alpha = h.connect_sled("alpha");
    let gamma = h.connect_sled("gamma");
    let delta = h.connect_sled("delta");
    h.sled_says(
        alpha,
        json!({"uplink":"event","seq":1,"kind":"story_created","story":"alpha-1"}),
    );
    h.sled_says(delta, json!({"uplink":"event","seq":1,"kind":"sync"}));
    h.handle(Input::UplinkClosed { uplink: gamma });
    // Gamma's loss sends a probe at once.
    assert_eq!(h.probes.len(), 1);
    assert_eq!(h.probes[0].1, "gamma");
    assert_eq!(h.probes[0].2, "http://127.0.0.1:9103");

    let s = h.structured("gateway_health", json!({}));
    assert_eq!(s["summary"]["up"], json!(["alpha", "delta"]));
    assert_eq!(s["summary"]["down"], json!(["gamma"]));
    assert_eq!(s["summary"]["unknown"], json!(["beta"]));
    assert_eq!(s["projects"][0]["relay"]["status"], "fresh");
    assert_eq!(s["projects"][0]["relay"]["last_kind"], "story_created");
    assert_eq!(s["projects"][0]["relay"]["events"], 1);

    // Alpha keeps relaying; delta's relay stalls (its heartbeats go on).
    for _ in 0..10 {
        h.advance_alive(Duration::from_secs(1), &[alpha, delta]);
        h.sled_says(alpha, json!({"uplink":"event","seq":2,"kind":"sync"}));
    }
    h.advance_alive(Duration::from_millis(500), &[alpha, delta]);
    // The probe round has run: gamma's url refused, beta's answered.
    let probes = std::mem::take(&mut h.probes);
    let beta = probes
        .iter()
        .find(|p| p.1 == "beta")
        .expect("beta probed")
        .0;
    h.handle(Input::ProbeDone {
        probe: beta,
        outcome: ProbeOutcome::Status(200),
    });
    let gamma_probe = probes
        .iter()
        .rev()
        .find(|p| p.1 == "gamma")
        .expect("gamma probed")
        .0;
    h.handle(Input::ProbeDone {
        probe: gamma_probe,
        outcome: ProbeOutcome::Failed("connection refused".into()),
    });
    // An unknown or repeated probe result is ignored.
    h.handle(Input::ProbeDone {
        probe: beta,
        outcome: ProbeOutcome::Status(500),
    });

    let s = h.structured("gateway_health", json!({}));
    assert_eq!(s["summary"]["up"], json!(["alpha", "beta"]));
    assert_eq!(s["summary"]["down"], json!(["gamma"]));
    assert_eq!(s["summary"]["stale"], json!(["delta"]));
    assert_eq!(s["summary"]["unknown"], json!([]));
    let row = |name: &str| {
        s["projects"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["project"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(row("beta")["via"], "http");
    assert_eq!(row("beta")["probe"]["status"], 200);
    assert!(row("gamma")["reasons"][0]
        .as_str()
        .unwrap()
        .contains("connection refused"));
    let delta_row = row("delta");
    assert_eq!(delta_row["relay"]["status"], "stale");
    assert!(
        delta_row["reasons"][0].as_str().unwrap().contains("relay"),
        "{delta_row}"
    );
    assert!(delta_row["last_heartbeat_ms_ago"].as_u64().unwrap() <= 1000);

    // A probe that gets no answer fails at its deadline.
    h.advance_alive(Duration::from_secs(10), &[alpha, delta]);
    assert!(h.probes.iter().any(|p| p.1 == "beta"));
    h.advance_alive(Duration::from_secs(3), &[alpha, delta]);
    let s = h.structured("gateway_health", json!({}));
    let beta = s["projects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["project"] == "beta")
        .unwrap()
        .clone();
    assert_eq!(beta["status"], "down");
    assert!(
        beta["probe"]["error"]
            .as_str()
            .unwrap()
            .contains("no answer within"),
        "{beta}"
    );

    // A silent sled is stale before its heartbeat timeout closes it.
    h.advance_alive(Duration::from_secs(11), &[delta]);
    let s = h.structured("gateway_health", json!({}));
    assert!(
        s["summary"]["stale"]
            .as_array()
            .unwrap()
            .contains(&json!("alpha")),
        "{s}"
    );
    // Shutdown leaves no probe timers behind.
    h.handle(Input::Shutdown);
    assert_eq!(h.gw.poll_timeout(), None);
}

/// Connects a sled that lists `pipeline_status`.
fn connect_pipeline_sled(h: &mut Harness, project: &str) -> UplinkId {
    let u = h.open_uplink();
    h.sled_says(
        u,
        json!({"uplink":"hello","protocol":1,"project":project,"sled":project}),
    );
    let f = h.take_frames(u);
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","id":f[1]["id"],"result":{"tools":[{"name":"pipeline_status","inputSchema":{"type":"object"}}]}}),
    );
    u
}

fn answer_pipeline(h: &mut Harness, u: UplinkId, backlog: u64, blocked: Value) {
    for f in h.take_frames(u) {
        if f["method"] == "tools/call" {
            assert_eq!(f["params"]["name"], "pipeline_status");
            let status = json!({"total": backlog + 1, "stages": {"backlog": backlog, "done": 1}, "blocked": blocked, "failing": []});
            h.sled_says(
                u,
                json!({"jsonrpc":"2.0","id":f["id"],"result":{"content":[{"type":"text","text":status.to_string()}],"structuredContent":status}}),
            );
        }
    }
}

#[test]
fn pipeline_status_fans_out_and_names_every_project_that_did_not_answer() {
    let names = ["alpha", "beta", "gamma", "delta", "eps", "zeta"];
    let mut h = Harness::with(&names, Some("alpha"));
    let alpha = connect_pipeline_sled(&mut h, "alpha");
    let beta = connect_pipeline_sled(&mut h, "beta");
    let gamma = connect_pipeline_sled(&mut h, "gamma"); // slow: never answers
    let delta = connect_pipeline_sled(&mut h, "delta"); // answers with an error
    let eps = h.connect_sled("eps"); // lists no pipeline_status
                                     // zeta has no sled.
    let t = h.call(
        None,
        json!("agg"),
        "aggregate_pipeline_status",
        json!({"timeout_ms": 3000, "per_project_timeout_ms": 1000}),
    );
    assert!(!h.replies.contains_key(&t), "waits for the sleds");
    answer_pipeline(
        &mut h,
        alpha,
        2,
        json!([{"id":"alpha-1","reason":"waiting"}]),
    );
    h.advance(Duration::from_millis(300));
    answer_pipeline(&mut h, beta, 5, json!([]));
    for f in h.take_frames(delta) {
        h.sled_says(
            delta,
            json!({"jsonrpc":"2.0","id":f["id"],"error":{"code":-32603,"message":"disk full"}}),
        );
    }
    assert!(!h.replies.contains_key(&t));
    let sent_to_gamma = h.take_frames(gamma);
    assert_eq!(sent_to_gamma.len(), 1);
    h.advance(Duration::from_millis(700));
    // Gamma's own deadline passed: the answer comes now, well before the overall deadline.
    let r = h
        .reply_json(t)
        .expect("answered at the slowest sled's deadline");
    assert_eq!(r["id"], "agg");
    let s = &r["result"]["structuredContent"];
    let reasons: Vec<(String, String)> = s["not_answered"]
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
    assert_eq!(
        reasons,
        [
            ("delta".to_owned(), "error".to_owned()),
            ("eps".to_owned(), "error".to_owned()),
            ("gamma".to_owned(), "timed_out".to_owned()),
            ("zeta".to_owned(), "no_uplink".to_owned()),
        ]
    );
    assert!(s["not_answered"][0]["detail"]
        .as_str()
        .unwrap()
        .contains("disk full"));
    assert_eq!(s["totals"]["registered"], 6);
    assert_eq!(s["totals"]["answered"], 2);
    assert_eq!(s["totals"]["stages"]["backlog"], 7);
    assert_eq!(s["totals"]["stages"]["done"], 2);
    assert_eq!(s["totals"]["blocked"], 1);
    assert_eq!(s["totals"]["stories"], 9);
    assert_eq!(s["took_ms"], 1000);
    // Every project has its row, answered or not, and the text block is the same object.
    let rows: Vec<(&str, &str)> = s["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["project"].as_str().unwrap(),
                p["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(rows.len(), 6, "{rows:?}");
    assert_eq!(
        rows.iter().filter(|(_, st)| *st == "ok").count(),
        2,
        "{rows:?}"
    );
    let answered = s["projects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["status"] == "ok")
        .unwrap();
    assert!(
        answered["stages"].is_object() && answered["took_ms"].is_u64(),
        "{answered}"
    );
    let text: Value =
        serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(&text, s);
    // Gamma was told to stop.
    let c = h.take_frames(gamma);
    assert_eq!(c[0]["method"], "notifications/cancelled");
    assert_eq!(c[0]["params"]["requestId"], sent_to_gamma[0]["id"]);
    // A late answer from gamma is dropped, not misdelivered.
    let late = h.gw.stats().responses_dropped_late;
    answer_pipeline(&mut h, gamma, 1, json!([]));
    h.sled_says(
        gamma,
        json!({"jsonrpc":"2.0","id":sent_to_gamma[0]["id"],"result":{}}),
    );
    assert_eq!(h.gw.stats().responses_dropped_late, late + 1);
    let _ = eps;
}

#[test]
fn the_overall_deadline_bounds_the_answer_and_a_lost_uplink_or_client_ends_its_part() {
    let mut h = Harness::new();
    let alpha = connect_pipeline_sled(&mut h, "alpha");
    let beta = connect_pipeline_sled(&mut h, "beta");
    let gamma = connect_pipeline_sled(&mut h, "gamma");
    let t = h.call(
        None,
        json!(1),
        "aggregate_pipeline_status",
        json!({"timeout_ms": 500, "per_project_timeout_ms": 2000}),
    );
    h.handle(Input::UplinkClosed { uplink: beta });
    answer_pipeline(&mut h, gamma, 1, json!([]));
    h.advance(Duration::from_millis(499));
    assert!(!h.replies.contains_key(&t));
    h.advance(Duration::from_millis(1));
    let r = h.reply_json(t).expect("answered at the overall deadline");
    let s = &r["result"]["structuredContent"];
    assert_eq!(
        s["deadline_ms"]["per_project"], 500,
        "capped by the overall deadline"
    );
    assert_eq!(s["not_answered"][0]["project"], "alpha");
    assert_eq!(s["not_answered"][0]["reason"], "timed_out");
    assert_eq!(s["not_answered"][1]["project"], "beta");
    assert!(
        s["not_answered"][1]["detail"]
            .as_str()
            .unwrap()
            .contains("uplink closed"),
        "{s}"
    );
    assert_eq!(s["totals"]["answered"], 1);
    assert_eq!(h.gw.stats().pending_calls, 0);

    // A client that goes away cancels its sleds' requests.
    let t = h.call(None, json!(2), "aggregate_pipeline_status", json!({}));
    let sent = h.take_frames(alpha);
    h.handle(Input::HttpAborted { token: t });
    let c = h.take_frames(alpha);
    assert_eq!(c.last().unwrap()["method"], "notifications/cancelled");
    assert_eq!(
        c.last().unwrap()["params"]["requestId"],
        sent.last().unwrap()["id"]
    );
    assert!(!h.replies.contains_key(&t));

    // Bad arguments are refused; with no sled at all the answer is immediate.
    let r = h.tool("aggregate_pipeline_status", json!({"timeout_ms": 0}));
    assert_eq!(r["error"]["code"], -32602);
    let r = h.tool("aggregate_pipeline_status", json!({"verbose": true}));
    assert_eq!(r["error"]["code"], -32602);
    let mut empty = Harness::new();
    let s = empty.structured("aggregate_pipeline_status", json!({}));
    assert_eq!(s["totals"]["answered"], 0);
    assert_eq!(s["not_answered"].as_array().unwrap().len(), 3);

    // Shutdown answers a fan-out still waiting.
    let t = h.call(None, json!(3), "aggregate_pipeline_status", json!({}));
    h.handle(Input::Shutdown);
    assert!(h.reply_json(t).is_some());
    assert_eq!(h.gw.poll_timeout(), None);
}

#[test]
fn a_fleet_pinned_in_a_burst_is_saved_once_and_shutdown_saves_what_is_pending() {
    let mut h = Harness::new();
    let delay = h.gw.config_mut().pin_save_delay;
    assert!(!delay.is_zero());
    for (i, p) in ["alpha", "beta", "gamma"].into_iter().enumerate() {
        let (_, f) = h.hello_signed(p, &key(10 + i as u8), p);
        assert_eq!(f[0]["uplink"], "welcome");
        h.advance(delay / 4);
    }
    assert!(h.saved_pins.is_empty(), "{:?}", h.saved_pins);
    h.advance(delay);
    assert_eq!(h.saved_pins.len(), 1, "one save for the burst");
    let pins = Pins::parse(&h.saved_pins[0]).unwrap();
    for (i, p) in ["alpha", "beta", "gamma"].into_iter().enumerate() {
        assert_eq!(
            pins.get(p).unwrap().key,
            encode_key(&key(10 + i as u8).verifying_key())
        );
    }
    // Nothing changed since: no further save, however long.
    h.advance(delay * 10);
    assert_eq!(h.saved_pins.len(), 1);

    // A pin still waiting for its save when shutdown starts is saved then.
    let mut h = Harness::new();
    h.hello_signed("alpha", &key(1), "alpha");
    assert!(h.saved_pins.is_empty());
    h.handle(Input::Shutdown);
    assert_eq!(h.saved_pins.len(), 1);
    assert!(Pins::parse(&h.saved_pins[0])
        .unwrap()
        .get("alpha")
        .is_some());
    h.advance(delay * 2);
    assert_eq!(h.saved_pins.len(), 1, "the timer went with the save");

    // With no delay, every pin is saved at once.
    let mut h = Harness::new();
    h.gw.config_mut().pin_save_delay = Duration::ZERO;
    h.hello_signed("alpha", &key(1), "alpha");
    h.hello_signed("beta", &key(2), "beta");
    assert_eq!(h.saved_pins.len(), 2);
}

/// A connector sled says how the MCP server behind it is: `gateway_health` shows it, and a
/// server that is down makes its project down, saying why; a long reason is cut.
#[test]
fn health_shows_the_server_behind_a_connector_sled() {
    let mut h = Harness::with(&["alpha", "beta"], Some("alpha"));
    let alpha = h.connect_sled("alpha");
    h.connect_sled("beta");
    let row = |h: &mut Harness, i: usize| {
        h.structured("gateway_health", json!({}))["projects"][i].clone()
    };
    // A sled that says nothing of a server has no upstream in its row.
    assert!(
        row(&mut h, 1).get("upstream").is_none(),
        "{}",
        row(&mut h, 1)
    );

    h.sled_says(
        alpha,
        json!({"uplink":"upstream","state":"down","reason":"its stdout closed; signal: 9 (SIGKILL)","restarts":2}),
    );
    let r = row(&mut h, 0);
    assert_eq!(r["status"], "down", "{r}");
    assert_eq!(
        r["reasons"][0],
        "its MCP server is down: its stdout closed; signal: 9 (SIGKILL) (2 restarts)"
    );
    assert_eq!(
        r["upstream"],
        json!({"state": "down", "reason": "its stdout closed; signal: 9 (SIGKILL)", "restarts": 2})
    );

    h.sled_says(
        alpha,
        json!({"uplink":"upstream","state":"starting","restarts":3}),
    );
    assert_eq!(row(&mut h, 0)["status"], "unknown");
    h.sled_says(
        alpha,
        json!({"uplink":"upstream","state":"running","restarts":3,"reason":"x".repeat(5000)}),
    );
    let r = row(&mut h, 0);
    assert_eq!(r["status"], "up", "{r}");
    assert_eq!(
        r["upstream"]["reason"].as_str().map(str::len),
        Some(crate::uplink::MAX_UPSTREAM_REASON)
    );
    // A state the protocol does not name is an invalid frame, and changes nothing.
    h.sled_says(alpha, json!({"uplink":"upstream","state":"melting"}));
    assert_eq!(row(&mut h, 0)["upstream"]["state"], "running");
}
