//! Waiters, level-triggered on each agent's cursors and pending reports, and sled events.

use std::time::Instant;

use super::{
    check_name, next, retime, truncate, Coord, CoordError, CoordLimit, MessageTo, Recipient,
    SledEvent, Timer, WaitReady, WaitReason, WaitStart, WaitToken, Waiter, EVENT_RING,
    MAX_MESSAGE_REASONS, MAX_WAIT_PROJECTS,
};

impl Coord {
    /// Answers at once if anything concerning `agent` is pending in one of `projects`, else
    /// parks `token` until something is or `deadline` (at most `max_wait` away) passes. The
    /// look and the registration are one step, so nothing slips between them.
    pub fn wait(
        &mut self,
        now: Instant,
        agent: &str,
        projects: &[String],
        token: WaitToken,
        deadline: Instant,
    ) -> Result<WaitStart, CoordError> {
        self.handle_timeout(now);
        check_name("agent", agent, self.limits.max_name_len)?;
        let mut names: Vec<String> = Vec::new();
        for p in projects {
            check_name("project", p, self.limits.max_name_len)?;
            if !names.contains(p) {
                names.push(p.clone());
            }
        }
        if names.is_empty() {
            return Err(CoordError::BadName {
                what: "project",
                reason: "none named",
            });
        }
        if names.len() > MAX_WAIT_PROJECTS {
            return Err(self.limit(CoordLimit::WaitProjects, MAX_WAIT_PROJECTS));
        }
        if self.waiters.contains_key(&token) {
            return Err(CoordError::DuplicateToken(token));
        }
        for p in &names {
            self.touch(now, p, agent, None)?;
        }
        #[cfg(feature = "planted-bugs")]
        let looks = !self.planted(super::CoordBug::WaitLooksThenRegisters);
        #[cfg(not(feature = "planted-bugs"))]
        let looks = true;
        // The planted bug looks before what is pending was committed: it sees nothing.
        for p in names.iter().filter(|_| looks) {
            let reasons = self.collect(p, agent);
            if !reasons.is_empty() {
                self.stats.waits_ready_at_once += 1;
                let project = Some(p.clone());
                return Ok(WaitStart::Ready(WaitReady { project, reasons }));
            }
        }
        let deadline = match now.checked_add(self.limits.max_wait) {
            Some(max) => deadline.min(max),
            None => deadline,
        };
        if deadline <= now {
            self.stats.waits_timed_out += 1;
            let ready = WaitReady {
                project: None,
                reasons: Vec::new(),
            };
            return Ok(WaitStart::Ready(ready));
        }
        if self.waiters.len() >= self.limits.max_waiters {
            self.stats.refused_by_limit += 1;
            let max = self.limits.max_waiters;
            return Err(CoordError::TooManyWaiters { max });
        }
        self.waiters_by_agent
            .entry(agent.to_owned())
            .or_default()
            .insert(token);
        for p in &names {
            self.waiters_by_project
                .entry(p.clone())
                .or_default()
                .insert(token);
        }
        let waiter = Waiter {
            agent: agent.to_owned(),
            projects: names,
            deadline,
        };
        self.waiters.insert(token, waiter);
        retime(&mut self.timers, None, Some(deadline), Timer::Wait(token));
        self.stats.waits_parked += 1;
        Ok(WaitStart::Parked { deadline })
    }

    /// Removes a parked wait (its client went away). `false` if it was not parked.
    pub fn cancel_wait(&mut self, token: WaitToken) -> bool {
        self.unpark(token).is_some()
    }

    /// The next wait that ended, each exactly once.
    pub fn poll_woken(&mut self) -> Option<(WaitToken, WaitReady)> {
        self.flush_wakes();
        self.woken.pop_front()
    }

    /// `agent` hears of what concerns it without waiting: each time something does (what would
    /// wake a wait of its: a message, a lease lost, a refused resource released, a sled event),
    /// `(agent, project)` comes out of [`Coord::poll_notice`] once. Reports are not consumed.
    /// Ended by [`Coord::end_agent`].
    pub fn watch(&mut self, agent: &str) {
        self.watched.insert(agent.to_owned());
    }

    /// The next (agent, project) notice for a watched agent.
    pub fn poll_notice(&mut self) -> Option<(super::AgentId, String)> {
        self.flush_wakes();
        self.notices.pop_first()
    }

    /// Records a sled event on `project`, which concerns every agent there; returns its number.
    pub fn sled_event(
        &mut self,
        now: Instant,
        project: &str,
        kind: String,
        story: Option<String>,
    ) -> Result<u64, CoordError> {
        self.handle_timeout(now);
        let (max_kind, max_story) = (self.limits.max_name_len, self.limits.max_task_bytes);
        let p = self.project_mut(project)?;
        let seq = next(p.event_seq, "sled event")?;
        p.event_seq = seq;
        if p.events.len() >= EVENT_RING {
            p.events.pop_front();
        }
        p.events.push_back(SledEvent {
            seq,
            kind: truncate(kind, max_kind),
            story: story.map(|s| truncate(s, max_story)),
        });
        self.wake(project, None);
        Ok(seq)
    }

