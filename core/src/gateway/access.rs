//! Who may do what (`[[access]]`, [`crate::rights`]): the decisions on a request's principal.
//!
//! The principal is proved by [`Gateway::on_http`] from the request's credentials before
//! anything else runs, and travels down the request path in its [`Req`]; every decision here
//! takes it as an argument. Decisions made later (a sled's answer, a timer) have no principal
//! to ask about: they are about the call they belong to, which was checked when it was made.
//!
//! A project the caller has no right on is invisible to it: it is left out of every listing,
//! and naming it is answered exactly as naming a project that is not registered. A project it
//! may see but lacks the right for is refused with `forbidden`, naming the project and the
//! right.

use super::*;
use crate::auth::Identity;
use crate::rights::{Caller as RuleCaller, Right};

impl Gateway {
    /// `who`'s right on `project`, if any.
    pub(super) fn right_on(&self, who: &Identity, project: &str) -> Option<Right> {
        let rules = self.registry.rules();
        if rules.is_open() {
            return Some(Right::Admin);
        }
        let token_name = match who {
            Identity::ClientToken(i) => self.registry.client_token_name(*i),
            Identity::Anonymous | Identity::Token(_) => None,
        };
        rules.right(&RuleCaller::new(who, token_name), project)
    }

    /// Whether `who` may see `project` at all (it has some right on it).
    pub(super) fn sees(&self, who: &Identity, project: &str) -> bool {
        self.right_on(who, project).is_some()
    }

    /// Whether what `holder` set up on `project` earlier (a subscription, a listener, a parked
    /// `wait`, a session's notices and list changes) may still reach it: the holder is still
    /// let in, and still sees the project under the rules in force. Each delivery and each
    /// reload asks, so a reload that takes a project away ends them (security review finding
    /// 14); what a request does now is decided on its own principal, as always.
    pub(super) fn holder_sees(&self, holder: &crate::auth::Holder, project: &str) -> bool {
        #[cfg(feature = "planted-bugs")]
        if self.config.planted == Some(PlantedBug::RightsCheckedOnlyAtSetUp) {
            return true;
        }
        holder
            .identity(&self.registry)
            .is_some_and(|who| self.sees(&who, project))
    }

    /// The registered projects `who` may see, in file order (all of them without
    /// `[[access]]`).
    pub(super) fn visible_projects(&self, who: &Identity) -> Vec<String> {
        #[cfg(feature = "planted-bugs")]
        let all = self.config.planted == Some(PlantedBug::HiddenProjectsListed);
        #[cfg(not(feature = "planted-bugs"))]
        let all = false;
        self.registry
            .names()
            .filter(|p| all || self.sees(who, p))
            .map(str::to_owned)
            .collect()
    }

    /// The right calling `project`'s tool `tool` needs: `read` for a tool the project's
    /// `read_only_tools` covers (its list, or the sled's `readOnlyHint` where the project says
    /// `trust_read_only_hints`), `write` for any other, unlisted ones too.
    pub(super) fn right_for_tool(&self, project: &str, tool: &str) -> Right {
        let annotated = self
            .projects
            .get(project)
            .and_then(|s| s.tools.as_deref())
            .and_then(|ts| ts.iter().find(|t| t.name == tool))
            .is_some_and(|t| t.read_only);
        let covered = self
            .registry
            .get(project)
            .is_some_and(|(_, spec)| spec.read_only_tools.covers(tool, annotated));
        if covered {
            Right::Read
        } else {
            Right::Write
        }
    }

    /// `Ok` when `who` has `need` on `project`; else `forbidden`, or, when it may not see
    /// the project at all, the answer for an unregistered one.
    pub(super) fn require(
        &self,
        who: &Identity,
        project: &str,
        need: Right,
        what: std::fmt::Arguments<'_>,
    ) -> Result<(), RpcError> {
        match self.right_on(who, project) {
            Some(r) if r >= need => Ok(()),
            #[cfg(feature = "planted-bugs")]
            Some(_) if self.config.planted == Some(PlantedBug::RightsIgnoreReadOnly) => Ok(()),
            Some(_) => {
                let what = what.to_string();
                tracing::info!(
                    target: "audit",
                    principal = self.principal_label(who),
                    project,
                    what,
                    right = need.name(),
                    outcome = "forbidden",
                    "refused: the caller lacks the right"
                );
                Err(RpcError::Forbidden {
                    project: project.to_owned(),
                    right: need.name(),
                    what,
                })
            }
            None => Err(RpcError::UnknownProject {
                project: project.to_owned(),
                registered: self.visible_projects(who),
            }),
        }
    }

    /// `who`, for audit lines: never a token.
    pub(super) fn principal_label(&self, who: &Identity) -> String {
        match who {
            Identity::Anonymous => "anonymous".into(),
            Identity::ClientToken(i) => format!(
                "token:{}",
                self.registry.client_token_name(*i).unwrap_or("?")
            ),
            Identity::Token(p) => match &p.client_id {
                Some(c) => format!("oauth:{} client:{c}", p.subject),
                None => format!("oauth:{}", p.subject),
            },
        }
    }

    /// What a project that asks for it (`forward_principal`) learns of `who`, for the
    /// forwarded request's `_meta`.
    pub(super) fn principal_meta(&self, who: &Identity) -> Option<Value> {
        match who {
            Identity::Anonymous => None,
            Identity::ClientToken(i) => Some(json!({
                "token": self.registry.client_token_name(*i),
            })),
            Identity::Token(p) => Some(json!({
                "issuer": p.issuer,
                "subject": p.subject,
                "client_id": p.client_id,
            })),
        }
    }
}
