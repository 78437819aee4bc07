//! Who may send a body to `/mcp`, decided before it is read.
//!
//! The request's bearer token (a client token, or an OAuth access token the resource server
//! verified) is checked in the request's own task, against the registry in force, by the
//! core's own rule ([`gateway_core::auth::authenticate`]): one place still decides who the
//! caller is. A request refused here is answered at once, without its body being read and
//! without ever reaching the driver, so a flood of unauthenticated requests costs neither
//! memory nor the single driver's time. The core checks again what reaches it (a reload may
//! fall in between); the two agree, being the same function on the same file.
//!
//! The registry is a snapshot, swapped whole on reload (`reload.rs` calls
//! [`Admission::follow`] before the core gets the new file).

use std::sync::{Arc, RwLock};

use gateway_core::{AccessToken, HttpError, Registry};

/// The registry requests are admitted by.
#[derive(Debug)]
pub(crate) struct Admission {
    registry: RwLock<Arc<Registry>>,
}

impl Admission {
    pub(crate) fn new(registry: &Registry) -> Admission {
        Admission {
            registry: RwLock::new(Arc::new(registry.clone())),
        }
    }

    /// Follows a reloaded projects.toml.
    pub(crate) fn follow(&self, registry: &Registry) {
        let next = Arc::new(registry.clone());
        *self.registry.write().unwrap_or_else(|e| e.into_inner()) = next;
    }

    /// Lets a request with this `Authorization` header (and what the OAuth resource server
    /// made of it) in, or refuses it with the answer the core would give.
    pub(crate) fn check(
        &self,
        authorization: Option<&str>,
        access_token: &AccessToken,
    ) -> Result<(), HttpError> {
        gateway_core::auth::authenticate(&self.snapshot(), authorization, access_token, false)
            .map(drop)
    }

    fn snapshot(&self) -> Arc<Registry> {
        self.registry
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::{ProjectSpec, Secret};

    fn open() -> Registry {
        Registry::from_projects(vec![ProjectSpec::new("alpha", "http://a.invalid")], None).unwrap()
    }

    #[test]
    fn a_request_is_refused_by_the_registry_in_force_and_a_reload_is_followed() {
        let admission = Admission::new(&open());
        assert!(admission.check(None, &AccessToken::Unchecked).is_ok());
        let with_tokens = open().with_client_tokens(vec![Secret::new("client-token-0123456789")]);
        admission.follow(&with_tokens);
        assert!(matches!(
            admission.check(None, &AccessToken::Unchecked),
            Err(HttpError::Unauthorized {
                presented: false,
                ..
            })
        ));
        assert!(matches!(
            admission.check(
                Some("Bearer wrong-token-0123456789"),
                &AccessToken::Unchecked
            ),
            Err(HttpError::Unauthorized {
                presented: true,
                ..
            })
        ));
        assert!(admission
            .check(
                Some("Bearer client-token-0123456789"),
                &AccessToken::Unchecked
            )
            .is_ok());
    }
}
