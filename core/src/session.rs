//! The MCP session table: each session's own default project, and nothing shared.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Instant;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::io::HttpToken;

/// One MCP session, created by `initialize`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Session {
    /// Where this session's project tool calls go when they name no project.
    pub(crate) default_project: Option<String>,
    pub(crate) protocol_version: String,
    pub(crate) last_seen: Instant,
    /// The least severe log level relayed to this session (`logging/setLevel`); all when unset.
    pub(crate) log_level: Option<u8>,
    /// The capabilities the client declared in `initialize`.
    pub(crate) client_capabilities: serde_json::Value,
    /// The open GET stream, where server-to-client messages go.
    pub(crate) stream: Option<HttpToken>,
    /// The latest events sent for the GET stream, oldest first, for `Last-Event-ID`.
    pub(crate) replay: VecDeque<(u64, String)>,
    /// Who created it (`Identity::session_owner`); only they may use it. `None` without
    /// client authentication.
    pub(crate) owner: Option<String>,
    /// Its owner as the rules see it, from its latest request here: what is delivered to the
    /// session about a project (list changes, resource updates, coordination notices) is
    /// asked of it again after a reload (security review finding 14).
    pub(crate) holder: crate::auth::Holder,
}

#[derive(Debug)]
pub(crate) struct Sessions {
    /// By id. A `BTreeMap`, so that walking the sessions is in a deterministic order.
    map: BTreeMap<String, Session>,
    ids: ChaCha20Rng,
    /// How many sessions each owner holds (per-identity quotas, without a walk).
    owners: HashMap<Option<String>, usize>,
}

impl Sessions {
    pub(crate) fn new(seed: [u8; 32]) -> Sessions {
        Sessions {
            map: BTreeMap::new(),
            ids: ChaCha20Rng::from_seed(seed),
            owners: HashMap::new(),
        }
    }

    fn count_in(&mut self, owner: &Option<String>) {
        *self.owners.entry(owner.clone()).or_default() += 1;
    }

    fn count_out(&mut self, owner: &Option<String>) {
        if let Some(n) = self.owners.get_mut(owner) {
            *n -= 1;
            if *n == 0 {
                self.owners.remove(owner);
            }
        }
    }

    /// How many sessions `owner` holds.
    pub(crate) fn owned_by(&self, owner: &Option<String>) -> usize {
        self.owners.get(owner).copied().unwrap_or(0)
    }

    /// Gives session `id` to `owner` (at its creation, or as another replica recorded it).
    pub(crate) fn set_owner(&mut self, id: &str, owner: Option<String>) {
        let Some(s) = self.map.get_mut(id) else {
            return;
        };
        let old = std::mem::replace(&mut s.owner, owner.clone());
        self.count_out(&old);
        self.count_in(&owner);
    }

    /// Starts a session and returns its id: 128 bits from the seeded generator, as hex.
    pub(crate) fn create(
        &mut self,
        default_project: Option<String>,
        protocol_version: String,
        client_capabilities: serde_json::Value,
        now: Instant,
    ) -> String {
        let id = loop {
            let mut bytes = [0u8; 16];
            self.ids.fill_bytes(&mut bytes);
            let id = hex::encode(bytes);
            if !self.map.contains_key(&id) {
                break id;
            }
        };
        self.map.insert(
            id.clone(),
            Session {
                default_project,
                protocol_version,
                client_capabilities,
                log_level: None,
                last_seen: now,
                stream: None,
                replay: VecDeque::new(),
                owner: None,
                holder: crate::auth::Holder::Anonymous,
            },
        );
        self.count_in(&None);
        id
    }

    /// Takes in a session another replica of the cluster created, as the engine keeps it.
    pub(crate) fn restore(
        &mut self,
        id: String,
        record: crate::cluster::SessionRecord,
        now: Instant,
    ) {
        self.count_in(&record.owner);
        if let Some(old) = self.map.remove(&id) {
            self.count_out(&old.owner);
        }
        self.map.insert(
            id,
            Session {
                default_project: record.default_project,
                protocol_version: record.protocol_version,
                client_capabilities: record.client_capabilities,
                log_level: record.log_level,
                last_seen: now,
                stream: None,
                replay: VecDeque::new(),
                holder: crate::auth::Holder::of_owner(record.owner.as_deref()),
                owner: record.owner,
            },
        );
    }

    pub(crate) fn get(&self, id: &str) -> Option<&Session> {
        self.map.get(id)
    }

    pub(crate) fn get_mut(&mut self, id: &str) -> Option<&mut Session> {
        self.map.get_mut(id)
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<Session> {
        let s = self.map.remove(id)?;
        self.count_out(&s.owner);
        Some(s)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&String, &Session)> {
        self.map.iter()
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (&String, &mut Session)> {
        self.map.iter_mut()
    }

    /// Removes the sessions idle since before `cutoff` that have no open stream.
    pub(crate) fn expire(&mut self, cutoff: Instant) -> Vec<String> {
        let gone: Vec<String> = self
            .map
            .iter()
            .filter(|(_, s)| s.stream.is_none() && s.last_seen < cutoff)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &gone {
            self.remove(id);
        }
        gone
    }

    /// Ends the least recently used session that has no open stream and that `may_end`
    /// allows; returns its id, or `None` when there is none. A walk over the table, done only
    /// at a limit.
    pub(crate) fn evict_lru(&mut self, may_end: impl Fn(&str, &Session) -> bool) -> Option<String> {
        let id = self
            .map
            .iter()
            .filter(|(id, s)| s.stream.is_none() && may_end(id, s))
            .min_by_key(|(_, s)| s.last_seen)
            .map(|(id, _)| id.clone())?;
        self.remove(&id);
        Some(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}
