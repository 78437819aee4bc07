//! The core's test harness: a [`Gateway`] on a fake clock, with emulated clients and sleds
//! that speak to it through `handle` and `poll_output` only (the quinn-proto `Pair` idea).

mod auth;
mod cluster;
mod coordination;
mod coordination_sim;
mod fleet;
mod gateway;
mod gather;
mod interleavings;
mod limits;
mod modern;
mod mrtr;
mod news;
mod reload;
mod revocation;
mod rights;
mod spread;
mod store;
mod streams;
mod surface;
mod tasks;
mod trace;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{
    Config, Gateway, HttpMethod, HttpReply, HttpRequest, HttpToken, Input, Output, ProbeId,
    ProjectSpec, Registry, UplinkId,
};

/// The uplink token of the harness's projects, which its sleds present.
pub(crate) const HARNESS_UPLINK_TOKEN: &str = "harness-uplink-token";

pub(crate) struct Harness {
    pub(crate) gw: Gateway,
    pub(crate) now: Instant,
    next_token: u64,
    next_uplink: u64,
    /// Replies that arrived, by token.
    pub(crate) replies: HashMap<HttpToken, HttpReply>,
    /// Frames sent to each uplink, oldest first.
    pub(crate) frames: HashMap<UplinkId, Vec<Value>>,
    /// Every frame's text as the gateway wrote it, never taken.
    pub(crate) frame_texts: HashMap<UplinkId, Vec<String>>,
    pub(crate) closed: HashMap<UplinkId, (u16, String)>,
    /// SSE events sent on each open or closed stream, with their ids.
    pub(crate) streams: HashMap<HttpToken, Vec<(Option<u64>, Value)>>,
    pub(crate) streams_closed: Vec<HttpToken>,
    /// HTTP probes asked for and not yet answered by the test, oldest first.
    pub(crate) probes: Vec<(ProbeId, String, String)>,
    /// Every pin file the gateway asked to save, oldest first.
    pub(crate) saved_pins: Vec<String>,
    /// Every span the gateway asked to export, oldest first.
    pub(crate) spans: Vec<crate::SpanRecord>,
    /// What the gateway asked of the cluster's engine, in order.
    pub(crate) cluster: Vec<crate::cluster::ClusterAction>,
    /// A replica's coordination records, kept in a model of the engine's bucket that
    /// carries out `StoreCoord` and `LoadCoord` at once (their actions are not in `cluster`);
    /// shared by the replicas of one test.
    pub(crate) coord_bucket: Option<CoordBucket>,
}

/// A model of the engine's coordination bucket, for the replicas of one test.
pub(crate) type CoordBucket =
    std::rc::Rc<std::cell::RefCell<std::collections::BTreeMap<String, Vec<u8>>>>;

/// The tools an emulated sled reports.
pub(crate) fn sled_tools() -> Vec<Value> {
    vec![
        json!({"name":"show","inputSchema":{"type":"object","properties":{"story_id":{"type":"string"}},"required":["story_id"]}}),
        json!({"name":"create_story","inputSchema":{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}}),
    ]
}

impl Harness {
    /// A gateway over projects alpha, beta and gamma, default alpha.
    pub(crate) fn new() -> Harness {
        Harness::with(&["alpha", "beta", "gamma"], Some("alpha"))
    }

    pub(crate) fn with(projects: &[&str], default: Option<&str>) -> Harness {
        Harness::with_config(projects, default, Config::default(), [7; 32])
    }

