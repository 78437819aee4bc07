//! Leases with fences: claim, renew, release, forced release, the write check, lost leases.

use std::time::{Duration, Instant};

use super::persist::Which;
use super::{
    check_name, deadline, grant_ttl, next, retime, Claim, Coord, CoordError, CoordLimit, End,
    LeaseView, LostLease, LostReason, Released, Renewed, Timer, WriteCheck, MAX_PENDING,
};

impl Coord {
    /// Claims `resource`: a fresh grant takes the project's next fence; a re-entrant claim
    /// renews and keeps its fence; a resource held by another is `Held` (and the claimant's
    /// waits wake when it is released or expires).
    pub fn claim(
        &mut self,
        now: Instant,
        project: &str,
        agent: &str,
        resource: &str,
        ttl: Option<Duration>,
    ) -> Result<Claim, CoordError> {
        self.handle_timeout(now);
        let l = &self.limits;
        check_name("resource", resource, l.max_name_len)?;
        let (ttl, ttl_clamped) = grant_ttl("lease", ttl, l.lease_ttl, l.lease_ttl_max)?;
        let expires_at = deadline("lease", now, ttl)?;
        self.touch(now, project, agent, None)?;
        #[cfg(feature = "planted-bugs")]
        if self.planted(super::CoordBug::LeaseExpiryInclusive)
            && self
                .projects
                .get(project)
                .and_then(|p| p.leases.get(resource))
                .is_some_and(|l| l.holder != agent && l.expires_at <= now)
        {
            // The planted bug's other half: a claimant sees the lease as expired.
            self.end_lease(project, resource, End::Lost(LostReason::Expired));
        }
        let p = self
            .projects
            .get_mut(project)
            .expect("touch made the project");
        if let Some(lease) = p.leases.get(resource) {
            if lease.holder == agent {
                let view = self.renew_lease(now, project, resource, Some(ttl))?;
                self.stats.claims_reentrant += 1;
                return Ok(Claim::Acquired {
                    fence: view.fence,
                    expires_in: ttl,
                    reentrant: true,
                    ttl_clamped,
                });
            }
            let holder = lease.holder.clone();
            let held = Claim::Held {
                holder_name: p.members.get(&holder).and_then(|m| m.name.clone()),
                expires_in: lease.expires_at.saturating_duration_since(now),
                holder,
            };
            p.refused
                .entry(resource.to_owned())
                .or_default()
                .insert(agent.to_owned());
            let m = p.members.get_mut(agent).expect("touch made the member");
            m.refused_on.insert(resource.to_owned());
            m.released.remove(resource);
            self.stats.claims_conflict += 1;
            return Ok(held);
        }
        let (per_agent, per_project) = (
            self.limits.max_leases_per_agent,
            self.limits.max_resources_per_project,
        );
        if self.leases_held_by(agent) >= per_agent {
            return Err(self.limit(CoordLimit::LeasesPerAgent, per_agent));
        }
        let p = self
            .projects
            .get_mut(project)
            .expect("touch made the project");
        if p.leases.len() >= per_project {
            return Err(self.limit(CoordLimit::LeasesPerProject, per_project));
        }
        let fence = next(p.fence, "fence")?;
        p.fence = fence;
        let lease = super::Lease {
            holder: agent.to_owned(),
            fence,
            ttl,
            expires_at,
        };
        p.leases.insert(resource.to_owned(), lease);
        p.mark(Which::Lease(resource.to_owned()));
        let m = p.members.get_mut(agent).expect("touch made the member");
        m.held.insert(resource.to_owned());
        m.released.remove(resource);
        m.expired.retain(|r| r != resource);
        // Not refused on it any more: `refused_on` only lists resources held by others.
        let timer = Timer::Lease {
            project: project.to_owned(),
            resource: resource.to_owned(),
        };
        retime(&mut self.timers, None, Some(expires_at), timer);
        self.stats.claims_acquired += 1;
        Ok(Claim::Acquired {
            fence,
            expires_in: ttl,
            reentrant: false,
            ttl_clamped,
        })
    }

