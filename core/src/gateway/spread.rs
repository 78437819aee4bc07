//! A `wait` across replicas (issue 15). A project's coordination state lives with the
//! replica holding its sled, so a `wait` in projects held by several replicas is waited in at
//! each of them: the client's wait is parked here as usual (with a waiter of its own for the
//! projects held here, or whose sled is nowhere), and each other holder gets a part, a `wait`
//! for its projects relayed on this replica's own account (`crate::gather`), as the same
//! agent (the session, or the handle) and with the same timeout.
//!
//! Each part, like each waiter, looks and registers in one step where the state is, so
//! nothing that happens before the deadline is missed. The first to wake answers the
//! client, and the others are withdrawn (a waiter here is cancelled, parts are aborted at
//! their replica). When every part ended without waking and there is no waiter here, the
//! client gets the first part's error (an agent present nowhere, say) or a timeout. Without
//! `projects`, a wait covers the projects the agent is present in wherever they are: each
//! replica holding a project the caller may see is asked for its own.

use std::collections::BTreeMap;

use super::coordination::WAIT;
use super::*;
use crate::coord::WaitToken;
use crate::gather::{Purpose, WaitGather};

/// How long past its own timeout a part may take to answer before it is given up.
const PART_MARGIN: Duration = Duration::from_secs(5);

impl Gateway {
    /// Where a wait's projects are waited in: the ones here (their sled is here or nowhere),
    /// and for each other replica holding some, those (`None`: the projects the agent is
    /// present in there, for a wait that names none). Outside a cluster, or for a wait
    /// relayed here, everything is here.
    pub(super) fn wait_places(
        &self,
        req: &Req<'_>,
        projects: Vec<String>,
        named: bool,
    ) -> (Vec<String>, BTreeMap<String, Option<Vec<String>>>) {
        let mut elsewhere: BTreeMap<String, Option<Vec<String>>> = BTreeMap::new();
        if !self.clustered() || req.relayed {
            return (projects, elsewhere);
        }
        #[cfg(feature = "planted-bugs")]
        if self.config.planted == Some(PlantedBug::WaitHereOnly) {
            return (projects, elsewhere);
        }
        if !named {
            for p in self.registry.projects() {
                if !self.sees(req.principal, &p.name) || self.is_live(&p.name) {
                    continue;
                }
                if let Some(replica) = self.relay_target(&p.name) {
                    elsewhere.insert(replica, None);
                }
            }
            let here = projects
                .into_iter()
                .filter(|p| self.is_live(p) || self.relay_target(p).is_none())
                .collect();
            return (here, elsewhere);
        }
        let mut here = Vec::new();
        for p in projects {
            match self.relay_target(&p).filter(|_| !self.is_live(&p)) {
                Some(replica) => elsewhere
                    .entry(replica)
                    .or_insert_with(|| Some(Vec::new()))
                    .get_or_insert_with(Vec::new)
                    .push(p),
                None => here.push(p),
            }
        }
        (here, elsewhere)
    }

    /// Starts the parts of the client's wait `wait`, parked here (`local`: with a waiter of
    /// its own), at the replicas in `elsewhere`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn spread_wait(
        &mut self,
        req: &Req<'_>,
        wait: WaitToken,
        local: bool,
        elsewhere: BTreeMap<String, Option<Vec<String>>>,
        handle: Option<&str>,
        timeout: Duration,
    ) {
        let session = req.session().map(str::to_owned);
        let mut parts = 0;
        for (replica, projects) in elsewhere {
            let mut arguments = json!({ "timeout_s": timeout.as_secs().max(1) });
            if let Some(ps) = projects {
                arguments["projects"] = json!(ps);
            }
            if let Some(h) = handle {
                arguments["agent"] = json!(h);
            }
            let started = self.relay_part(
                req,
                replica,
                Purpose::Wait { wait: wait.0 },
                timeout + PART_MARGIN,
                WAIT,
                arguments,
                session.as_deref(),
            );
            parts += usize::from(started.is_some());
        }
        self.gathers.waits.insert(
            wait.0,
            WaitGather {
                parts,
                local,
                error: None,
            },
        );
    }

    /// The client's wait `wait` is over here (answered, withdrawn, or its session ended):
    /// its parts still open, if it was spread, are aborted at their replicas.
    pub(super) fn wait_ended(&mut self, wait: WaitToken) {
        if self.gathers.waits.remove(&wait.0).is_none() {
            return;
        }
        let open = self
            .gathers
            .open_parts(|p| matches!(p, Purpose::Wait { wait: w } if *w == wait.0));
        for token in open {
            self.abort_part(token);
        }
    }
}
