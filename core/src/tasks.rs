//! Tasks (issue 27): the ids a client sees for tasks its projects' sleds run, and the records
//! that outlive the call that made one (where-the-issues-meet §4, §5).
//!
//! # The id a client sees
//! A sled's task id means something only on that sled, and two sleds may well give out the
//! same one. So the gateway never hands a sled's id to a client: it hands out
//! `mt1.<key id>.<right>.<project>.<sled's id>.<tag>` (the project and the sled's id in
//! base64url), where the tag is HMAC-SHA-256, cut to 128 bits, under the task-id subkey of the
//! gateway secret (`crate::keys`), over every field and over **who made the task**: the
//! identity its credentials proved ([`crate::Identity::session_owner`]) and its session, where
//! it has one. Hence:
//! - any replica routes it without a lookup (the project is in it, and the key is the
//!   cluster's);
//! - it is unguessable, and nobody without the key makes one;
//! - another identity's or another session's `tasks/*` with it finds nothing: the tag does not
//!   match for them, and the answer is exactly that of an unknown task;
//! - the right the creating call needed (`r` read, `w` write) is in it, so `tasks/*` asks the
//!   same right of the caller *now*: a reload that takes the project away ends access.
//!
//! The sled's own id is in it in clear: the caller who made the task may know it, and nobody
//! else ever sees the id.
//!
//! # Records
//! `tasks/list` shows a caller only its own tasks, status notifications go only to the
//! creator's streams, and progress reaches the creator after the call that made the task has
//! been answered. Each needs a record: per (project, sled's id), who made it, when, until when
//! it lives (its TTL, bounded by [`MAX_TTL`]), and the progress token of its creating call.
//! A record ends at its expiry; the progress binding ends when the task is terminal.
//!
//! Records are kept with the coordination state (`crate::coord::persist`'s pipeline: a single
//! gateway's store, a cluster's engine for the projects a replica holds): each change marks
//! its record, [`Tasks::take_changes`] hands out a put (`<project in hex>.t.<sled id in hex>`,
//! the creator, the right, the status and the time left) or a delete, and [`Tasks::restore`]
//! and [`Tasks::replace_project`] take them back (at start; when a replica comes to hold a
//! project), each with its age, so a restart neither shortens nor lengthens a TTL. Only the
//! progress binding is not kept: it names a call of the process that made the task.
//!
//! # Invariants
//! - A record is found by its (project, sled's id) only: two projects' tasks with one sled id
//!   are two records.
//! - [`Tasks::mine`] names only records whose creator is exactly the asker (identity and
//!   session).
//! - The progress index names only records that exist.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The project a task id names when the gateway runs the task itself
/// (`aggregate_pipeline_status`): no registered project can have this name.
pub const GATEWAY_PROJECT: &str = "@gateway";

/// The 2026-07-28 extension's identifier.
pub const EXTENSION: &str = "io.modelcontextprotocol/tasks";

/// The `_meta` key naming the task a message belongs to (2025-11-25).
pub const RELATED_TASK: &str = "io.modelcontextprotocol/related-task";

/// The longest a task's record is kept, whatever TTL the sled gives it (`null`, unlimited,
/// included). A client asks for less with `task.ttl`; the gateway asks the sled for no more.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// The TTL a task gets when the client asks for none (and the sled names none).
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);

/// The most live tasks one creator (an identity, else a session) may have; past it a
/// task-augmented call is refused at once.
pub const MAX_TASKS_PER_CREATOR: usize = 1_000;

/// A tool's `execution.taskSupport` (2025-11-25): absent is `forbidden`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskSupport {
    #[default]
    Forbidden,
    Optional,
    Required,
}

impl TaskSupport {
    pub fn of_tool(tool: &serde_json::Value) -> TaskSupport {
        match tool
            .pointer("/execution/taskSupport")
            .and_then(serde_json::Value::as_str)
        {
            Some("optional") => TaskSupport::Optional,
            Some("required") => TaskSupport::Required,
            _ => TaskSupport::Forbidden,
        }
    }
}