    /// Renews the caller's live lease, keeping its fence (`ttl: None`: the lease's own TTL).
    pub fn renew(
        &mut self,
        now: Instant,
        project: &str,
        agent: &str,
        resource: &str,
        ttl: Option<Duration>,
    ) -> Result<Renewed, CoordError> {
        self.handle_timeout(now);
        let l = &self.limits;
        check_name("resource", resource, l.max_name_len)?;
        let (ttl, ttl_clamped) = match ttl {
            Some(t) => {
                let (t, clamped) = grant_ttl("lease", Some(t), l.lease_ttl, l.lease_ttl_max)?;
                (Some(t), clamped)
            }
            None => (None, None),
        };
        self.touch(now, project, agent, None)?;
        self.check_holder(project, agent, resource)?;
        let view = self.renew_lease(now, project, resource, ttl)?;
        self.stats.renewals += 1;
        Ok(Renewed {
            fence: view.fence,
            expires_in: view.expires_in,
            ttl_clamped,
        })
    }

    /// Releases the caller's live lease.
    pub fn release(
        &mut self,
        now: Instant,
        project: &str,
        agent: &str,
        resource: &str,
    ) -> Result<Released, CoordError> {
        self.handle_timeout(now);
        check_name("resource", resource, self.limits.max_name_len)?;
        self.touch(now, project, agent, None)?;
        #[cfg(feature = "planted-bugs")]
        let anyone = self.planted(super::CoordBug::ReleaseByAnyone);
        #[cfg(not(feature = "planted-bugs"))]
        let anyone = false;
        match self.check_holder(project, agent, resource) {
            // The planted bug: a live lease is enough, whoever holds it.
            Err(CoordError::NotHolder {
                holder: Some(_), ..
            }) if anyone => {}
            checked => checked?,
        }
        let fence = self
            .end_lease(project, resource, End::Released)
            .expect("check_holder found the lease");
        #[cfg(feature = "planted-bugs")]
        if self.planted(super::CoordBug::FenceReusedAfterRelease) {
            if let Some(p) = self.projects.get_mut(project).filter(|p| p.fence == fence) {
                p.fence -= 1;
            }
        }
        Ok(Released { fence })
    }

    /// An operator ends whoever holds `resource`: the holder is told its lease was lost, and
    /// the project's fence counter is bumped so its in-flight writes fall below the next fence.
    pub fn force_release(
        &mut self,
        now: Instant,
        project: &str,
        resource: &str,
    ) -> Result<Released, CoordError> {
        self.handle_timeout(now);
        let no_lease = || CoordError::NoLease {
            resource: resource.to_owned(),
            expired: false,
        };
        self.changed(project);
        let p = self.projects.get_mut(project).ok_or_else(no_lease)?;
        if !p.leases.contains_key(resource) {
            return Err(no_lease());
        }
        p.fence = p.fence.saturating_add(1);
        let fence = self
            .end_lease(project, resource, End::Lost(LostReason::ForcedRelease))
            .ok_or_else(no_lease)?;
        Ok(Released { fence })
    }

    /// The live leases on `project`, by resource.
    pub fn claims(&mut self, now: Instant, project: &str) -> Vec<LeaseView> {
        self.handle_timeout(now);
        let Some(p) = self.projects.get(project) else {
            return Vec::new();
        };
        p.leases
            .iter()
            .filter(|(_, l)| now < l.expires_at)
            .map(|(resource, l)| LeaseView {
                resource: resource.clone(),
                holder: l.holder.clone(),
                holder_name: p.members.get(&l.holder).and_then(|m| m.name.clone()),
                fence: l.fence,
                expires_in: l.expires_at.saturating_duration_since(now),
            })
            .collect()
    }

