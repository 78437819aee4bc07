//! The stateless era's multi round-trip requests (MRTR, 2026-07-28).
//!
//! A sled speaks to the gateway as a server of the handshake era: while it works on a call it
//! may ask the call's client for sampling, an elicitation or its roots. A stateless client
//! cannot be asked on an open stream; the era asks it by answering the request itself with an
//! `input_required` result carrying the sled's requests, and the client retries the original
//! request with `inputResponses` and the echoed `requestState`.
//!
//! The gateway keeps the sled's call running in between: the call is *parked* (no HTTP
//! request waits for it; its deadline restarts so the client has the call's whole timeout to
//! come back), and the `requestState` is an unguessable handle naming it, single use, bound to
//! the original method and name (tool, prompt or resource URI). The retry *attaches* to the
//! same pending call: each response goes back to the sled under the sled's id, and the call's
//! answer (or the sled's next request) goes to the retry. A sled that answers while its call
//! is parked has its answer held for the retry until the parked deadline. A request needing
//! a capability the client did not declare fails the call with -32021 and cancels it at the
//! sled.
//!
//! [`Retries`] is the bookkeeping of handles; the flow lives in `impl Gateway` below.

use super::*;

/// The requests of the era that may be answered with `input_required`.
pub(super) const MRTR_METHODS: &[&str] = &["tools/call", "prompts/get", "resources/read"];

/// The era's key of a request's client capabilities in `params._meta`.
const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";

/// Which of the capabilities a sled's requests need (`proxy::SERVER_REQUESTS`) a stateless
/// request declared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Declared(u8);

impl Declared {
    /// From a request's `_meta`.
    pub(super) fn from_meta(meta: &Map<String, Value>) -> Declared {
        let mut bits = 0;
        if let Some(Value::Object(caps)) = meta.get(META_CLIENT_CAPABILITIES) {
            for (i, (_, capability)) in proxy::SERVER_REQUESTS.iter().enumerate() {
                if caps.contains_key(*capability) {
                    bits |= 1 << i;
                }
            }
        }
        Declared(bits)
    }

    pub(super) fn has(self, capability: &str) -> bool {
        proxy::SERVER_REQUESTS
            .iter()
            .position(|(_, c)| *c == capability)
            .is_some_and(|i| self.0 & (1 << i) != 0)
    }
}

/// A sled's request for the client of a stateless call.
#[derive(Debug)]
pub(super) struct Ask {
    /// Its key in `inputRequests` / `inputResponses`.
    key: String,
    /// The sled's id for it (raw JSON).
    sled_id: Box<str>,
    /// `{"method":…,"params":…}`.
    request: String,
    /// Whether an `input_required` result gave it to the client.
    asked: bool,
}

/// The MRTR state of a stateless call whose method allows `input_required`.
#[derive(Debug)]
pub(super) struct Rounds {
    /// The request's method and name (tool or prompt name, resource URI): a retry must repeat
    /// both.
    method: String,
    pub(super) name: Option<String>,
    /// The client capabilities of the latest request (the original, then each retry).
    declared: Declared,
    /// The call's timeout: the deadline restarts from it at each round.
    timeout: Duration,
    asks: Vec<Ask>,
    /// The `requestState` handed out, while the call waits for its client's retry.
    parked: Option<String>,
    /// Who made the call ([`crate::Identity::session_owner`]; `None` without client
    /// authentication): a retry from anyone else is answered as one naming no call
    /// (security review finding 13).
    owner: Option<String>,
}

impl Rounds {
    /// The handle the call is parked under, if it is: taken, as the call ends.
    pub(super) fn take_parked(&mut self) -> Option<String> {
        self.parked.take()
    }

    pub(super) fn is_parked(&self) -> bool {
        self.parked.is_some()
    }

    pub(super) fn new(
        method: &str,
        meta: Option<&Value>,
        timeout: Duration,
        owner: Option<String>,
    ) -> Box<Rounds> {
        Box::new(Rounds {
            owner,
            method: method.to_owned(),
            name: None,
            declared: meta
                .and_then(Value::as_object)
                .map(Declared::from_meta)
                .unwrap_or_default(),
            timeout,
            asks: Vec::new(),
            parked: None,
        })
    }
}

/// A parked call the sled answered before its client came back.
#[derive(Debug)]
struct Held {
    call: Call,
    /// The response, with the original request's id.
    body: String,
    outcome: Outcome,
    took: Duration,
}

/// The `requestState` handles of parked calls, and the answers held for them.
#[derive(Debug, Default)]
pub(super) struct Retries {
    /// The call each handle parks, by the gateway's call id (its uplink is the call table's
    /// to say: it may change while the call is parked).
    waiting: HashMap<String, calls::CallId>,
    held: HashMap<String, Held>,
    /// Handles in `held`, oldest first, with the instant they expire.
    held_order: VecDeque<(Instant, String)>,
}