/// A task-id key: 32 bytes, derived from the gateway secret (or random, for a gateway that
/// keeps none), with the key id every id names. `Debug` shows the key id only.
#[derive(Clone, PartialEq, Eq)]
pub struct TaskKey {
    id: [u8; 4],
    key: [u8; 32],
}

impl std::fmt::Debug for TaskKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TaskKey({})", crate::agents::hex(&self.id))
    }
}

impl TaskKey {
    /// A key from its bytes and the key id of the secret it was derived from.
    pub fn new(id: [u8; 4], key: [u8; 32]) -> TaskKey {
        TaskKey { id, key }
    }

    fn tag(&self, sealed: &Sealed, creator: &Creator) -> [u8; 16] {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key");
        mac.update(b"mcp-gateway task id v1");
        for field in [
            sealed.right.as_bytes(),
            sealed.project.as_bytes(),
            sealed.sled_id.as_bytes(),
        ] {
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field);
        }
        for part in [creator.owner.as_deref(), creator.session.as_deref()] {
            match part {
                None => mac.update(&[0]),
                Some(p) => {
                    mac.update(&[1]);
                    mac.update(&(p.len() as u64).to_be_bytes());
                    mac.update(p.as_bytes());
                }
            }
        }
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; 16];
        tag.copy_from_slice(&full[..16]);
        tag
    }
}

/// Who made a task: the identity its credentials proved (none without client
/// authentication) and its session (none in the stateless era, or without one).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Creator {
    pub owner: Option<Box<str>>,
    pub session: Option<Box<str>>,
}

impl Creator {
    /// What its live tasks count under: the identity, else the session (else nobody: an
    /// anonymous caller without a session, counted together).
    fn budget_key(&self) -> Option<&str> {
        self.owner.as_deref().or(self.session.as_deref())
    }
}

/// What a task id says once its tag checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sealed {
    pub project: String,
    pub sled_id: String,
    /// The right its creating call needed: `"r"` (read) or `"w"` (write).
    pub right: &'static str,
}

/// How a task stands, as the gateway last saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Working,
    InputRequired,
    Completed,
    Failed,
    Cancelled,
}

impl Status {
    /// The status as the protocol writes it (the inverse of [`Status::parse`]).
    pub fn name(self) -> &'static str {
        match self {
            Status::Working => "working",
            Status::InputRequired => "input_required",
            Status::Completed => "completed",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        Some(match s {
            "working" => Status::Working,
            "input_required" => Status::InputRequired,
            "completed" => Status::Completed,
            "failed" => Status::Failed,
            "cancelled" => Status::Cancelled,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Completed | Status::Failed | Status::Cancelled)
    }
}

/// A task's record; see the module docs.
#[derive(Debug, Clone)]
pub struct Record {
    pub creator: Creator,
    pub right: &'static str,
    pub created: Instant,
    pub expires: Instant,
    pub status: Status,
    /// The gateway's progress token of the creating call, and the client's own, while the
    /// task is not terminal: the sled's progress under it still reaches the creator.
    pub progress: Option<(String, Box<serde_json::value::RawValue>)>,
    /// A task the gateway runs itself ([`GATEWAY_PROJECT`]): what a sled would keep of it.
    pub own: Option<Box<Own>>,
}

/// What the gateway keeps of a task it runs itself: its times (milliseconds since the Unix
/// epoch), its result once completed, and why it ended otherwise.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Own {
    pub created_ms: u64,
    pub updated_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Why a task could not be recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The creator has [`MAX_TASKS_PER_CREATOR`] live tasks.
    TooMany { max: usize },
}

/// The task machine; see the module docs.
#[derive(Debug)]
pub struct Tasks {
    current: TaskKey,
    /// During a roll of the gateway secret: ids made under the previous one still open.
    previous: Option<TaskKey>,
    records: BTreeMap<(String, String), Record>,
    expiries: BTreeSet<(Instant, String, String)>,
    by_progress: HashMap<String, (String, String)>,
    per_creator: HashMap<Option<Box<str>>, usize>,
    /// Records changed since the last [`Tasks::take_changes`] (a delete where none is left).
    dirty: BTreeSet<Key>,
}

type Key = (String, String);

