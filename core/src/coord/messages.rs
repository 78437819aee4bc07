//! Messages: direct and to the project's channel, with a cursor per agent and project.

use std::iter::Peekable;
use std::ops::Bound::{Excluded, Unbounded};
use std::time::{Duration, Instant};

use super::persist::Which;
use super::{
    check_name, deadline, grant_ttl, next, retime, Coord, CoordError, CoordLimit, Inbox, Message,
    MessageTo, Project, Recipient, Sent, StoredMessage, Timer,
};

impl Coord {
    /// Sends `body` to an agent (stored even if it is not present) or to the channel.
    pub fn send(
        &mut self,
        now: Instant,
        project: &str,
        from: &str,
        to: Recipient,
        body: String,
        ttl: Option<Duration>,
    ) -> Result<Sent, CoordError> {
        self.handle_timeout(now);
        let l = &self.limits;
        if let Recipient::Agent(to) = &to {
            check_name("agent", to, l.max_name_len)?;
        }
        if body.len() > l.max_message_bytes {
            self.stats.messages_refused += 1;
            return Err(CoordError::TooLarge {
                what: "message",
                max_bytes: l.max_message_bytes,
                got: body.len(),
            });
        }
        let (ttl, ttl_clamped) = grant_ttl("message", ttl, l.message_ttl, l.message_ttl_max)?;
        let expires_at = deadline("message", now, ttl)?;
        let (max_inbox, max_messages) = (l.max_inbox, l.max_messages_per_project);
        let from_name = self.touch(now, project, from, None)?.name.clone();
        let p = self
            .projects
            .get_mut(project)
            .expect("touch made the project");
        let full = match &to {
            Recipient::Channel => p.channel.len() >= max_inbox,
            Recipient::Agent(a) => p.direct.get(a).is_some_and(|s| s.len() >= max_inbox),
        };
        if full {
            self.stats.messages_refused += 1;
            self.stats.refused_by_limit += 1;
            return Err(CoordError::InboxFull { to, max: max_inbox });
        }
        if p.messages.len() >= max_messages {
            self.stats.messages_refused += 1;
            return Err(self.limit(CoordLimit::MessagesPerProject, max_messages));
        }
        let id = next(p.msg_seq, "message id")?;
        p.msg_seq = id;
        match &to {
            Recipient::Channel => {
                p.channel.insert(id);
            }
            Recipient::Agent(a) => {
                p.direct.entry(a.clone()).or_default().insert(id);
            }
        }
        let concerns = match &to {
            Recipient::Agent(a) => Some(a.clone()),
            Recipient::Channel => None,
        };
        let message = StoredMessage {
            from: from.to_owned(),
            from_name,
            to,
            body,
            sent_at: now,
            expires_at,
        };
        p.messages.insert(id, message);
        p.mark(Which::Message(id));
        let timer = Timer::Message {
            project: project.to_owned(),
            id,
        };
        retime(&mut self.timers, None, Some(expires_at), timer);
        self.stats.messages_sent += 1;
        self.wake(project, concerns.as_deref());
        Ok(Sent {
            id,
            expires_in: ttl,
            ttl_clamped,
        })
    }

    /// Up to `limit` unread messages in id order; a read (not `peek`) commits the cursor to
    /// the last one returned.
    pub fn inbox(
        &mut self,
        now: Instant,
        project: &str,
        agent: &str,
        peek: bool,
        limit: usize,
    ) -> Result<Inbox, CoordError> {
        self.handle_timeout(now);
        self.touch(now, project, agent, None)?;
        Ok(self.read_inbox(now, project, agent, peek, limit))
    }

    /// How many messages `agent` has unread on `project`.
    pub fn unread(&mut self, now: Instant, agent: &str, project: &str) -> usize {
        self.handle_timeout(now);
        let Some(p) = self.projects.get(project) else {
            return 0;
        };
        let Some(m) = p.members.get(agent) else {
            return 0;
        };
        p.unread_ids(agent, m.cursor, m.joined).count()
    }