impl Retries {
    fn park(&mut self, handle: String, id: calls::CallId) {
        self.waiting.insert(handle, id);
    }

    /// A parked call ended without its client: its handle is forgotten.
    pub(super) fn forget(&mut self, handle: &str) {
        self.waiting.remove(handle);
    }

    fn hold(&mut self, handle: String, until: Instant, held: Held) {
        self.waiting.remove(&handle);
        self.held_order.push_back((until, handle.clone()));
        self.held.insert(handle, held);
    }

    /// The held answers whose time ran out before `now`.
    fn expire(&mut self, now: Instant) -> Vec<Held> {
        let mut gone = Vec::new();
        while let Some((until, _)) = self.held_order.front() {
            if *until > now {
                break;
            }
            let (_, handle) = self.held_order.pop_front().expect("looked at just above");
            gone.extend(self.held.remove(&handle));
        }
        gone
    }

    pub(super) fn len(&self) -> usize {
        self.waiting.len() + self.held.len()
    }
}

/// A retry's fields beside what the original request had.
#[derive(Deserialize)]
struct RetryParams {
    #[serde(rename = "inputResponses", default)]
    input_responses: Option<Map<String, Value>>,
    #[serde(rename = "_meta", default)]
    meta: Option<Map<String, Value>>,
}

impl Gateway {
    /// A sled's request for the client of a stateless call: given to the client in an
    /// `input_required` answer (now, or at its next retry), or the call fails with -32021
    /// when the request did not declare the capability.
    pub(super) fn ask_stateless_client(
        &mut self,
        now: Instant,
        (uplink, call_id): (UplinkId, calls::CallId),
        sled_id: &RawValue,
        method: &str,
        capability: &'static str,
        params: Map<String, Value>,
    ) {
        let Some(call) = self.calls.call_mut(call_id) else {
            return;
        };
        let Some(rounds) = call.mrtr.as_mut() else {
            let why = format!("Method not found: {method} (a request of protocol 2026-07-28 can take a sled's requests only in tools/call, prompts/get and resources/read)");
            self.outputs.push_back(Output::UplinkSend {
                uplink,
                text: SledRequestRefused::NotRelayable { why }.response(sled_id.get()),
            });
            return;
        };
        if !rounds.declared.has(capability) {
            let project = call.project.clone();
            self.outputs.push_back(Output::UplinkSend {
                uplink,
                text: SledRequestRefused::MissingCapability { capability }.response(sled_id.get()),
            });
            let sled = self.sled_of(&project);
            let e = RpcError::MissingClientCapability {
                project,
                sled,
                capability,
            };
            return self.end_call_refused(now, call_id, e);
        }
        // As many as a call of the handshake era may have waiting (finding 16).
        if rounds.asks.len() >= calls::MAX_ASKS_PER_CALL {
            let why = format!(
                "{method}: the call already has {} requests waiting for its client; answer or drop one first",
                calls::MAX_ASKS_PER_CALL
            );
            self.outputs.push_back(Output::UplinkSend {
                uplink,
                text: SledRequestRefused::NotRelayable { why }.response(sled_id.get()),
            });
            return;
        }
        self.next_server_request += 1;
        rounds.asks.push(Ask {
            key: format!("{capability}-{}", self.next_server_request),
            sled_id: sled_id.get().into(),
            request: format!(
                r#"{{"method":{},"params":{}}}"#,
                Value::String(method.to_owned()),
                Value::Object(params)
            ),
            asked: false,
        });
        if rounds.parked.is_none() {
            self.answer_input_required(now, call_id);
        }
    }

    /// Ends a pending stateless call with a gateway error, cancelling it at the sled.
    fn end_call_refused(&mut self, now: Instant, id: calls::CallId, e: RpcError) {
        let Some((uplink, Pending::Call(call))) = self.calls.take(id) else {
            return;
        };
        self.send_cancelled(
            uplink,
            id,
            "the client of this call cannot answer the sled's request",
        );
        let body = e.response(Some(call.client_id.as_str()));
        let took = now.saturating_duration_since(call.sent_at);
        self.finish_or_hold(now, call, body, Outcome::Error, took);
    }