/// A record as the store keeps it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Kept {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    session: Option<String>,
    right: String,
    status: String,
    expires_in_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    own: Option<Own>,
}

/// The store key of a task's record: `<project in hex>.t.<sled id in hex>`, under the
/// project's prefix (`crate::coord::project_prefix`), so it goes where the project's
/// coordination records go.
pub fn record_key(project: &str, sled_id: &str) -> String {
    format!("{}.t.{}", hex::encode(project), hex::encode(sled_id))
}

/// Whether a store key is a task record's.
pub fn is_record_key(key: &str) -> bool {
    key.split('.').nth(1) == Some("t")
}

/// The (project, sled id) a task record's store key names.
pub fn parse_record_key(key: &str) -> Option<(String, String)> {
    parse_key(key)
}

fn parse_key(key: &str) -> Option<Key> {
    let mut parts = key.split('.');
    let (Some(p), Some("t"), Some(s), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let p = String::from_utf8(hex::decode(p).ok()?).ok()?;
    let s = String::from_utf8(hex::decode(s).ok()?).ok()?;
    Some((p, s))
}

impl Tasks {
    pub fn new(current: TaskKey, previous: Option<TaskKey>) -> Tasks {
        Tasks {
            previous: previous.filter(|p| *p != current),
            current,
            records: BTreeMap::new(),
            expiries: BTreeSet::new(),
            by_progress: HashMap::new(),
            per_creator: HashMap::new(),
            dirty: BTreeSet::new(),
        }
    }

    /// Whether records changed since the last [`Tasks::take_changes`].
    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// The changed records, for the store: a put of each (with its time left at `now`), or a
    /// delete of one that is gone.
    pub fn take_changes(&mut self, now: Instant) -> Vec<crate::coord::RecordChange> {
        std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|(p, s)| {
                let value = self.records.get(&(p.clone(), s.clone())).map(|r| {
                    let kept = Kept {
                        owner: r.creator.owner.as_deref().map(str::to_owned),
                        session: r.creator.session.as_deref().map(str::to_owned),
                        right: r.right.to_owned(),
                        status: r.status.name().to_owned(),
                        expires_in_ms: u64::try_from(
                            r.expires.saturating_duration_since(now).as_millis(),
                        )
                        .unwrap_or(u64::MAX),
                        own: r.own.as_deref().cloned(),
                    };
                    serde_json::to_vec(&kept).expect("a record serialises")
                });
                crate::coord::RecordChange {
                    key: record_key(&p, &s),
                    value,
                }
            })
            .collect()
    }

    /// A write of `key` failed: it is written again with the next changes.
    pub fn write_failed(&mut self, key: &str) {
        if let Some(k) = parse_key(key) {
            self.dirty.insert(k);
        }
    }

    /// Takes back records kept by an earlier run (or another replica), each with its age;
    /// those past their expiry are left out (and deleted from the store). Returns how many
    /// were taken back.
    pub fn restore(&mut self, now: Instant, records: Vec<crate::coord::StoredRecord>) -> usize {
        let mut n = 0;
        for r in records {
            let Some((project, sled_id)) = parse_key(&r.key) else {
                continue;
            };
            let Ok(kept) = serde_json::from_slice::<Kept>(&r.value) else {
                continue;
            };
            let left = Duration::from_millis(kept.expires_in_ms).checked_sub(r.age);
            let (Some(left), Some(status)) =
                (left.filter(|l| !l.is_zero()), Status::parse(&kept.status))
            else {
                self.dirty.insert((project, sled_id));
                continue;
            };
            let right = if kept.right == "r" { "r" } else { "w" };
            // A task the gateway ran itself did not survive the process that ran it.
            let (status, own) = match kept.own {
                Some(mut own) if !status.is_terminal() => {
                    own.message = Some("the gateway restarted while the task ran".into());
                    self.dirty.insert((project.clone(), sled_id.clone()));
                    (Status::Failed, Some(Box::new(own)))
                }
                own => (status, own.map(Box::new)),
            };
            let record = Record {
                creator: Creator {
                    owner: kept.owner.map(String::into_boxed_str),
                    session: kept.session.map(String::into_boxed_str),
                },
                right,
                created: now,
                expires: now + left.min(MAX_TTL),
                status,
                progress: None,
                own,
            };
            self.insert(&project, &sled_id, record);
            n += 1;
        }
        n
    }

    /// `project`'s records replaced by those read from the store (a replica that came to hold
    /// the project reads what the last holder kept).
    pub fn replace_project(
        &mut self,
        now: Instant,
        project: &str,
        records: Vec<crate::coord::StoredRecord>,
    ) -> usize {
        let keys: Vec<Key> = self
            .records
            .keys()
            .filter(|(p, _)| p == project)
            .cloned()
            .collect();
        for k in keys {
            self.remove(&k);
            self.dirty.remove(&k);
        }
        self.restore(now, records)
    }

    /// The id a client sees for `sealed`, made by `creator`.
    pub fn seal(&self, sealed: &Sealed, creator: &Creator) -> String {
        let tag = self.current.tag(sealed, creator);
        format!(
            "mt1.{}.{}.{}.{}.{}",
            crate::agents::hex(&self.current.id),
            sealed.right,
            URL_SAFE_NO_PAD.encode(&sealed.project),
            URL_SAFE_NO_PAD.encode(&sealed.sled_id),
            URL_SAFE_NO_PAD.encode(tag),
        )
    }

    /// What `id` says, if it is one this gateway (or its cluster) made for `creator`; `None`
    /// for anything else, whatever the reason, so that an id of another caller's task is
    /// answered exactly as one that never existed.
    pub fn open(&self, id: &str, creator: &Creator) -> Option<Sealed> {
        if id.len() > 1024 {
            return None;
        }
        let mut parts = id.split('.');
        let (Some("mt1"), Some(kid), Some(right), Some(project), Some(sled), Some(tag), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let right = match right {
            "r" => "r",
            "w" => "w",
            _ => return None,
        };
        let kid = crate::agents::unhex(kid)?;
        let key = std::iter::once(&self.current)
            .chain(self.previous.as_ref())
            .find(|k| k.id[..] == kid[..])?;
        let project = String::from_utf8(URL_SAFE_NO_PAD.decode(project).ok()?).ok()?;
        let sled_id = String::from_utf8(URL_SAFE_NO_PAD.decode(sled).ok()?).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        let sealed = Sealed {
            project,
            sled_id,
            right,
        };
        let expected = key.tag(&sealed, creator);
        use subtle::ConstantTimeEq;
        (tag.len() == 16 && bool::from(expected.ct_eq(&tag[..]))).then_some(sealed)
    }

    /// Whether `creator` may start one more task.
    pub fn check_room(&self, creator: &Creator) -> Result<(), Refused> {
        let live = self
            .per_creator
            .get(&creator.budget_key().map(Box::from))
            .copied()
            .unwrap_or(0);
        if live >= MAX_TASKS_PER_CREATOR {
            return Err(Refused::TooMany {
                max: MAX_TASKS_PER_CREATOR,
            });
        }
        Ok(())
    }

    /// A sled made a task for `creator`'s call: records it until `expires`. A record already
    /// under the same (project, sled id) is replaced (a sled reused an id: the newer wins).
    pub fn handle_created(&mut self, project: &str, sled_id: &str, record: Record) {
        self.insert(project, sled_id, record);
        self.dirty.insert((project.to_owned(), sled_id.to_owned()));
    }

    fn insert(&mut self, project: &str, sled_id: &str, record: Record) {
        let key = (project.to_owned(), sled_id.to_owned());
        self.remove(&key);
        self.expiries
            .insert((record.expires, key.0.clone(), key.1.clone()));
        if let Some((token, _)) = &record.progress {
            self.by_progress.insert(token.clone(), key.clone());
        }
        *self
            .per_creator
            .entry(record.creator.budget_key().map(Box::from))
            .or_default() += 1;
        self.records.insert(key, record);
    }

    /// A task's status as the sled now reports it; the record, if the gateway keeps one. A
    /// terminal status ends the progress binding.
    pub fn handle_status(
        &mut self,
        project: &str,
        sled_id: &str,
        status: Status,
    ) -> Option<&Record> {
        let key = (project.to_owned(), sled_id.to_owned());
        let record = self.records.get_mut(&key)?;
        // A terminal status is final: a later report of another is the sled's mistake.
        if !record.status.is_terminal() && record.status != status {
            record.status = status;
            self.dirty.insert(key.clone());
        }
        if record.status.is_terminal() {
            if let Some((token, _)) = record.progress.take() {
                self.by_progress.remove(&token);
            }
        }
        self.records.get(&key)
    }

    /// A task the gateway runs itself ended: its status, result (a `CallToolResult`'s JSON),
    /// or why not.
    pub fn finish_own(
        &mut self,
        id: &str,
        status: Status,
        result: Option<String>,
        message: Option<String>,
        now_ms: u64,
    ) -> Option<&Record> {
        let key = (GATEWAY_PROJECT.to_owned(), id.to_owned());
        let record = self.records.get_mut(&key)?;
        if record.status.is_terminal() {
            return None;
        }
        record.status = status;
        if let Some(own) = record.own.as_mut() {
            own.updated_ms = now_ms;
            own.result = result;
            own.message = message;
        }
        self.dirty.insert(key.clone());
        self.records.get(&key)
    }

    pub fn get(&self, project: &str, sled_id: &str) -> Option<&Record> {
        self.records.get(&(project.to_owned(), sled_id.to_owned()))
    }

    /// The task whose creating call had the gateway's progress token `token`, while it is not
    /// terminal.
    pub fn by_progress(&self, token: &str) -> Option<(&str, &str, &Record)> {
        let (project, sled) = self.by_progress.get(token)?;
        let record = self.records.get(&(project.clone(), sled.clone()))?;
        Some((project, sled, record))
    }

    /// The (project, sled id) of `creator`'s live tasks, in project order.
    pub fn mine(&self, creator: &Creator) -> Vec<(&str, &str)> {
        self.records
            .iter()
            .filter(|(_, r)| r.creator == *creator)
            .map(|((p, s), _)| (p.as_str(), s.as_str()))
            .collect()
    }

    /// Every live task's (project, sled id): only for the planted bug that lists them all.
    pub fn all(&self) -> Vec<(String, String)> {
        self.records.keys().cloned().collect()
    }

    /// When the next record expires.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.expiries.first().map(|(at, _, _)| *at)
    }

    /// Forgets the records expired at `now`; returns how many.
    pub fn handle_timeout(&mut self, now: Instant) -> usize {
        let mut n = 0;
        while let Some((at, p, s)) = self.expiries.first().cloned() {
            if at > now {
                break;
            }
            self.remove(&(p.clone(), s.clone()));
            self.dirty.insert((p, s));
            n += 1;
        }
        n
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    fn remove(&mut self, key: &Key) {
        let Some(record) = self.records.remove(key) else {
            return;
        };
        self.expiries
            .remove(&(record.expires, key.0.clone(), key.1.clone()));
        if let Some((token, _)) = &record.progress {
            self.by_progress.remove(token);
        }
        let budget = record.creator.budget_key().map(Box::from);
        if let Some(n) = self.per_creator.get_mut(&budget) {
            *n -= 1;
            if *n == 0 {
                self.per_creator.remove(&budget);
            }
        }
    }
}

/// The TTL to ask the sled for: the client's (a number of milliseconds), else
/// [`DEFAULT_TTL`], at most [`MAX_TTL`].
pub fn ttl_to_ask(client: Option<&serde_json::Value>) -> Duration {
    client
        .and_then(serde_json::Value::as_u64)
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_TTL)
        .min(MAX_TTL)
}

