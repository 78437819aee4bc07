//! Who may do what (`[[access]]`, [`crate::rights`]): the decisions on the caller of the request
//! being handled.
//!
//! The caller is set by [`Gateway::on_http`] from the request's credentials before anything
//! else runs, and requests are handled one at a time, so every decision made while handling a
//! request is about that request's caller. Decisions made later (a sled's answer, a timer) are
//! about the call they belong to, which was checked when it was made.
//!
//! A project the caller has no right on is invisible to it: it is left out of every listing,
//! and naming it is answered exactly as naming a project that is not registered. A project it
//! may see but lacks the right for is refused with `forbidden`, naming the project and the
//! right.

use super::*;
use crate::auth::Identity;
use crate::rights::{Caller as RuleCaller, Right};

impl Gateway {
    /// The caller's right on `project`, if any.
    pub(super) fn right_on(&self, project: &str) -> Option<Right> {
        let rules = self.registry.rules();
        if rules.is_open() {
            return Some(Right::Admin);
        }
        let token_name = match &self.caller {
            Identity::ClientToken(i) => self.registry.client_token_name(*i),
            Identity::Anonymous | Identity::Token(_) => None,
        };
        rules.right(&RuleCaller::new(&self.caller, token_name), project)
    }

    /// Whether the caller may see `project` at all (it has some right on it).
    pub(super) fn sees(&self, project: &str) -> bool {
        self.right_on(project).is_some()
    }

    /// The registered projects the caller may see, in file order.
    pub(super) fn visible_projects(&self) -> Vec<String> {
        #[cfg(feature = "planted-bugs")]
        let all = self.config.planted == Some(PlantedBug::HiddenProjectsListed);
        #[cfg(not(feature = "planted-bugs"))]
        let all = false;
        self.registry
            .names()
            .filter(|p| all || self.sees(p))
            .map(str::to_owned)
            .collect()
    }

    /// `Ok` when the caller has `need` on `project`; else `forbidden`, or, when it may not see
    /// the project at all, the answer for an unregistered one.
    pub(super) fn require(
        &self,
        project: &str,
        need: Right,
        what: std::fmt::Arguments<'_>,
    ) -> Result<(), RpcError> {
        match self.right_on(project) {
            Some(r) if r >= need => Ok(()),
            #[cfg(feature = "planted-bugs")]
            Some(_) if self.config.planted == Some(PlantedBug::RightsIgnoreReadOnly) => Ok(()),
            Some(_) => {
                let what = what.to_string();
                tracing::info!(
                    target: "audit",
                    principal = self.principal_label(),
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
                registered: self.visible_projects(),
            }),
        }
    }

    /// The caller, for audit lines: never a token.
    pub(super) fn principal_label(&self) -> String {
        match &self.caller {
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

    /// What a project that asks for it (`forward_principal`) learns of the caller, for the
    /// forwarded request's `_meta`.
    pub(super) fn principal_meta(&self) -> Option<Value> {
        match &self.caller {
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