    /// Answers the attached request of a stateless call with `input_required`, carrying the
    /// sled's requests not yet given to the client, and parks the call.
    fn answer_input_required(&mut self, now: Instant, call_id: calls::CallId) {
        use rand_chacha::rand_core::RngCore;
        let mut bytes = [0u8; 16];
        self.rng.fill_bytes(&mut bytes);
        let mut handle = format!("rs-{}", hex::encode(bytes));
        // In a cluster, the handle names the replica that parks the call, so that a retry
        // landing on another replica is relayed here.
        if let Some(replica) = self.replica_name() {
            handle.push('.');
            handle.push_str(replica);
        }
        let Some(call) = self.calls.call_mut(call_id) else {
            return;
        };
        let Some(rounds) = call.mrtr.as_mut() else {
            return;
        };
        let mut requests = String::from("{");
        for ask in rounds.asks.iter_mut().filter(|a| !a.asked) {
            ask.asked = true;
            if requests.len() > 1 {
                requests.push(',');
            }
            requests.push_str(&Value::String(ask.key.clone()).to_string());
            requests.push(':');
            requests.push_str(&ask.request);
        }
        requests.push('}');
        rounds.parked = Some(handle.clone());
        let deadline = now + rounds.timeout;
        let (token, streamed) = (call.token, call.streamed);
        let result = format!(
            r#"{{"resultType":"input_required","inputRequests":{requests},"requestState":"{handle}"}}"#
        );
        let body = jsonrpc::ok_response(call.client_id.as_str(), &result);
        self.calls.set_deadline(call_id, deadline);
        self.calls.detach(call_id);
        self.retries.park(handle, call_id);
        self.counters.input_required += 1;
        if !streamed {
            return self.reply(token, 200, Vec::new(), Some(body));
        }
        if self.post_streams.remove(&token) {
            let id = Some(self.next_event_id());
            self.outputs.push_back(Output::StreamEvent {
                token,
                id,
                data: body,
            });
            self.outputs.push_back(Output::StreamClose { token });
        }
    }

    /// A call ends: answered to its attached request, or held for its client's retry when it
    /// is parked.
    pub(super) fn finish_or_hold(
        &mut self,
        now: Instant,
        call: Call,
        body: String,
        outcome: Outcome,
        took: Duration,
    ) {
        let parked = call.mrtr.as_ref().and_then(|m| m.parked.clone());
        let Some(handle) = parked else {
            return self.finish_call(now, call, body, outcome, Some(took));
        };
        self.expire_held(now);
        let until = call.deadline;
        self.retries.hold(
            handle,
            until,
            Held {
                call,
                body,
                outcome,
                took,
            },
        );
    }

    /// Books the held answers no retry came for.
    fn expire_held(&mut self, now: Instant) {
        for held in self.retries.expire(now) {
            self.call_ended(now, &held.call, held.outcome, Some(held.took));
        }
    }

    /// The replica of the cluster that parked the call a `requestState` names, when it is
    /// another one: the retry is relayed there (unless `req` was relayed here already).
    pub(super) fn parked_elsewhere(&self, req: &Req<'_>, handle: &str) -> Option<String> {
        let here = self.replica_name()?;
        let (_, replica) = handle.strip_prefix("rs-")?.split_once('.')?;
        let name_ok = !replica.is_empty()
            && replica
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        (name_ok && replica != here && !req.relayed).then(|| replica.to_owned())
    }

    /// The project a retry is for, as the original request named it (else the default), for
    /// the relay's bookkeeping; empty when it names none.
    fn retry_project(&self, req: &Req<'_>, method: &str, params: Option<&RawValue>) -> String {
        let v: Value = params
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or(Value::Null);
        let in_meta = v.pointer(&format!(
            "/_meta/{}",
            proxy::PROJECT_META.replace('/', "~1")
        ));
        let in_arguments = v.pointer("/arguments/project");
        let named = match method {
            "tools/call" => in_arguments,
            "prompts/get" => in_meta.or(in_arguments),
            _ => in_meta,
        };
        named
            .and_then(Value::as_str)
            .or_else(|| self.default_of(req))
            .unwrap_or_default()
            .to_owned()
    }

    /// A parked call's right, asked again of its retry's principal under the rules in force
    /// (security review finding 13): `read` for a prompt, a resource, or a tool its
    /// project's `read_only_tools` covers; `write` for any other tool.
    fn require_on_resume(&self, req: &Req<'_>, call: &Call, method: &str) -> Result<(), RpcError> {
        let name = call.mrtr.as_ref().and_then(|m| m.name.as_deref());
        let need = if method == "tools/call" {
            self.right_for_tool(&call.project, name.unwrap_or_default())
        } else {
            Right::Read
        };
        self.require(
            req.principal,
            &call.project,
            need,
            format_args!("{method} {}", name.unwrap_or_default()),
        )
    }