    /// A gateway over `projects` with its own config and seed.
    pub(crate) fn with_config(
        projects: &[&str],
        default: Option<&str>,
        config: Config,
        seed: [u8; 32],
    ) -> Harness {
        // Uplinks are closed by default: the harness's projects have a token, which its sleds
        // present (`sled_says` adds it to a hello that has none). `tests/auth.rs` tests the
        // closed default and its exceptions.
        let specs = projects
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut spec = ProjectSpec::new(*p, format!("http://127.0.0.1:{}", 9101 + i));
                spec.token = Some(crate::Secret::new(HARNESS_UPLINK_TOKEN));
                spec
            })
            .collect();
        let registry = Registry::from_projects(specs, default).unwrap();
        Harness {
            gw: Gateway::new(registry, config, seed),
            // Only differences of instants matter; this is the fake clock's origin.
            #[allow(clippy::disallowed_methods)]
            now: Instant::now(),
            next_token: 0,
            next_uplink: 0,
            replies: HashMap::new(),
            frames: HashMap::new(),
            frame_texts: HashMap::new(),
            closed: HashMap::new(),
            streams: HashMap::new(),
            streams_closed: Vec::new(),
            probes: Vec::new(),
            saved_pins: Vec::new(),
            spans: Vec::new(),
            cluster: Vec::new(),
            coord_bucket: None,
        }
    }

    pub(crate) fn handle(&mut self, input: Input) {
        self.gw.handle(self.now, input);
        self.drain();
    }

    /// Moves the clock forward by `by`, firing each timer at its own time on the way.
    pub(crate) fn advance(&mut self, by: Duration) {
        let end = self.now + by;
        while let Some(at) = self.gw.poll_timeout() {
            if at > end {
                break;
            }
            self.now = self.now.max(at);
            self.gw.handle_timeout(self.now);
            self.drain();
        }
        self.now = end;
    }

    fn drain(&mut self) {
        let mut engine_answers = Vec::new();
        while let Some(o) = self.gw.poll_output() {
            match o {
                Output::Cluster(crate::cluster::ClusterAction::StoreCoord { batch, changes })
                    if self.coord_bucket.is_some() =>
                {
                    let mut bucket = self.coord_bucket.as_ref().unwrap().borrow_mut();
                    for c in changes {
                        match c.value {
                            Some(v) => bucket.insert(c.key, v),
                            None => bucket.remove(&c.key),
                        };
                    }
                    engine_answers.push(crate::cluster::ClusterEvent::CoordStored {
                        batch,
                        failed: Vec::new(),
                    });
                }
                Output::Cluster(crate::cluster::ClusterAction::LoadCoord { project })
                    if self.coord_bucket.is_some() =>
                {
                    let prefix = crate::coord::project_prefix(&project);
                    let records = self
                        .coord_bucket
                        .as_ref()
                        .unwrap()
                        .borrow()
                        .range(prefix.clone()..)
                        .take_while(|(k, _)| k.starts_with(&prefix))
                        .map(|(k, v)| crate::coord::StoredRecord {
                            key: k.clone(),
                            value: v.clone(),
                            age: Duration::ZERO,
                        })
                        .collect();
                    engine_answers.push(crate::cluster::ClusterEvent::CoordLoaded {
                        project,
                        records: Ok(records),
                    });
                }
                Output::Http { token, reply } => {
                    assert!(
                        self.replies.insert(token, reply).is_none(),
                        "two replies for {token:?}"
                    );
                }
                Output::UplinkSend { uplink, text } => {
                    assert!(
                        !self.closed.contains_key(&uplink),
                        "frame after close on {uplink:?}"
                    );
                    let v: Value = serde_json::from_str(&text).expect("the gateway sends JSON");
                    self.frames.entry(uplink).or_default().push(v);
                    self.frame_texts.entry(uplink).or_default().push(text);
                }
                Output::UplinkClose {
                    uplink,
                    code,
                    reason,
                } => {
                    self.closed.insert(uplink, (code, reason));
                }
                Output::StreamOpen { token } => {
                    assert!(!self.replies.contains_key(&token), "a stream after a reply");
                    let fresh = self.streams.insert(token, Vec::new()).is_none();
                    assert!(fresh, "opened twice");
                }
                Output::StreamEvent { token, id, data } => {
                    assert!(!self.streams_closed.contains(&token), "event after close");
                    let v: Value = serde_json::from_str(&data).expect("events are JSON");
                    let events = self.streams.get_mut(&token).expect("an open stream");
                    events.push((id, v));
                }
                Output::Probe {
                    probe,
                    project,
                    url,
                    timeout: _,
                } => self.probes.push((probe, project, url)),
                Output::SavePins { text } => {
                    crate::Pins::parse(&text).expect("the gateway saves pin files it can read");
                    self.saved_pins.push(text);
                }
                Output::Span(span) => {
                    assert!(span.start <= span.end, "a span ends after it starts");
                    self.spans.push(*span);
                }
                Output::Cluster(action) => self.cluster.push(action),
                Output::StreamClose { token } => {
                    assert!(
                        self.streams.contains_key(&token),
                        "close of a stream never opened"
                    );
                    assert!(!self.streams_closed.contains(&token), "closed twice");
                    self.streams_closed.push(token);
                }
            }
        }
        // The modelled engine answers at once, in order.
        for e in engine_answers {
            self.handle(Input::Cluster(e));
        }
    }

    /// Sends an HTTP request; returns its token.
    pub(crate) fn send(
        &mut self,
        method: HttpMethod,
        session: Option<&str>,
        body: &str,
    ) -> HttpToken {
        let request = HttpRequest {
            method,
            session: session.map(str::to_owned),
            content_type: Some("application/json".into()),
            accept: Some("application/json, text/event-stream".into()),
            body: body.as_bytes().to_vec(),
            ..HttpRequest::default()
        };
        self.request(request)
    }

    /// Sends any HTTP request; returns its token.
    pub(crate) fn request(&mut self, request: HttpRequest) -> HttpToken {
        let token = HttpToken(self.next_token);
        self.next_token += 1;
        self.handle(Input::Http { token, request });
        token
    }

    /// POSTs a JSON-RPC message and returns the reply, which must come at once.
    pub(crate) fn post(&mut self, session: Option<&str>, body: Value) -> HttpReply {
        let t = self.send(HttpMethod::Post, session, &body.to_string());
        self.replies.remove(&t).expect("an immediate reply")
    }

    /// POSTs a request and returns its parsed JSON-RPC response body.
    pub(crate) fn rpc(
        &mut self,
        session: Option<&str>,
        id: Value,
        method: &str,
        params: Value,
    ) -> Value {
        let r = self.post(
            session,
            json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}),
        );
        assert_eq!(r.status, 200, "{r:?}");
        serde_json::from_str(r.body.as_deref().unwrap()).unwrap()
    }

    pub(crate) fn call_body(id: Value, tool: &str, arguments: Value) -> String {
        json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":arguments}}).to_string()
    }

    /// Starts a `tools/call`; returns its token (the reply may come later).
    pub(crate) fn call(
        &mut self,
        session: Option<&str>,
        id: Value,
        tool: &str,
        arguments: Value,
    ) -> HttpToken {
        self.send(
            HttpMethod::Post,
            session,
            &Self::call_body(id, tool, arguments),
        )
    }

    pub(crate) fn reply_json(&mut self, token: HttpToken) -> Option<Value> {
        let r = self.replies.remove(&token)?;
        Some(serde_json::from_str(r.body.as_deref()?).unwrap())
    }

    pub(crate) fn initialize(&mut self) -> String {
        let r = self.post(
            None,
            json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}),
        );
        assert_eq!(r.status, 200);
        r.headers
            .iter()
            .find(|(h, _)| *h == "Mcp-Session-Id")
            .unwrap()
            .1
            .clone()
    }

    pub(crate) fn open_uplink(&mut self) -> UplinkId {
        let id = UplinkId(self.next_uplink);
        self.next_uplink += 1;
        self.handle(Input::UplinkOpened { uplink: id });
        id
    }

    pub(crate) fn sled_says(&mut self, uplink: UplinkId, mut v: Value) {
        if v["uplink"] == "hello" && v.get("token").is_none() {
            v["token"] = json!(HARNESS_UPLINK_TOKEN);
        }
        self.handle(Input::UplinkText {
            uplink,
            text: v.to_string(),
        });
    }

    /// Takes the frames sent to `uplink` so far.
    pub(crate) fn take_frames(&mut self, uplink: UplinkId) -> Vec<Value> {
        self.frames.remove(&uplink).unwrap_or_default()
    }

    /// Connects a sled for `project` and answers the gateway's tools/list.
    pub(crate) fn connect_sled(&mut self, project: &str) -> UplinkId {
        let u = self.open_uplink();
        self.sled_says(
            u,
            json!({"uplink":"hello","protocol":1,"project":project,"sled":project}),
        );
        let frames = self.take_frames(u);
        assert_eq!(frames[0]["uplink"], "welcome", "{frames:?}");
        assert_eq!(frames[1]["method"], "tools/list");
        let id = frames[1]["id"].clone();
        self.sled_says(
            u,
            json!({"jsonrpc":"2.0","id":id,"result":{"tools":sled_tools()}}),
        );
        u
    }

    /// Answers every pending tools/call on `uplink` the way an emulated sled would: a result
    /// naming the project and echoing the arguments.
    pub(crate) fn sled_answers_all(&mut self, uplink: UplinkId, project: &str) -> usize {
        let frames = self.take_frames(uplink);
        self.answer_calls(uplink, project, frames)
    }

    /// [`Harness::sled_answers_all`] for frames already taken, by a sled named like its project.
    pub(crate) fn sled_answers_all_frames(
        &mut self,
        uplink: UplinkId,
        frames: Vec<Value>,
    ) -> usize {
        let project = format!("{uplink:?}");
        self.answer_calls(uplink, &project, frames)
    }

    fn answer_calls(&mut self, uplink: UplinkId, project: &str, frames: Vec<Value>) -> usize {
        let mut n = 0;
        for f in frames {
            if f["method"] == "tools/call" {
                let result = json!({"content":[],"structuredContent":{"project":project,"tool":f["params"]["name"],"arguments":f["params"]["arguments"]}});
                self.sled_says(
                    uplink,
                    json!({"jsonrpc":"2.0","id":f["id"],"result":result}),
                );
                n += 1;
            }
        }
        n
    }
}
