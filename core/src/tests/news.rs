//! News for the streams other replicas hold: tool listings through the engine's tools bucket,
//! list changes and session notifications as announcements (`gateway/news.rs`).

use serde_json::{json, Value};

use super::cluster::{event, initialize, owned_by, replica, sled_claimed, take_actions};
use super::modern::modern;
use super::streams::{get, methods};
use super::{sled_tools, Harness};
use crate::cluster::{Announcement, ClusterAction, ClusterEvent};
use crate::directory::EntryState;
use crate::{HttpMethod, HttpToken};

fn get_stream(h: &mut Harness, session: &str) -> HttpToken {
    get(h, Some(session), None)
}

fn stateless_tool_names(h: &mut Harness) -> Vec<String> {
    let t = modern(h, 50, "tools/list", json!({}), &|_| {});
    let r: Value =
        serde_json::from_str(h.replies.remove(&t).unwrap().body.as_deref().unwrap()).unwrap();
    r["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

fn tools_changed(project: &str, tools: &[Value]) -> ClusterEvent {
    ClusterEvent::ToolsChanged {
        project: project.into(),
        listing: Some(serde_json::to_string(tools).unwrap()),
        under_previous_secret: false,
    }
}

#[test]
fn a_local_sleds_listing_goes_to_the_tools_bucket() {
    let mut h = replica("r1");
    sled_claimed(&mut h, "alpha", 4);
    let stored: Vec<Value> = take_actions(&mut h)
        .into_iter()
        .filter_map(|a| match a {
            ClusterAction::StoreTools { project, listing } if project == "alpha" => {
                Some(serde_json::from_str(&listing).unwrap())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        stored,
        [Value::Array(sled_tools())],
        "as the sled listed them"
    );
    // Its own write, watched back, changes nothing here.
    let s = initialize(&mut h);
    let g = get_stream(&mut h, &s);
    event(&mut h, tools_changed("alpha", &sled_tools()[..1]));
    assert!(methods(&h, g).is_empty());
    assert!(stateless_tool_names(&mut h).contains(&"create_story".to_owned()));
}

#[test]
fn the_stateless_list_names_tools_held_elsewhere_while_their_sled_is() {
    let mut h = replica("r1");
    let s = initialize(&mut h);
    take_actions(&mut h);
    let g = get_stream(&mut h, &s);
    let listen = modern(
        &mut h,
        9,
        "subscriptions/listen",
        json!({"notifications":{"toolsListChanged":true}}),
        &|_| {},
    );
    // A listing with no holder is not listed (and no stream hears of it).
    event(&mut h, tools_changed("alpha", &sled_tools()));
    assert!(!stateless_tool_names(&mut h).contains(&"show".to_owned()));
    assert!(methods(&h, g).is_empty());
    // alpha's sled comes to r2: its tools are listed here, and the session whose default it
    // is and the listener hear of it.
    owned_by(&mut h, "alpha", "r2", 3);
    let names = stateless_tool_names(&mut h);
    assert!(names.contains(&"show".to_owned()) && names.contains(&"create_story".to_owned()));
    assert_eq!(methods(&h, g), ["notifications/tools/list_changed"]);
    assert_eq!(
        methods(&h, listen)[1..],
        ["notifications/tools/list_changed"]
    );
    // r2 lists them again, one fewer.
    event(&mut h, tools_changed("alpha", &sled_tools()[1..]));
    let names = stateless_tool_names(&mut h);
    assert!(!names.contains(&"show".to_owned()), "{names:?}");
    assert_eq!(methods(&h, g).len(), 2);
    // The same listing again is no news; a refresh of the claim is none either.
    event(&mut h, tools_changed("alpha", &sled_tools()[1..]));
    owned_by(&mut h, "alpha", "r2", 5);
    assert_eq!(methods(&h, g).len(), 2);
    // An unreadable listing is ignored.
    event(
        &mut h,
        ClusterEvent::ToolsChanged {
            project: "alpha".into(),
            listing: Some("{not json".into()),
            under_previous_secret: false,
        },
    );
    assert_eq!(methods(&h, g).len(), 2);
    // The sled leaves the cluster: its tools are gone from the list.
    event(
        &mut h,
        ClusterEvent::Entry {
            project: "alpha".into(),
            revision: 6,
            state: EntryState::Deleted,
        },
    );
    assert!(!stateless_tool_names(&mut h).contains(&"create_story".to_owned()));
    assert_eq!(methods(&h, g).len(), 3);
    assert_eq!(methods(&h, listen).len(), 4, "{:?}", methods(&h, listen));
}

#[test]
fn list_changes_are_announced_and_heard_where_the_streams_are() {
    // The holder announces its sled's prompts change.
    let mut h = replica("r2");
    let u = sled_claimed(&mut h, "alpha", 3);
    take_actions(&mut h);
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","method":"notifications/prompts/list_changed"}),
    );
    assert_eq!(
        take_actions(&mut h),
        [ClusterAction::Announce(Announcement::ListChanged {
            project: "alpha".into(),
            method: "notifications/prompts/list_changed".into(),
        })]
    );
    // Another replica's stream hears it; news of a project whose sled is here is not taken
    // from others, and unknown lists are ignored.
    let mut h = replica("r1");
    owned_by(&mut h, "alpha", "r2", 3);
    sled_claimed(&mut h, "beta", 4);
    let s = initialize(&mut h);
    let g = get_stream(&mut h, &s);
    for (project, method) in [
        ("alpha", "notifications/prompts/list_changed"),
        ("alpha", "notifications/other/list_changed"),
        ("beta", "notifications/resources/list_changed"),
        ("nope", "notifications/resources/list_changed"),
    ] {
        event(
            &mut h,
            ClusterEvent::Announced(Announcement::ListChanged {
                project: project.into(),
                method: method.into(),
            }),
        );
    }
    assert_eq!(methods(&h, g), ["notifications/prompts/list_changed"]);
}

#[test]
fn a_notification_for_a_session_whose_stream_is_elsewhere_goes_there() {
    // At alpha's holder: a session (made elsewhere, its stream elsewhere) subscribed to a
    // resource; the sled's update is announced for it.
    let mut h = replica("r2");
    let u = sled_claimed(&mut h, "alpha", 3);
    let s = initialize(&mut h);
    take_actions(&mut h);
    let t = h.send(
        HttpMethod::Post,
        Some(&s),
        r#"{"jsonrpc":"2.0","id":1,"method":"resources/subscribe","params":{"uri":"story://alpha/a-1"}}"#,
    );
    let frames = h.take_frames(u);
    let asked = frames
        .iter()
        .find(|f| f["method"] == "resources/subscribe")
        .expect("forwarded to the sled");
    h.sled_says(u, json!({"jsonrpc":"2.0","id":asked["id"],"result":{}}));
    assert!(h.replies.contains_key(&t));
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"story://alpha/a-1"}}),
    );
    let announced = take_actions(&mut h);
    let [ClusterAction::Announce(Announcement::ToSessions { sessions, data })] =
        announced.as_slice()
    else {
        panic!("{announced:?}");
    };
    assert_eq!(sessions, std::slice::from_ref(&s));
    let n: Value = serde_json::from_str(data).unwrap();
    assert_eq!(n["method"], "notifications/resources/updated");
    assert_eq!(n["params"]["uri"], "story://alpha/a-1");
    // With the stream here, it goes there and nothing is announced.
    let g = get_stream(&mut h, &s);
    h.sled_says(
        u,
        json!({"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"story://alpha/a-1"}}),
    );
    assert!(take_actions(&mut h).is_empty());
    assert_eq!(methods(&h, g), ["notifications/resources/updated"]);

    // The replica holding a stream sends what is announced for it; a session without a
    // stream here, and data that is not a notification on one line of JSON (a request, an
    // answer), get nothing.
    let mut h = replica("r1");
    let a = initialize(&mut h);
    take_actions(&mut h);
    let b = initialize(&mut h);
    let g = get_stream(&mut h, &a);
    let request =
        r#"{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{"messages":[]}}"#;
    let answer = r#"{"jsonrpc":"2.0","id":7,"result":{}}"#;
    for data in [
        data.clone(),
        "not json".into(),
        "{\n}".into(),
        request.into(),
        answer.into(),
        r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#.into(),
    ] {
        event(
            &mut h,
            ClusterEvent::Announced(Announcement::ToSessions {
                sessions: vec![a.clone(), b.clone(), "unknown".into()],
                data,
            }),
        );
    }
    assert_eq!(methods(&h, g), ["notifications/resources/updated"]);
}

#[test]
fn a_listen_naming_a_project_held_elsewhere_is_relayed_there() {
    let mut h = replica("r1");
    owned_by(&mut h, "alpha", "r2", 3);
    take_actions(&mut h);
    let t = modern(
        &mut h,
        9,
        "subscriptions/listen",
        json!({"notifications":{"resourceSubscriptions":["story://alpha/a-1"]},
               "_meta":{"io.mcp-gateway/project":"alpha"}}),
        &|_| {},
    );
    let actions = take_actions(&mut h);
    assert!(
        matches!(actions.as_slice(), [ClusterAction::Relay { token, replica, .. }] if *token == t && replica == "r2"),
        "{actions:?}"
    );
    // Tools only: served here (every replica has every listing).
    let t = modern(
        &mut h,
        10,
        "subscriptions/listen",
        json!({"notifications":{"toolsListChanged":true}}),
        &|_| {},
    );
    assert!(take_actions(&mut h).is_empty());
    assert!(h.streams.contains_key(&t));
}

#[test]
fn listeners_of_a_project_end_when_its_sled_leaves_the_replica() {
    let mut h = replica("r1");
    let alpha = sled_claimed(&mut h, "alpha", 3);
    take_actions(&mut h);
    let of_alpha = modern(
        &mut h,
        9,
        "subscriptions/listen",
        json!({"notifications":{"promptsListChanged":true},
               "_meta":{"io.mcp-gateway/project":"alpha"}}),
        &|_| {},
    );
    let of_tools = modern(
        &mut h,
        10,
        "subscriptions/listen",
        json!({"notifications":{"toolsListChanged":true}}),
        &|_| {},
    );
    h.handle(crate::Input::UplinkClosed { uplink: alpha });
    // Ended with a complete result, so that its client listens again where alpha's sled is.
    assert!(h.streams_closed.contains(&of_alpha));
    let last = &h.streams[&of_alpha].last().unwrap().1;
    assert_eq!(last["result"]["resultType"], "complete", "{last}");
    // A listener of the tool list stays, and hears that alpha's tools are gone.
    assert!(!h.streams_closed.contains(&of_tools));
    assert_eq!(
        methods(&h, of_tools)[1..],
        ["notifications/tools/list_changed"]
    );
}