    pub(super) fn read_inbox(
        &mut self,
        now: Instant,
        project: &str,
        agent: &str,
        peek: bool,
        limit: usize,
    ) -> Inbox {
        let Some(p) = self.projects.get_mut(project) else {
            return Inbox::default();
        };
        let Some(m) = p.members.get(agent) else {
            return Inbox::default();
        };
        let (cursor, joined) = (m.cursor, m.joined);
        let mut ids: Vec<u64> = p
            .unread_ids(agent, cursor, joined)
            .take(limit.saturating_add(1))
            .collect();
        let more = ids.len() > limit;
        ids.truncate(limit);
        let messages: Vec<Message> = ids
            .iter()
            .filter_map(|id| {
                let s = p.messages.get(id)?;
                Some(Message {
                    id: *id,
                    from: s.from.clone(),
                    from_name: s.from_name.clone(),
                    to: match s.to {
                        Recipient::Agent(_) => MessageTo::Agent,
                        Recipient::Channel => MessageTo::Channel,
                    },
                    body: s.body.clone(),
                    sent_ago: now.saturating_duration_since(s.sent_at),
                })
            })
            .collect();
        if let (false, Some(&last)) = (peek, ids.last()) {
            if let Some(m) = p.members.get_mut(agent) {
                m.cursor = last;
            }
            // Direct messages read are gone: only their recipient could read them.
            let read: Vec<u64> = p
                .direct
                .get(agent)
                .map(|s| s.range(..=last).copied().collect())
                .unwrap_or_default();
            for id in read {
                if let Some(s) = p.remove_message(id) {
                    let timer = Timer::Message {
                        project: project.to_owned(),
                        id,
                    };
                    retime(&mut self.timers, Some(s.expires_at), None, timer);
                }
            }
        }
        let unread = p
            .members
            .get(agent)
            .map_or(0, |m| p.unread_ids(agent, m.cursor, m.joined).count());
        Inbox {
            messages,
            more,
            unread,
        }
    }
}

impl Project {
    /// The ids of `agent`'s unread messages, in order: direct ones past its cursor, and
    /// channel ones from others past both its cursor and its arrival.
    pub(super) fn unread_ids<'a>(
        &'a self,
        agent: &'a str,
        cursor: u64,
        joined: u64,
    ) -> impl Iterator<Item = u64> + 'a {
        let direct = self
            .direct
            .get(agent)
            .into_iter()
            .flat_map(move |s| s.range((Excluded(cursor), Unbounded)).copied());
        let channel = self
            .channel
            .range((Excluded(cursor.max(joined)), Unbounded))
            .copied()
            .filter(move |id| self.messages.get(id).is_some_and(|m| m.from != agent));
        Merge {
            a: direct.peekable(),
            b: channel.peekable(),
        }
    }

    /// Removes a message from the store and its indexes (not its timer).
    pub(super) fn remove_message(&mut self, id: u64) -> Option<StoredMessage> {
        let s = self.messages.remove(&id)?;
        self.mark(Which::Message(id));
        match &s.to {
            Recipient::Channel => {
                self.channel.remove(&id);
            }
            Recipient::Agent(a) => {
                if let Some(set) = self.direct.get_mut(a) {
                    set.remove(&id);
                    if set.is_empty() {
                        self.direct.remove(a);
                    }
                }
            }
        }
        Some(s)
    }
}

/// Two ascending iterators of disjoint ids, merged in order.
struct Merge<A: Iterator<Item = u64>, B: Iterator<Item = u64>> {
    a: Peekable<A>,
    b: Peekable<B>,
}

impl<A: Iterator<Item = u64>, B: Iterator<Item = u64>> Iterator for Merge<A, B> {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        match (self.a.peek(), self.b.peek()) {
            (Some(x), Some(y)) if x <= y => self.a.next(),
            (Some(_), None) => self.a.next(),
            _ => self.b.next(),
        }
    }
}
