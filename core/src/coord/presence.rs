//! Presence: check-in, the roster, touching, forgetting absent agents, a session's end.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::persist::Which;
use super::{
    check_name, deadline, grant_ttl, retime, Checkin, Coord, CoordError, CoordLimit, End, Ended,
    LostLease, Member, PresenceStatus, Project, ReleasedLease, RosterEntry, Timer, CHECKIN_PAGE,
};

impl Coord {
    /// The project, created if new (bounded by `max_projects`).
    pub(super) fn project_mut(&mut self, project: &str) -> Result<&mut Project, CoordError> {
        check_name("project", project, self.limits.max_name_len)?;
        if !self.projects.contains_key(project) {
            if self.projects.len() >= self.limits.max_projects {
                return Err(self.limit(CoordLimit::Projects, self.limits.max_projects));
            }
            let project_state = Project {
                dirty: self.persisting.then(Default::default),
                ..Project::default()
            };
            self.projects.insert(project.to_owned(), project_state);
        }
        Ok(self
            .projects
            .get_mut(project)
            .expect("the project was just found or inserted"))
    }

    pub(super) fn limit(&mut self, which: CoordLimit, max: usize) -> CoordError {
        self.stats.refused_by_limit += 1;
        CoordError::Limit { which, max }
    }

    /// Refreshes `agent`'s presence on `project` (making it a member if new), with
    /// `presence_ttl` when given.
    pub(super) fn touch(
        &mut self,
        now: Instant,
        project: &str,
        agent: &str,
        presence_ttl: Option<Duration>,
    ) -> Result<&mut Member, CoordError> {
        check_name("agent", agent, self.limits.max_name_len)?;
        let limits = self.limits.clone();
        self.project_mut(project)?;
        self.entry_changed(project, Which::Member(agent.to_owned()));
        let p = self.project_mut(project)?;
        if !p.members.contains_key(agent) {
            if p.members.len() >= limits.max_agents_per_project {
                return Err(self.limit(CoordLimit::AgentsPerProject, limits.max_agents_per_project));
            }
            self.agents
                .entry(agent.to_owned())
                .or_default()
                .insert(project.to_owned());
            let p = self.projects.get_mut(project).expect("project_mut made it");
            let member = Member {
                name: None,
                task: None,
                presence_ttl: limits.presence_ttl,
                last_seen: now,
                present_until: None,
                forget_at: None,
                joined: p.msg_seq,
                cursor: 0,
                event_cursor: p.event_seq,
                held: BTreeSet::new(),
                lost: VecDeque::new(),
                refused_on: BTreeSet::new(),
                released: BTreeSet::new(),
                expired: VecDeque::new(),
            };
            p.members.insert(agent.to_owned(), member);
        }
        let Coord {
            projects, timers, ..
        } = self;
        let m = projects
            .get_mut(project)
            .and_then(|p| p.members.get_mut(agent))
            .expect("the member was just found or inserted");
        if let Some(ttl) = presence_ttl {
            m.presence_ttl = ttl;
        }
        let until = deadline("presence", now, m.presence_ttl)?;
        m.last_seen = now;
        let presence = Timer::Presence {
            project: project.to_owned(),
            agent: agent.to_owned(),
        };
        retime(
            timers,
            m.present_until.replace(until),
            Some(until),
            presence,
        );
        let forget = Timer::Forget {
            project: project.to_owned(),
            agent: agent.to_owned(),
        };
        retime(timers, m.forget_at.take(), None, forget);
        Ok(m)
    }

    pub(super) fn presence_expired(&mut self, now: Instant, project: &str, agent: &str) {
        let forget_after = self.limits.forget_after;
        let Some(m) = self
            .projects
            .get_mut(project)
            .and_then(|p| p.members.get_mut(agent))
        else {
            return;
        };
        if m.present_until.is_some_and(|t| t <= now) {
            m.present_until = None;
            let at = now.checked_add(forget_after).unwrap_or(now);
            let forget = Timer::Forget {
                project: project.to_owned(),
                agent: agent.to_owned(),
            };
            retime(&mut self.timers, m.forget_at.replace(at), Some(at), forget);
            self.entry_changed(project, Which::Member(agent.to_owned()));
        }
    }

    /// Forgets an absent member, unless it still holds a lease or waits there.
    pub(super) fn maybe_forget(&mut self, now: Instant, project: &str, agent: &str) {
        let waiting = self.waiters_by_agent.get(agent).is_some_and(|ts| {
            ts.iter().any(|t| {
                self.waiters
                    .get(t)
                    .is_some_and(|w| w.projects.iter().any(|p| p == project))
            })
        });
        let forget_after = self.limits.forget_after;
        let Some(p) = self.projects.get_mut(project) else {
            return;
        };
        let Some(m) = p.members.get_mut(agent) else {
            return;
        };
        if m.present_until.is_some() {
            return;
        }
        if waiting || !m.held.is_empty() {
            let at = now.checked_add(forget_after).unwrap_or(now);
            let forget = Timer::Forget {
                project: project.to_owned(),
                agent: agent.to_owned(),
            };
            retime(&mut self.timers, m.forget_at.replace(at), Some(at), forget);
            return;
        }
        self.remove_member(project, agent);
    }