    /// Takes what is pending for `agent` on `project`: its lost leases and released notices
    /// (reported now), sled events past its cursor (advanced), and unread messages (listed,
    /// not read).
    fn collect(&mut self, project: &str, agent: &str) -> Vec<WaitReason> {
        let Some(p) = self.projects.get_mut(project) else {
            return Vec::new();
        };
        let Some(m) = p.members.get_mut(agent) else {
            return Vec::new();
        };
        let mut reasons: Vec<WaitReason> = m
            .lost
            .drain(..)
            .map(|l| WaitReason::LeaseLost {
                resource: l.resource,
                fence: l.fence,
                reason: l.reason,
            })
            .collect();
        let released = std::mem::take(&mut m.released);
        reasons.extend(
            released
                .into_iter()
                .map(|resource| WaitReason::Released { resource }),
        );
        let cursor = m.event_cursor;
        m.event_cursor = p.event_seq;
        reasons.extend(
            p.events
                .iter()
                .filter(|e| e.seq > cursor)
                .map(|e| WaitReason::SledEvent {
                    seq: e.seq,
                    kind: e.kind.clone(),
                    story: e.story.clone(),
                }),
        );
        let (cursor, joined) = (m.cursor, m.joined);
        let messages = p
            .unread_ids(agent, cursor, joined)
            .take(MAX_MESSAGE_REASONS);
        let messages: Vec<WaitReason> = messages
            .filter_map(|id| {
                let s = p.messages.get(&id)?;
                Some(WaitReason::Message {
                    id,
                    from: s.from.clone(),
                    to: match s.to {
                        Recipient::Agent(_) => MessageTo::Agent,
                        Recipient::Channel => MessageTo::Channel,
                    },
                })
            })
            .collect();
        reasons.splice(0..0, messages);
        reasons
    }

    /// Something happened on `project` concerning `agent` (`None`: everyone there). The wake
    /// pass runs at the end of `handle_timeout` (which every call starts with) and in
    /// `poll_woken`, so what happens at one instant (several leases expiring) is one wake.
    pub(super) fn wake(&mut self, project: &str, agent: Option<&str>) {
        self.dirty
            .insert((project.to_owned(), agent.map(str::to_owned)));
    }

    /// Every parked waiter concerned by what happened, with something pending now, comes
    /// out of `poll_woken`.
    pub(super) fn flush_wakes(&mut self) {
        while let Some((project, agent)) = self.dirty.pop_first() {
            self.notice(&project, agent.as_deref());
            self.wake_now(&project, agent.as_deref());
        }
    }

    /// Notices for the watched agents concerned by what happened on `project`: the one named,
    /// or (`None`) every watched agent present there.
    fn notice(&mut self, project: &str, agent: Option<&str>) {
        if self.watched.is_empty() {
            return;
        }
        let Some(p) = self.projects.get(project) else {
            return;
        };
        let concerned: Vec<super::AgentId> = match agent {
            Some(a) if self.watched.contains(a) && p.members.contains_key(a) => vec![a.to_owned()],
            Some(_) => Vec::new(),
            None => p
                .members
                .iter()
                .filter(|(a, m)| m.present_until.is_some() && self.watched.contains(*a))
                .map(|(a, _)| a.clone())
                .collect(),
        };
        for a in concerned {
            self.notices.insert((a, project.to_owned()));
        }
    }

    fn wake_now(&mut self, project: &str, agent: Option<&str>) {
        let tokens: Vec<WaitToken> = match agent {
            None => self
                .waiters_by_project
                .get(project)
                .map(|ts| ts.iter().copied().collect())
                .unwrap_or_default(),
            Some(agent) => self
                .waiters_by_agent
                .get(agent)
                .map(|ts| {
                    ts.iter()
                        .copied()
                        .filter(|t| {
                            self.waiters
                                .get(t)
                                .is_some_and(|w| w.projects.iter().any(|p| p == project))
                        })
                        .collect()
                })
                .unwrap_or_default(),
        };
        for token in tokens {
            let Some(agent) = self.waiters.get(&token).map(|w| w.agent.clone()) else {
                continue;
            };
            let reasons = self.collect(project, &agent);
            if reasons.is_empty() {
                continue;
            }
            self.unpark(token);
            self.stats.waits_woken += 1;
            let project = Some(project.to_owned());
            self.woken
                .push_back((token, WaitReady { project, reasons }));
        }
    }

    /// Removes a parked waiter from every index and its timer.
    pub(super) fn unpark(&mut self, token: WaitToken) -> Option<Waiter> {
        let w = self.waiters.remove(&token)?;
        if let Some(ts) = self.waiters_by_agent.get_mut(&w.agent) {
            ts.remove(&token);
            if ts.is_empty() {
                self.waiters_by_agent.remove(&w.agent);
            }
        }
        for p in &w.projects {
            if let Some(ts) = self.waiters_by_project.get_mut(p) {
                ts.remove(&token);
                if ts.is_empty() {
                    self.waiters_by_project.remove(p);
                }
            }
        }
        retime(&mut self.timers, Some(w.deadline), None, Timer::Wait(token));
        Some(w)
    }
}