    /// `agent`'s write to `resource` was refused ([`WriteCheck::Refused`]): like a refused
    /// claim, it makes the agent present on the project and its `wait` wakes when the resource
    /// is released (a `Released` reason, once).
    pub fn note_refused_write(
        &mut self,
        now: Instant,
        project: &str,
        agent: &str,
        resource: &str,
    ) -> Result<(), CoordError> {
        self.handle_timeout(now);
        check_name("resource", resource, self.limits.max_name_len)?;
        let held = self
            .projects
            .get(project)
            .and_then(|p| p.leases.get(resource))
            .is_some_and(|l| now < l.expires_at && l.holder != agent);
        if !held {
            return Ok(());
        }
        let m = self.touch(now, project, agent, None)?;
        m.refused_on.insert(resource.to_owned());
        m.released.remove(resource);
        let p = self
            .projects
            .get_mut(project)
            .expect("touch made the project");
        p.refused
            .entry(resource.to_owned())
            .or_default()
            .insert(agent.to_owned());
        Ok(())
    }

    /// May `agent` write `resource` now, and under which fence?
    pub fn check_write(
        &mut self,
        now: Instant,
        project: &str,
        agent: &str,
        resource: &str,
        required: bool,
    ) -> WriteCheck {
        self.handle_timeout(now);
        let p = self.projects.get(project);
        #[cfg(feature = "planted-bugs")]
        let inclusive = self.planted(super::CoordBug::LeaseExpiryInclusive);
        #[cfg(not(feature = "planted-bugs"))]
        let inclusive = false;
        match p
            .and_then(|p| p.leases.get(resource))
            .filter(|l| now < l.expires_at || (inclusive && now == l.expires_at))
        {
            Some(l) if l.holder == agent => WriteCheck::Fenced { fence: l.fence },
            Some(l) => WriteCheck::Refused {
                holder: l.holder.clone(),
                holder_name: p
                    .and_then(|p| p.members.get(&l.holder))
                    .and_then(|m| m.name.clone()),
                expires_in: l.expires_at.saturating_duration_since(now),
            },
            None if required => WriteCheck::LeaseRequired,
            None => WriteCheck::Unfenced,
        }
    }

    /// A sled reports the highest fence it has accepted: the next grant is above it.
    /// At the first report, leases granted before it (a restarted gateway whose agents came
    /// back before the sled) that are not above it get fresh fences above it, so that no
    /// fence the sled accepted is reissued and their holders' writes are not refused as stale.
    /// Returns the project's fence counter.
    pub fn raise_fence_floor(&mut self, project: &str, floor: u64) -> Result<u64, CoordError> {
        self.project_mut(project)?;
        self.changed(project);
        let p = self.project_mut(project)?;
        p.fence = p.fence.max(floor);
        if !std::mem::replace(&mut p.floor_known, true) {
            for lease in p.leases.values_mut().filter(|l| l.fence <= floor) {
                p.fence = next(p.fence, "fence")?;
                lease.fence = p.fence;
            }
            let refenced: Vec<String> = p
                .leases
                .iter()
                .filter(|(_, l)| l.fence > floor)
                .map(|(r, _)| r.clone())
                .collect();
            for resource in refenced {
                p.mark(Which::Lease(resource));
            }
        }
        Ok(p.fence)
    }

    /// The agent's lost leases not yet reported (in `project`, or everywhere), now reported.
    pub fn take_lost(
        &mut self,
        now: Instant,
        agent: &str,
        project: Option<&str>,
    ) -> Vec<LostLease> {
        self.handle_timeout(now);
        let mut lost = Vec::new();
        for (name, p) in &mut self.projects {
            if project.is_some_and(|want| want != name) {
                continue;
            }
            if let Some(m) = p.members.get_mut(agent) {
                lost.extend(m.lost.drain(..));
            }
        }
        lost
    }

    fn leases_held_by(&self, agent: &str) -> usize {
        let Some(projects) = self.agents.get(agent) else {
            return 0;
        };
        projects
            .iter()
            .filter_map(|p| self.projects.get(p)?.members.get(agent))
            .map(|m| m.held.len())
            .sum()
    }

