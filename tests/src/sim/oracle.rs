//! The oracle: what must hold of every run, whatever its faults.
//!
//! - Per response (`sled_sim::script::check_session`): it answers the request it was sent for
//!   (id and echoed nonce), it was served by a project the session's own history allows, errors
//!   have the documented shapes, stories read back as created, and the liveness probe after the
//!   final heal succeeds.
//! - No request goes unanswered: a request with no JSON-RPC answer (client deadline, lost
//!   connection) is only excused while its client host's link to the gateway is faulted (up to
//!   one client deadline after the fault ends, for a connection that stalled on a lost segment).
//! - A story created by a success response exists in exactly that project, once; one whose
//!   outcome is unknown exists at most once, in a project the call may have gone to; one the
//!   gateway never forwarded (`sled_not_connected`) does not exist; and no story exists that no
//!   request asked for.

use std::collections::BTreeMap;
use std::time::Duration;

use sled_sim::script::{self, SessionHistory};

use super::scenario::{FaultKind, Scenario, CLIENT_TIMEOUT};

/// Every violation of the run, as text.
pub fn judge(
    s: &Scenario,
    histories: &[SessionHistory],
    stories: &BTreeMap<String, Vec<(String, String)>>,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut claims = Vec::new();
    for h in histories {
        let report = script::check_session(h, &s.projects);
        out.extend(report.violations.iter().map(ToString::to_string));
        let client = h.index % s.client_hosts;
        for n in report.failed {
            let x = &h.exchanges[n];
            if !client_faulted(s, client, x.sent, x.received) {
                out.push(format!(
                    "session {} exchange {n}: no answer, and its link to the gateway was never faulted: {:?} sent {:?}, ended {:?}: {:?}",
                    h.index, x.op, x.sent, x.received, x.outcome
                ));
            }
        }
        for (at, why) in &h.init_failures {
            if !client_faulted(s, client, at.saturating_sub(CLIENT_TIMEOUT), *at) {
                out.push(format!(
                    "session {}: initialize failed at {at:?} without a fault: {why}",
                    h.index
                ));
            }
        }
        claims.extend(report.stories);
    }
    let mut claimed = std::collections::BTreeSet::new();
    for c in &claims {
        claimed.insert(c.name.clone());
        let found: &[(String, String)] = stories.get(&c.name).map_or(&[], Vec::as_slice);
        let at = format!("session {} exchange {}", c.session, c.exchange);
        match &c.created {
            Some((project, id)) => {
                if found != [(project.clone(), id.clone())] {
                    out.push(format!(
                        "{at}: created {id} in {project}, but the sleds hold {found:?}"
                    ));
                }
            }
            None if c.never_sent => {
                if !found.is_empty() {
                    out.push(format!(
                        "{at}: the gateway said the call never reached a sled, but the sleds hold {found:?}"
                    ));
                }
            }
            None => {
                if found.len() > 1 || found.iter().any(|(p, _)| !c.candidates.contains(p)) {
                    out.push(format!(
                        "{at}: a create with an unknown outcome may exist once in {:?}; the sleds hold {found:?}",
                        c.candidates
                    ));
                }
            }
        }
    }
    for (name, found) in stories {
        if !claimed.contains(name) {
            out.push(format!(
                "story {name:?} exists ({found:?}) but no request created it"
            ));
        }
    }
    out
}

/// Whether client host `client`'s link to the gateway was faulted at some point of
/// `[from, to]`, counting a client deadline after each fault ends.
fn client_faulted(s: &Scenario, client: usize, from: Duration, to: Duration) -> bool {
    s.faults.iter().any(|f| match f.kind {
        FaultKind::PartitionClient { client: c, .. } if c == client => {
            from <= f.until + CLIENT_TIMEOUT && to >= f.at
        }
        _ => false,
    })
}