    /// A stateless retry (`requestState` present): attaches to the parked call it names, gives
    /// the sled the client's responses, and answers later like the original request would.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn resume(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        method: &str,
        checked: modern::Checked,
        params: Option<&RawValue>,
        stream_ok: bool,
    ) -> Result<Served, RpcError> {
        let Req { now, token, .. } = *req;
        let unknown = || RpcError::UnknownRequestState {
            method: method.to_owned(),
        };
        let handle = checked.request_state.ok_or_else(unknown)?;
        if let Some(replica) = self.parked_elsewhere(req, &handle) {
            let project = self.retry_project(req, method, params);
            return Ok(Served::Away(Away::Relay { project, replica }));
        }
        self.expire_held(now);
        let retry: RetryParams = jsonrpc::params_of(method, params)?;
        let meta = retry.meta.unwrap_or_default();
        // The handle is the call's only for its own caller (finding 13): anyone else is
        // answered exactly as for a handle that names nothing, and touches nothing.
        let owner = req.principal.session_owner(&self.registry);
        let matches = |call: &Call| {
            call.mrtr
                .as_ref()
                .is_some_and(|m| m.method == method && m.name == checked.name && m.owner == owner)
        };
        if let Some(held) = self.retries.held.get(&handle) {
            if !matches(&held.call) {
                return Err(unknown());
            }
            let mut held = self.retries.held.remove(&handle).expect("looked up");
            // The right is asked again of the rules in force: a reload may have taken it.
            if let Err(e) = self.require_on_resume(req, &held.call, method) {
                self.call_ended(now, &held.call, held.outcome, Some(held.took));
                return Err(e);
            }
            let mut body: Value =
                serde_json::from_str(&held.body).expect("the gateway's own response is JSON");
            body["id"] = serde_json::from_str(id.as_str()).expect("ids are JSON");
            held.call.token = token;
            held.call.client_id = id.clone();
            held.call.stream_ok = stream_ok;
            held.call.streamed = false;
            if let Some(m) = held.call.mrtr.as_mut() {
                m.parked = None;
            }
            self.finish_call(
                now,
                held.call,
                body.to_string(),
                held.outcome,
                Some(held.took),
            );
            return Ok(Served::Later);
        }
        let call_id = *self.retries.waiting.get(&handle).ok_or_else(unknown)?;
        let Some(call) = self.calls.call(call_id) else {
            self.retries.forget(&handle);
            return Err(unknown());
        };
        if !matches(call) {
            return Err(unknown());
        }
        self.retries.forget(&handle);
        let refused = self.require_on_resume(req, call, method);
        if let Err(e) = refused {
            // Its caller may no longer do this: the call ends here, cancelled at the sled.
            if let Some((uplink, Pending::Call(call))) = self.calls.take(call_id) {
                self.send_cancelled(uplink, call_id, "the caller's right was revoked");
                let took = now.saturating_duration_since(call.sent_at);
                self.call_ended(now, &call, Outcome::Cancelled, Some(took));
            }
            return Err(e);
        }
        let Some(call) = self.calls.call_mut(call_id) else {
            return Err(unknown());
        };
        let rounds = call.mrtr.as_mut().expect("matched above");
        rounds.parked = None;
        rounds.declared = Declared::from_meta(&meta);
        let responses = retry.input_responses.unwrap_or_default();
        let mut back = Vec::new();
        rounds.asks.retain_mut(|ask| {
            if !ask.asked {
                return true;
            }
            match responses.get(&ask.key) {
                Some(answer) => {
                    back.push(jsonrpc::ok_response(&ask.sled_id, &answer.to_string()));
                    false
                }
                // Not answered: asked again.
                None => {
                    ask.asked = false;
                    true
                }
            }
        });
        let ask_again = !rounds.asks.is_empty();
        // The retry's own progress token names the call's progress from now on.
        if let (Some((_, client)), Some(t @ (Value::String(_) | Value::Number(_)))) =
            (call.progress.as_mut(), meta.get("progressToken"))
        {
            *client = serde_json::value::to_raw_value(t).expect("a JSON value serialises");
        }
        let deadline = now + rounds.timeout;
        call.client_id = id.clone();
        call.stream_ok = stream_ok;
        call.streamed = false;
        self.calls.set_deadline(call_id, deadline);
        self.calls.attach(call_id, token);
        // The answers go to the uplink serving the call now.
        if let Some(uplink) = self.calls.uplink_of(call_id) {
            for text in back {
                self.outputs.push_back(Output::UplinkSend { uplink, text });
            }
        }
        if ask_again {
            self.answer_input_required(now, call_id);
        }
        Ok(Served::Later)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_capabilities_come_from_the_requests_meta() {
        let meta: Map<String, Value> = serde_json::from_value(json!({
            META_CLIENT_CAPABILITIES: { "sampling": {}, "roots": { "listChanged": true } }
        }))
        .unwrap();
        let d = Declared::from_meta(&meta);
        assert!(d.has("sampling") && d.has("roots"));
        assert!(!d.has("elicitation"));
        assert!(!Declared::from_meta(&Map::new()).has("sampling"));
        assert!(!d.has("tools"));
    }
}
