//! The board: per-project keys with revisions from one never-reused counter.

use std::time::{Duration, Instant};

use super::persist::Which;
use super::{
    check_name, deadline, grant_ttl, next, retime, BoardEntry, BoardSet, Coord, CoordError,
    CoordLimit, StoredEntry, Timer,
};

impl Coord {
    /// Sets `key` to `value`. `if_revision`: `Some(0)` only if absent, `Some(r)` only if at
    /// revision `r`. `ttl: None`: it lives until deleted.
    #[allow(clippy::too_many_arguments)]
    pub fn board_set(
        &mut self,
        now: Instant,
        project: &str,
        agent: &str,
        key: &str,
        value: String,
        if_revision: Option<u64>,
        ttl: Option<Duration>,
    ) -> Result<BoardSet, CoordError> {
        self.handle_timeout(now);
        let l = &self.limits;
        check_name("board key", key, l.max_name_len)?;
        if value.len() > l.max_board_value_bytes {
            return Err(CoordError::TooLarge {
                what: "board value",
                max_bytes: l.max_board_value_bytes,
                got: value.len(),
            });
        }
        let (expires_at, ttl_clamped) = match ttl {
            None => (None, None),
            Some(t) => {
                let (t, clamped) = grant_ttl("board", Some(t), t, l.board_ttl_max)?;
                (Some(deadline("board", now, t)?), clamped)
            }
        };
        let max_keys = l.max_board_keys;
        self.touch(now, project, agent, None)?;
        let p = self
            .projects
            .get_mut(project)
            .expect("touch made the project");
        let current = p.board.get(key).map(|e| e.revision);
        if let Err(e) = cas(key, current, if_revision) {
            self.stats.board_cas_failures += 1;
            return Err(e);
        }
        if current.is_none() && p.board.len() >= max_keys {
            return Err(self.limit(CoordLimit::BoardKeys, max_keys));
        }
        let revision = next(p.board_rev, "board revision")?;
        p.board_rev = revision;
        let entry = StoredEntry {
            value,
            revision,
            set_by: agent.to_owned(),
            expires_at,
        };
        let old = p
            .board
            .insert(key.to_owned(), entry)
            .and_then(|e| e.expires_at);
        let timer = Timer::Board {
            project: project.to_owned(),
            key: key.to_owned(),
        };
        retime(&mut self.timers, old, expires_at, timer);
        self.entry_changed(project, Which::Board(key.to_owned()));
        self.stats.board_sets += 1;
        Ok(BoardSet {
            revision,
            ttl_clamped,
        })
    }

    pub fn board_get(&mut self, now: Instant, project: &str, key: &str) -> Option<BoardEntry> {
        self.handle_timeout(now);
        let (key, e) = self.projects.get(project)?.board.get_key_value(key)?;
        live(now, key, e)
    }

    /// The live keys, by key, starting with `prefix` when given.
    pub fn board_list(
        &mut self,
        now: Instant,
        project: &str,
        prefix: Option<&str>,
    ) -> Vec<BoardEntry> {
        self.handle_timeout(now);
        let Some(p) = self.projects.get(project) else {
            return Vec::new();
        };
        let prefix = prefix.unwrap_or("");
        p.board
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter_map(|(k, e)| live(now, k, e))
            .collect()
    }

    /// Deletes `key` (`if_revision` as for `board_set`); returns the revision deleted.
    pub fn board_delete(
        &mut self,
        now: Instant,
        project: &str,
        agent: &str,
        key: &str,
        if_revision: Option<u64>,
    ) -> Result<u64, CoordError> {
        self.handle_timeout(now);
        check_name("board key", key, self.limits.max_name_len)?;
        self.touch(now, project, agent, None)?;
        let p = self
            .projects
            .get_mut(project)
            .expect("touch made the project");
        let Some(current) = p.board.get(key).map(|e| e.revision) else {
            return Err(CoordError::NoKey {
                key: key.to_owned(),
            });
        };
        if let Err(e) = cas(key, Some(current), if_revision) {
            self.stats.board_cas_failures += 1;
            return Err(e);
        }
        if let Some(e) = p.board.remove(key) {
            let timer = Timer::Board {
                project: project.to_owned(),
                key: key.to_owned(),
            };
            retime(&mut self.timers, e.expires_at, None, timer);
        }
        self.entry_changed(project, Which::Board(key.to_owned()));
        self.stats.board_deletes += 1;
        Ok(current)
    }
}

/// Checks `if_revision` against the key's current revision (`None`: absent).
fn cas(key: &str, current: Option<u64>, if_revision: Option<u64>) -> Result<(), CoordError> {
    match (if_revision, current) {
        (None, _) | (Some(0), None) => Ok(()),
        (Some(want), Some(cur)) if want == cur => Ok(()),
        _ => Err(CoordError::RevisionMismatch {
            key: key.to_owned(),
            current,
        }),
    }
}

fn live(now: Instant, key: &str, e: &StoredEntry) -> Option<BoardEntry> {
    if e.expires_at.is_some_and(|t| t <= now) {
        return None;
    }
    Some(BoardEntry {
        key: key.to_owned(),
        value: e.value.clone(),
        revision: e.revision,
        set_by: e.set_by.clone(),
        expires_in: e.expires_at.map(|t| t.saturating_duration_since(now)),
    })
}
