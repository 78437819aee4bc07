//! Property: whatever the interleaving of many sessions switching and calling, each call goes to
//! its explicit project or to its own session's last switch, and each response comes back to the
//! request it answers, even when every session uses the same ids.

use std::collections::HashMap;

use proptest::prelude::*;
use serde_json::{json, Value};

use super::Harness;
use crate::HttpToken;

const PROJECTS: [&str; 3] = ["alpha", "beta", "gamma"];

#[derive(Debug, Clone)]
enum Op {
    Switch {
        session: usize,
        project: usize,
    },
    Call {
        session: usize,
        explicit: Option<usize>,
        id: u8,
    },
    /// The sled of a project answers one of its pending calls (the n-th, modulo).
    Answer {
        project: usize,
        nth: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..4usize, 0..3usize).prop_map(|(session, project)| Op::Switch { session, project }),
        (0..4usize, proptest::option::of(0..3usize), 0..3u8).prop_map(|(session, explicit, id)| {
            Op::Call {
                session,
                explicit,
                id,
            }
        }),
        (0..3usize, 0..8usize).prop_map(|(project, nth)| Op::Answer { project, nth }),
    ]
}

struct Expect {
    session: usize,
    id: u8,
    project: &'static str,
    nonce: u64,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn calls_go_where_their_own_session_says(ops in proptest::collection::vec(op(), 1..80)) {
        let mut h = Harness::new();
        let sessions: Vec<String> = (0..4).map(|_| h.initialize()).collect();
        let uplinks: Vec<_> = PROJECTS.iter().map(|p| h.connect_sled(p)).collect();
        let mut defaults = [0usize; 4];
        let mut expect: HashMap<HttpToken, Expect> = HashMap::new();
        let mut queued: Vec<Vec<Value>> = vec![Vec::new(); 3];
        let mut nonce = 0u64;
        for op in ops {
            match op {
                Op::Switch { session, project } => {
                    let r = h.rpc(Some(&sessions[session]), json!(0), "tools/call",
                        json!({"name":"switch_project","arguments":{"project":PROJECTS[project]}}));
                    prop_assert_eq!(&r["result"]["structuredContent"]["project"], PROJECTS[project]);
                    defaults[session] = project;
                }
                Op::Call { session, explicit, id } => {
                    nonce += 1;
                    let mut args = json!({"nonce": nonce});
                    if let Some(p) = explicit { args["project"] = json!(PROJECTS[p]); }
                    let t = h.call(Some(&sessions[session]), json!(id), "show", args);
                    let project = PROJECTS[explicit.unwrap_or(defaults[session])];
                    expect.insert(t, Expect { session, id, project, nonce });
                    for (i, u) in uplinks.iter().enumerate() {
                        queued[i].extend(h.take_frames(*u).into_iter().filter(|f| f["method"] == "tools/call"));
                    }
                }
                Op::Answer { project, nth } => {
                    if queued[project].is_empty() { continue; }
                    let at = nth % queued[project].len();
                    let f = queued[project].remove(at);
                    let result = json!({"structuredContent":{"project":PROJECTS[project],"nonce":f["params"]["arguments"]["nonce"]}});
                    h.sled_says(uplinks[project], json!({"jsonrpc":"2.0","id":f["id"],"result":result}));
                }
            }
            let done: Vec<HttpToken> = h.replies.keys().copied().collect();
            for t in done {
                let r = h.reply_json(t).unwrap();
                let e = expect.remove(&t).expect("a reply for a call that was made");
                prop_assert_eq!(&r["id"], &json!(e.id), "session {}", e.session);
                prop_assert_eq!(&r["result"]["structuredContent"]["project"], e.project);
                prop_assert_eq!(&r["result"]["structuredContent"]["nonce"], &json!(e.nonce));
            }
        }
        prop_assert_eq!(h.gw.stats().responses_dropped_unknown, 0);
    }
}
