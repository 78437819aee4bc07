//! News for the streams other replicas hold (issue 15): a client's stream (a session's GET
//! stream, a `subscriptions/listen` answer) stays on the replica it was opened on, while what
//! it must hear of may happen where a project's sled is.
//!
//! - **Tools** travel as state: a replica that holds a project's sled writes the project's
//!   tool listing to the engine's tools bucket after every refresh
//!   ([`ClusterAction::StoreTools`]); every replica follows the bucket
//!   ([`ClusterEvent::ToolsChanged`]) and keeps the listing of each project held elsewhere, so
//!   its stateless `tools/list` lists every live project of the cluster, and its sessions and
//!   listeners hear `tools/list_changed` when a listing changes or a project's sled comes to
//!   the cluster or leaves it (the directory's news).
//! - **Prompts and resources lists** travel as announcements ([`Announcement::ListChanged`]):
//!   each replica tells the sessions whose default the project is and its listeners of it.
//! - **Notifications for given sessions** (a subscribed resource's `resources/updated`, a
//!   coordination notice) made by a replica that does not hold the session's GET stream are
//!   announced ([`Announcement::ToSessions`]); the replica that holds the stream sends them.
//!
//! Announcements are not kept (a replica cut off from the engine misses them, as a client
//! whose stream was closed does); the tools bucket is, so a replica that starts late or comes
//! back from an outage catches up from its watch.
//!
//! [`ClusterAction::StoreTools`]: crate::cluster::ClusterAction::StoreTools
//! [`ClusterEvent::ToolsChanged`]: crate::cluster::ClusterEvent::ToolsChanged

use crate::cluster::{Announcement, ClusterAction};

use super::*;

impl Gateway {
    /// Whether this replica hears of `project` through the cluster: it is registered, and its
    /// sled is on another replica (or nowhere) rather than here.
    fn hears_of(&self, project: &str) -> bool {
        self.clustered() && self.registry.get(project).is_some() && !self.is_live(project)
    }

    /// The tools another replica lists for `project`, when its sled is held there.
    pub(super) fn remote_tools(&self, project: &str) -> Option<&[CachedTool]> {
        self.held_elsewhere(project)?;
        self.remote_tools.get(project).map(Vec::as_slice)
    }

    /// A refresh of a local sled's tools completed: its listing goes to the tools bucket.
    pub(super) fn store_tools(&mut self, project: &str, raw: &[Value]) {
        if !self.clustered() {
            return;
        }
        let listing = serde_json::to_string(raw).expect("a JSON value serialises");
        self.cluster_output(ClusterAction::StoreTools {
            project: project.to_owned(),
            listing,
        });
    }

    /// The tools bucket's news of `project`: the copy of its listing is replaced, and the
    /// streams held here are told when what they list changed.
    pub(super) fn tools_changed_elsewhere(&mut self, project: &str, listing: Option<String>) {
        if !self.hears_of(project) {
            return;
        }
        #[cfg(feature = "planted-bugs")]
        if self.config.planted == Some(PlantedBug::IgnoreRemoteTools) {
            return;
        }
        let tools = match listing.map(|text| serde_json::from_str::<Vec<Value>>(&text)) {
            Some(Ok(raw)) => Some(tools::prepare_sled_tools(project, raw)),
            Some(Err(e)) => {
                tracing::warn!(project, error = %e, "an unreadable tool listing in the cluster; ignored");
                return;
            }
            None => None,
        };
        let old = match tools {
            Some(ts) => self.remote_tools.insert(project.to_owned(), ts),
            None => self.remote_tools.remove(project),
        };
        let changed = old.as_ref() != self.remote_tools.get(project);
        if changed && self.held_elsewhere(project).is_some() {
            self.tools_changed_here(project);
        }
    }

    /// `project`'s sled came to another replica or left the cluster (a directory write
    /// changed whether another replica holds it): what listings show of it changed.
    pub(super) fn holder_news(&mut self, project: &str) {
        if !self.hears_of(project) {
            return;
        }
        if self.remote_tools.contains_key(project) {
            self.tools_changed_here(project);
        }
    }

    /// Tells the streams held here that `project`'s tools changed.
    fn tools_changed_here(&mut self, project: &str) {
        self.modern_listing = None;
        self.notify_tools_changed(project);
        self.notify_listeners_tools_changed();
    }

    /// A prompts or resources list of `project`'s sled (here) changed: the other replicas are
    /// told, for the sessions and listeners whose streams they hold.
    pub(super) fn announce_list_changed(&mut self, project: &str, method: &str) {
        if self.clustered() {
            self.cluster_output(ClusterAction::Announce(Announcement::ListChanged {
                project: project.to_owned(),
                method: method.to_owned(),
            }));
        }
    }

    /// Another replica's announcement.
    pub(super) fn announced(&mut self, news: Announcement) {
        match news {
            Announcement::ListChanged { project, method } => {
                if !self.hears_of(&project) {
                    return;
                }
                match method.as_str() {
                    "notifications/prompts/list_changed"
                    | "notifications/resources/list_changed" => {
                        self.notify_default_sessions(&project, &method);
                        self.notify_listeners_list_changed(&project, &method);
                    }
                    _ => tracing::debug!(
                        project,
                        method,
                        "an announcement of an unknown list; ignored"
                    ),
                }
            }
            Announcement::ToSessions { sessions, data } => {
                // One SSE event's data: one line of JSON, and a notification: an announcement
                // never carries a request (whose answer would go to whoever made it up) nor an
                // answer (to a request the session never made).
                let one_line = !data.contains(['\n', '\r']);
                if !one_line || !is_notification(&data) {
                    tracing::debug!(
                        "an announced message that is not a notification on one line; ignored"
                    );
                    return;
                }
                for s in sessions {
                    if self.sessions.get(&s).is_some_and(|s| s.stream.is_some()) {
                        self.notify_session(&s, data.clone());
                    }
                }
            }
        }
    }
}

/// Whether `data` is a JSON-RPC notification: an object with a `method` and no `id` at all.
fn is_notification(data: &str) -> bool {
    match serde_json::from_str::<serde_json::Value>(data) {
        Ok(serde_json::Value::Object(m)) => {
            m.get("method").is_some_and(|v| v.is_string()) && !m.contains_key("id")
        }
        _ => false,
    }
}