/// How long the gateway keeps the record of a task the sled gave `ttl_ms` (`None`, null:
/// unlimited), at most [`MAX_TTL`].
pub fn ttl_kept(ttl_ms: Option<u64>) -> Duration {
    ttl_ms
        .map(Duration::from_millis)
        .unwrap_or(MAX_TTL)
        .min(MAX_TTL)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fake clock's origin: the one real reading, made once per test.
    #[allow(clippy::disallowed_methods)]
    fn t0() -> Instant {
        Instant::now()
    }

    fn tasks() -> Tasks {
        Tasks::new(TaskKey::new([1, 2, 3, 4], [7; 32]), None)
    }

    fn creator(owner: Option<&str>, session: Option<&str>) -> Creator {
        Creator {
            owner: owner.map(Box::from),
            session: session.map(Box::from),
        }
    }

    fn sealed(project: &str, sled: &str) -> Sealed {
        Sealed {
            project: project.into(),
            sled_id: sled.into(),
            right: "r",
        }
    }

    fn record(c: &Creator, now: Instant, ttl: Duration, token: Option<&str>) -> Record {
        Record {
            creator: c.clone(),
            right: "r",
            created: now,
            expires: now + ttl,
            status: Status::Working,
            progress: token.map(|t| {
                (
                    t.to_owned(),
                    serde_json::value::RawValue::from_string("1".into()).unwrap(),
                )
            }),
            own: None,
        }
    }

    #[test]
    fn an_id_opens_only_for_its_creator_and_names_its_project() {
        let t = tasks();
        let alice = creator(Some("alice"), Some("s1"));
        let id = t.seal(&sealed("beta", "t1"), &alice);
        assert_eq!(t.open(&id, &alice), Some(sealed("beta", "t1")));
        // Another identity, another session of the same identity, no identity: nothing.
        for other in [
            creator(Some("bob"), Some("s1")),
            creator(Some("alice"), Some("s2")),
            creator(Some("alice"), None),
            creator(None, Some("s1")),
        ] {
            assert_eq!(t.open(&id, &other), None, "{other:?}");
        }
        // The same sled id in another project is another id.
        let other = t.seal(&sealed("gamma", "t1"), &alice);
        assert_ne!(id, other);
        assert_eq!(t.open(&other, &alice).unwrap().project, "gamma");
    }

    #[test]
    fn an_altered_or_foreign_id_opens_for_nobody() {
        let t = tasks();
        let alice = creator(Some("alice"), None);
        let id = t.seal(&sealed("beta", "t1"), &alice);
        // Each field changed in turn.
        let parts: Vec<&str> = id.split('.').collect();
        let project = URL_SAFE_NO_PAD.encode("gamma");
        for (i, replacement) in [(1, "01020305"), (2, "w"), (3, project.as_str()), (4, "dDI")] {
            let mut p = parts.clone();
            p[i] = replacement;
            assert_eq!(t.open(&p.join("."), &alice), None, "field {i}");
        }
        // Under another key (another gateway), or not an id at all.
        let stranger = Tasks::new(TaskKey::new([1, 2, 3, 4], [8; 32]), None);
        assert_eq!(stranger.open(&id, &alice), None);
        for junk in [
            "",
            "mt1",
            "t1",
            "mt1.....",
            &format!("{id}.x"),
            &"a".repeat(5000),
        ] {
            assert_eq!(t.open(junk, &alice), None);
        }
    }

    #[test]
    fn during_a_roll_ids_under_the_previous_key_still_open() {
        let old = tasks();
        let alice = creator(Some("alice"), None);
        let id = old.seal(&sealed("beta", "t1"), &alice);
        let rolled = Tasks::new(
            TaskKey::new([9, 9, 9, 9], [5; 32]),
            Some(TaskKey::new([1, 2, 3, 4], [7; 32])),
        );
        assert_eq!(rolled.open(&id, &alice), Some(sealed("beta", "t1")));
        let new = rolled.seal(&sealed("beta", "t1"), &alice);
        assert!(new.starts_with("mt1.09090909."));
        assert_eq!(old.open(&new, &alice), None);
    }

    #[test]
    fn records_list_only_their_creator_and_expire_on_the_fake_clock() {
        let mut t = tasks();
        let now = t0();
        let alice = creator(Some("alice"), None);
        let bob = creator(Some("bob"), None);
        t.handle_created(
            "beta",
            "t1",
            record(&alice, now, Duration::from_secs(10), None),
        );
        t.handle_created(
            "gamma",
            "t1",
            record(&bob, now, Duration::from_secs(20), None),
        );
        t.handle_created(
            "alpha",
            "t9",
            record(&alice, now, Duration::from_secs(30), None),
        );
        assert_eq!(t.mine(&alice), vec![("alpha", "t9"), ("beta", "t1")]);
        assert_eq!(t.mine(&bob), vec![("gamma", "t1")]);
        assert_eq!(t.mine(&creator(Some("alice"), Some("s"))), vec![]);
        assert_eq!(t.poll_timeout(), Some(now + Duration::from_secs(10)));
        assert_eq!(t.handle_timeout(now + Duration::from_secs(9)), 0);
        assert_eq!(t.handle_timeout(now + Duration::from_secs(20)), 2);
        assert_eq!(t.mine(&alice), vec![("alpha", "t9")]);
        assert!(t.mine(&bob).is_empty());
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn progress_is_bound_until_the_task_is_terminal_and_a_terminal_status_is_final() {
        let mut t = tasks();
        let now = t0();
        let alice = creator(None, Some("s1"));
        t.handle_created("beta", "t1", record(&alice, now, DEFAULT_TTL, Some("gw-1")));
        assert_eq!(
            t.by_progress("gw-1").map(|(p, s, _)| (p, s)),
            Some(("beta", "t1"))
        );
        t.handle_status("beta", "t1", Status::InputRequired);
        assert!(t.by_progress("gw-1").is_some());
        t.handle_status("beta", "t1", Status::Cancelled);
        assert!(t.by_progress("gw-1").is_none());
        let r = t.handle_status("beta", "t1", Status::Completed).unwrap();
        assert_eq!(r.status, Status::Cancelled);
        // Unknown tasks have no record.
        assert!(t.handle_status("beta", "t2", Status::Completed).is_none());
    }

    #[test]
    fn a_creator_has_a_bounded_number_of_live_tasks() {
        let mut t = tasks();
        let now = t0();
        let alice = creator(Some("alice"), None);
        for i in 0..MAX_TASKS_PER_CREATOR {
            assert_eq!(t.check_room(&alice), Ok(()));
            t.handle_created(
                "beta",
                &format!("t{i}"),
                record(&alice, now, DEFAULT_TTL, None),
            );
        }
        assert_eq!(
            t.check_room(&alice),
            Err(Refused::TooMany {
                max: MAX_TASKS_PER_CREATOR
            })
        );
        assert_eq!(t.check_room(&creator(Some("bob"), None)), Ok(()));
        t.handle_timeout(now + DEFAULT_TTL);
        assert_eq!(t.check_room(&alice), Ok(()));
    }

    #[test]
    fn records_go_to_the_store_and_come_back_with_their_age() {
        let mut t = tasks();
        let now = t0();
        let alice = creator(Some("alice"), Some("s1"));
        t.handle_created(
            "beta",
            "t1",
            record(&alice, now, Duration::from_secs(60), Some("gw")),
        );
        t.handle_created(
            "beta",
            "t2",
            record(&alice, now, Duration::from_secs(5), None),
        );
        let later = now + Duration::from_secs(1);
        let changes = t.take_changes(later);
        assert_eq!(changes.len(), 2);
        assert!(changes
            .iter()
            .all(|c| is_record_key(&c.key) && c.value.is_some()));
        assert!(!t.has_changes());
        // Read back by another process 10 s after the write: t2 is past its TTL.
        let stored = changes
            .iter()
            .map(|c| crate::coord::StoredRecord {
                key: c.key.clone(),
                value: c.value.clone().unwrap(),
                age: Duration::from_secs(10),
            })
            .collect();
        let mut back = tasks();
        let then = t0() + Duration::from_secs(100);
        assert_eq!(back.restore(then, stored), 1);
        assert_eq!(back.mine(&alice), vec![("beta", "t1")]);
        let r = back.get("beta", "t1").unwrap();
        assert_eq!(r.expires, then + Duration::from_secs(49));
        assert!(
            r.progress.is_none(),
            "a progress binding is the old process's"
        );
        // The expired one is deleted from the store.
        let gone = back.take_changes(then);
        assert_eq!(gone.len(), 1);
        assert_eq!(
            (gone[0].key.as_str(), gone[0].value.as_ref()),
            (record_key("beta", "t2").as_str(), None)
        );
        // A status change is written; an expiry is a delete.
        back.handle_status("beta", "t1", Status::Completed);
        assert_eq!(back.take_changes(then).len(), 1);
        back.handle_timeout(then + Duration::from_secs(49));
        let c = back.take_changes(then + Duration::from_secs(49));
        assert_eq!((c.len(), c[0].value.is_none()), (1, true));
    }

    #[test]
    fn a_project_taken_over_gets_the_records_its_last_holder_kept() {
        let mut t = tasks();
        let now = t0();
        let alice = creator(Some("alice"), None);
        t.handle_created("beta", "old", record(&alice, now, DEFAULT_TTL, None));
        t.handle_created("gamma", "g", record(&alice, now, DEFAULT_TTL, None));
        t.take_changes(now);
        let kept = Kept {
            owner: Some("alice".into()),
            session: None,
            right: "w".into(),
            status: "working".into(),
            expires_in_ms: 60_000,
            own: None,
        };
        let n = t.replace_project(
            now,
            "beta",
            vec![
                crate::coord::StoredRecord {
                    key: record_key("beta", "new"),
                    value: serde_json::to_vec(&kept).unwrap(),
                    age: Duration::ZERO,
                },
                crate::coord::StoredRecord {
                    key: "62657461.t.zz".into(),
                    value: b"{}".to_vec(),
                    age: Duration::ZERO,
                },
            ],
        );
        assert_eq!(n, 1);
        assert_eq!(t.mine(&alice), vec![("beta", "new"), ("gamma", "g")]);
        assert_eq!(t.get("beta", "new").unwrap().right, "w");
        assert!(!t.has_changes(), "what was read is not written back");
    }

    #[test]
    fn a_task_the_gateway_ran_comes_back_finished_or_failed_after_a_restart() {
        let mut t = tasks();
        let now = t0();
        let alice = creator(None, Some("s1"));
        for id in ["done", "running"] {
            let mut r = record(&alice, now, DEFAULT_TTL, None);
            r.own = Some(Box::new(Own {
                created_ms: 1_000,
                updated_ms: 1_000,
                result: None,
                message: None,
            }));
            t.handle_created(GATEWAY_PROJECT, id, r);
        }
        let r = t
            .finish_own(
                "done",
                Status::Completed,
                Some("{\"content\":[]}".into()),
                None,
                2_000,
            )
            .unwrap();
        assert_eq!(r.own.as_ref().unwrap().updated_ms, 2_000);
        assert!(
            t.finish_own("done", Status::Failed, None, None, 3_000)
                .is_none(),
            "final"
        );
        let stored = t
            .take_changes(now)
            .into_iter()
            .map(|c| crate::coord::StoredRecord {
                key: c.key,
                value: c.value.unwrap(),
                age: Duration::from_secs(1),
            })
            .collect();
        let mut back = tasks();
        assert_eq!(back.restore(now, stored), 2);
        let done = back.get(GATEWAY_PROJECT, "done").unwrap();
        assert_eq!(done.status, Status::Completed);
        assert_eq!(
            done.own.as_ref().unwrap().result.as_deref(),
            Some("{\"content\":[]}")
        );
        let running = back.get(GATEWAY_PROJECT, "running").unwrap();
        assert_eq!(running.status, Status::Failed);
        assert!(running.own.as_ref().unwrap().message.is_some());
        assert!(back.has_changes(), "the failure is written");
    }

    #[test]
    fn ttls_are_bounded() {
        assert_eq!(ttl_to_ask(None), DEFAULT_TTL);
        assert_eq!(
            ttl_to_ask(Some(&serde_json::json!(5000))),
            Duration::from_secs(5)
        );
        assert_eq!(ttl_to_ask(Some(&serde_json::json!(u64::MAX))), MAX_TTL);
        assert_eq!(ttl_to_ask(Some(&serde_json::json!("x"))), DEFAULT_TTL);
        assert_eq!(ttl_kept(None), MAX_TTL);
        assert_eq!(ttl_kept(Some(1000)), Duration::from_secs(1));
    }
}