    /// Removes a member that holds no lease, with its timers and index entries.
    pub(super) fn remove_member(&mut self, project: &str, agent: &str) {
        self.entry_changed(project, Which::Member(agent.to_owned()));
        let Some(p) = self.projects.get_mut(project) else {
            return;
        };
        let Some(m) = p.members.remove(agent) else {
            return;
        };
        for r in &m.refused_on {
            if let Some(set) = p.refused.get_mut(r) {
                set.remove(agent);
                if set.is_empty() {
                    p.refused.remove(r);
                }
            }
        }
        let presence = Timer::Presence {
            project: project.to_owned(),
            agent: agent.to_owned(),
        };
        retime(&mut self.timers, m.present_until, None, presence);
        let forget = Timer::Forget {
            project: project.to_owned(),
            agent: agent.to_owned(),
        };
        retime(&mut self.timers, m.forget_at, None, forget);
        if let Some(ps) = self.agents.get_mut(agent) {
            ps.remove(project);
            if ps.is_empty() {
                self.agents.remove(agent);
            }
        }
    }

    /// Registers or refreshes presence, renews every lease the agent holds in the project,
    /// and returns (reporting them) its lost leases there and its first unread messages.
    pub fn checkin(
        &mut self,
        now: Instant,
        project: &str,
        agent: &str,
        name: Option<String>,
        task: Option<String>,
        ttl: Option<Duration>,
    ) -> Result<Checkin, CoordError> {
        self.handle_timeout(now);
        let l = &self.limits;
        if let Some(name) = &name {
            check_name("agent display", name, l.max_name_len)?;
        }
        if let Some(task) = &task {
            if task.len() > l.max_task_bytes {
                let (max_bytes, got) = (l.max_task_bytes, task.len());
                return Err(CoordError::TooLarge {
                    what: "task",
                    max_bytes,
                    got,
                });
            }
        }
        let (ttl, ttl_clamped) = grant_ttl("presence", ttl, l.presence_ttl, l.presence_ttl_max)?;
        let m = self.touch(now, project, agent, Some(ttl))?;
        if name.is_some() {
            m.name = name;
        }
        if let Some(task) = task {
            m.task = Some(task).filter(|t| !t.is_empty());
        }
        let held: Vec<String> = m.held.iter().cloned().collect();
        let lost: Vec<LostLease> = m.lost.drain(..).collect();
        let mut renewed = Vec::new();
        for resource in held {
            let lease = self.renew_lease(now, project, &resource, None)?;
            renewed.push(lease);
        }
        let inbox = self.read_inbox(now, project, agent, false, CHECKIN_PAGE);
        Ok(Checkin {
            expires_in: ttl,
            ttl_clamped,
            renewed,
            lost,
            inbox,
        })
    }

    /// The agents present on `project`, by id.
    pub fn roster(&mut self, now: Instant, project: &str) -> Vec<RosterEntry> {
        self.handle_timeout(now);
        let Some(p) = self.projects.get(project) else {
            return Vec::new();
        };
        p.members
            .iter()
            .filter(|(_, m)| m.present_until.is_some_and(|t| now < t))
            .map(|(agent, m)| {
                let ago = now.saturating_duration_since(m.last_seen);
                RosterEntry {
                    agent: agent.clone(),
                    name: m.name.clone(),
                    task: m.task.clone(),
                    last_seen_ago: ago,
                    status: if ago <= self.limits.active_window {
                        PresenceStatus::Active
                    } else {
                        PresenceStatus::Stale
                    },
                    held: m.held.iter().cloned().collect(),
                }
            })
            .collect()
    }

    /// The session ended: it leaves every roster, its leases are released (not reported to
    /// it as lost; those refused on them are woken), and its parked waits are removed.
    pub fn end_agent(&mut self, now: Instant, agent: &str) -> Ended {
        self.handle_timeout(now);
        self.watched.remove(agent);
        self.notices.retain(|(a, _)| a != agent);
        let mut ended = Ended::default();
        for token in self
            .waiters_by_agent
            .get(agent)
            .cloned()
            .unwrap_or_default()
        {
            if self.unpark(token).is_some() {
                ended.cancelled_waits.push(token);
            }
        }
        let projects = self.agents.get(agent).cloned().unwrap_or_default();
        for project in projects {
            let held = self
                .projects
                .get(&project)
                .and_then(|p| p.members.get(agent))
                .map(|m| m.held.iter().cloned().collect::<Vec<_>>())
                .unwrap_or_default();
            self.changed(&project);
            for resource in held {
                if let Some(fence) = self.end_lease(&project, &resource, End::AgentEnded) {
                    ended.released.push(ReleasedLease {
                        project: project.clone(),
                        resource,
                        fence,
                    });
                }
            }
            self.remove_member(&project, agent);
        }
        ended
    }
}
