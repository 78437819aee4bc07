//! Leases enforced on project writes: a write to a resource a sled declared leasable is
//! refused while another agent holds it, and fenced when the caller does.

use super::*;

impl Gateway {
    /// The lease annotation of `tool` as `project`'s sled last listed it. Before any listing
    /// in this gateway's life, a call cannot be checked: while the project has live leases, or
    /// when it requires them (`leases = "required"`: a write nobody holds must be refused, and
    /// only the listing says which calls write), it must wait for the listing (`None`) rather
    /// than be sent unchecked.
    #[allow(clippy::option_option)]
    pub(in crate::gateway) fn remembered_lease(
        &mut self,
        now: Instant,
        project: &str,
        tool: &str,
    ) -> Option<Option<LeaseSpot>> {
        match self
            .projects
            .get(project)
            .and_then(|p| p.leases_known.as_ref())
        {
            Some(known) => Some(known.get(tool).cloned()),
            None if self
                .registry
                .get(project)
                .is_some_and(|(_, spec)| spec.leases_required) =>
            {
                None
            }
            None if self.coordination.coord.claims(now, project).is_empty() => Some(None),
            None => None,
        }
    }

    /// The lease check of a project tool call that writes `resource`: the fence to attach,
    /// or the refusal.
    pub(in crate::gateway) fn check_lease(
        &mut self,
        now: Instant,
        agent: Option<&str>,
        project: &str,
        resource: &str,
    ) -> Result<Option<u64>, RpcError> {
        let required = self
            .registry
            .get(project)
            .is_some_and(|(_, spec)| spec.leases_required);
        match self.coordination.coord.check_write(
            now,
            project,
            agent.unwrap_or(""),
            resource,
            required,
        ) {
            WriteCheck::Fenced { fence } => Ok(Some(fence)),
            WriteCheck::Unfenced => Ok(None),
            WriteCheck::Refused {
                holder,
                holder_name,
                expires_in,
            } => {
                if let Some(agent) = agent {
                    // Its `wait` wakes when the resource is released.
                    if let Err(e) = self
                        .coordination
                        .coord
                        .note_refused_write(now, project, agent, resource)
                    {
                        tracing::debug!(project, resource, "refused write not noted: {e}");
                    }
                }
                Err(RpcError::LeaseHeld {
                    project: project.to_owned(),
                    resource: resource.to_owned(),
                    holder,
                    holder_name,
                    expires_in,
                })
            }
            WriteCheck::LeaseRequired => Err(RpcError::LeaseRequired {
                project: project.to_owned(),
                resource: resource.to_owned(),
            }),
        }
    }
}
