//! projects.toml reloads: added projects routable at once, removed ones failing clearly,
//! sessions and healthy uplinks kept.

use serde_json::json;

use super::Harness;
use crate::{Input, Registry};

fn registry(text: &str) -> Registry {
    // The harness's sleds present a token these files do not give: the projects are open.
    Registry::parse("projects.toml", text)
        .unwrap()
        .allowing_unauthenticated_uplinks()
}

#[test]
fn a_reload_adds_and_removes_projects_without_dropping_the_rest() {
    let mut h = Harness::new();
    let s = h.initialize();
    let alpha = h.connect_sled("alpha");
    let beta = h.connect_sled("beta");
    let pending = h.call(Some(&s), json!(1), "show", json!({"project":"beta"}));
    h.take_frames(beta);
    // beta goes, delta comes; alpha and the session stay.
    h.handle(Input::Reload {
        registry: registry(
            "default = \"alpha\"\n[[project]]\nname = \"alpha\"\nurl = \"http://a\"\n[[project]]\nname = \"delta\"\nurl = \"http://d\"\n",
        ),
    });
    let r = h.reply_json(pending).unwrap();
    assert_eq!(r["error"]["data"]["reason"], "unregistered");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("removed from projects.toml"));
    assert_eq!(h.closed[&beta].0, 4003);
    assert!(!h.closed.contains_key(&alpha));
    assert!(h.gw.is_live("alpha"));
    let r = h.rpc(
        Some(&s),
        json!(2),
        "tools/call",
        json!({"name":"show","arguments":{"project":"beta"}}),
    );
    assert_eq!(r["error"]["data"]["kind"], "unknown_project");
    assert_eq!(r["error"]["data"]["registered"], json!(["alpha", "delta"]));
    // delta is routable at once: registered, and its sled may connect.
    let r = h.rpc(
        Some(&s),
        json!(3),
        "tools/call",
        json!({"name":"show","arguments":{"project":"delta"}}),
    );
    assert_eq!(r["error"]["data"]["kind"], "sled_not_connected");
    let delta = h.connect_sled("delta");
    let t = h.call(Some(&s), json!(4), "show", json!({"project":"delta"}));
    assert_eq!(h.sled_answers_all(delta, "delta"), 1);
    assert_eq!(
        h.reply_json(t).unwrap()["result"]["structuredContent"]["project"],
        "delta"
    );
    // The session survived, with its default.
    assert_eq!(h.gw.session_default(&s), Some("alpha"));
    let r = h.rpc(
        Some(&s),
        json!(5),
        "tools/call",
        json!({"name":"list_projects"}),
    );
    let names: Vec<&str> = r["result"]["structuredContent"]["projects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["alpha", "delta"]);
}
