//! The MCP session table: each session's own default project, and nothing shared.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
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
}

#[derive(Debug)]
pub(crate) struct Sessions {
    /// By id. A `BTreeMap`, so that walking the sessions is in a deterministic order.
    map: BTreeMap<String, Session>,
    ids: ChaCha20Rng,
}

impl Sessions {
    pub(crate) fn new(seed: [u8; 32]) -> Sessions {
        Sessions {
            map: BTreeMap::new(),
            ids: ChaCha20Rng::from_seed(seed),
        }
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
            let id = bytes.iter().fold(String::with_capacity(32), |mut s, b| {
                let _ = write!(s, "{b:02x}");
                s
            });
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
            },
        );
        id
    }

    /// Takes in a session another replica of the cluster created, as the engine keeps it.
    pub(crate) fn restore(
        &mut self,
        id: String,
        record: crate::cluster::SessionRecord,
        now: Instant,
    ) {
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
        self.map.remove(id)
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
            self.map.remove(id);
        }
        gone
    }

    /// Ends the least recently used session that has no open stream and is not `busy`;
    /// returns its id, or `None` when every session has a stream or is busy. A walk over the
    /// table, done only when it is full.
    pub(crate) fn evict_lru(&mut self, busy: impl Fn(&str) -> bool) -> Option<String> {
        let id = self
            .map
            .iter()
            .filter(|(id, s)| s.stream.is_none() && !busy(id))
            .min_by_key(|(_, s)| s.last_seen)
            .map(|(id, _)| id.clone())?;
        self.map.remove(&id);
        Some(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}