    /// `Ok` if `agent` holds a live lease on `resource`; else why not.
    fn check_holder(&self, project: &str, agent: &str, resource: &str) -> Result<(), CoordError> {
        let p = self.projects.get(project);
        match p.and_then(|p| p.leases.get(resource)) {
            Some(l) if l.holder == agent => Ok(()),
            Some(l) => Err(CoordError::NotHolder {
                resource: resource.to_owned(),
                holder: Some(l.holder.clone()),
            }),
            None => Err(CoordError::NoLease {
                resource: resource.to_owned(),
                expired: p
                    .and_then(|p| p.members.get(agent))
                    .is_some_and(|m| m.expired.iter().any(|r| r == resource)),
            }),
        }
    }

    /// Renews a lease from `now`, for `ttl` or its own TTL, keeping its fence.
    pub(super) fn renew_lease(
        &mut self,
        now: Instant,
        project: &str,
        resource: &str,
        ttl: Option<Duration>,
    ) -> Result<LeaseView, CoordError> {
        let missing = || CoordError::NoLease {
            resource: resource.to_owned(),
            expired: false,
        };
        self.entry_changed(project, Which::Lease(resource.to_owned()));
        let p = self.projects.get_mut(project).ok_or_else(missing)?;
        let lease = p.leases.get_mut(resource).ok_or_else(missing)?;
        let ttl = ttl.unwrap_or(lease.ttl);
        let expires_at = deadline("lease", now, ttl)?;
        lease.ttl = ttl;
        let old = std::mem::replace(&mut lease.expires_at, expires_at);
        let timer = Timer::Lease {
            project: project.to_owned(),
            resource: resource.to_owned(),
        };
        retime(&mut self.timers, Some(old), Some(expires_at), timer);
        Ok(LeaseView {
            resource: resource.to_owned(),
            holder: lease.holder.clone(),
            holder_name: p.members.get(&lease.holder).and_then(|m| m.name.clone()),
            fence: lease.fence,
            expires_in: ttl,
        })
    }

    /// Ends a lease: reports it lost to its holder when it is, turns the refusals on it into
    /// released notices, and wakes whoever that concerns. Returns its fence.
    pub(super) fn end_lease(&mut self, project: &str, resource: &str, how: End) -> Option<u64> {
        self.entry_changed(project, Which::Lease(resource.to_owned()));
        let p = self.projects.get_mut(project)?;
        let lease = p.leases.remove(resource)?;
        let timer = Timer::Lease {
            project: project.to_owned(),
            resource: resource.to_owned(),
        };
        retime(&mut self.timers, Some(lease.expires_at), None, timer);
        if let Some(m) = p.members.get_mut(&lease.holder) {
            m.held.remove(resource);
            if let End::Lost(reason) = how {
                if m.lost.len() >= MAX_PENDING {
                    m.lost.pop_front();
                }
                m.lost.push_back(LostLease {
                    project: project.to_owned(),
                    resource: resource.to_owned(),
                    fence: lease.fence,
                    reason,
                });
                if reason == LostReason::Expired {
                    if m.expired.len() >= self.limits.max_leases_per_agent {
                        m.expired.pop_front();
                    }
                    m.expired.push_back(resource.to_owned());
                }
            }
        }
        let refused = p.refused.remove(resource).unwrap_or_default();
        for agent in &refused {
            if let Some(m) = p.members.get_mut(agent) {
                m.refused_on.remove(resource);
                if m.released.len() < MAX_PENDING {
                    m.released.insert(resource.to_owned());
                }
            }
        }
        match how {
            End::Released | End::AgentEnded => self.stats.releases += 1,
            End::Lost(LostReason::Expired) => self.stats.expiries += 1,
            End::Lost(LostReason::ForcedRelease) => self.stats.forced += 1,
        }
        if matches!(how, End::Lost(_)) {
            self.wake(project, Some(&lease.holder));
        }
        for agent in &refused {
            self.wake(project, Some(agent));
        }
        Some(lease.fence)
    }
}
