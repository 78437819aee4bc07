//! Tasks the gateway runs itself (issue 27): `aggregate_pipeline_status` as a task. Its id
//! names [`tasks::GATEWAY_PROJECT`] and, in a cluster, the replica that runs it (a `tasks/*`
//! naming one on another replica is relayed there); its record is kept like a sled task's
//! (`crate::tasks`), with its times, its result and why it ended, so a task finished before a
//! restart still answers after it, and one running then answers `failed`.

use super::tasks::modern_task;
use super::*;
use crate::tasks::{self, Own, Sealed, Status};

/// How often a client is asked to poll a task the gateway runs.
const POLL_INTERVAL_MS: u64 = 1_000;

impl Gateway {
    /// `tasks/*` naming a task of the gateway's own: answered here (relayed first to the
    /// replica that runs it, in a cluster).
    pub(super) fn own_task_request(
        &mut self,
        req: &Req<'_>,
        id: &RawId,
        method: &str,
        sealed: &Sealed,
        modern: bool,
    ) -> Result<Served, RpcError> {
        let unknown = || RpcError::UnknownTask {
            method: method.to_owned(),
        };
        if let Some((replica, _)) = sealed.sled_id.split_once('.') {
            if Some(replica) != self.replica_name() {
                if req.relayed || self.replica_name().is_none() {
                    return Err(unknown());
                }
                return Ok(Served::Away(Away::Relay {
                    project: tasks::GATEWAY_PROJECT.to_owned(),
                    replica: replica.to_owned(),
                }));
            }
        }
        let task_id = sealed.sled_id.as_str();
        let Some(status) = self
            .tasks
            .get(tasks::GATEWAY_PROJECT, task_id)
            .map(|r| r.status)
        else {
            return Err(unknown());
        };
        match method {
            "tasks/update" => Ok(Served::Now("{}".to_owned())),
            "tasks/get" => {
                let task = own_task_json(&self.tasks, task_id).ok_or_else(unknown)?;
                let task = if modern {
                    own_modern(&self.tasks, task_id, task)
                } else {
                    task
                };
                Ok(Served::Now(Value::Object(task).to_string()))
            }
            "tasks/result" if !status.is_terminal() => {
                self.own_waiters
                    .entry(task_id.to_owned())
                    .or_default()
                    .push((req.token, id.clone()));
                Ok(Served::Later)
            }
            "tasks/result" => own_result(&self.tasks, task_id).map(Served::Now),
            _ if status.is_terminal() => Err(RpcError::InvalidParams {
                method: method.to_owned(),
                detail: format!(
                    "the task is already {}: only a task still running can be cancelled",
                    status.name()
                ),
            }),
            _ => {
                self.cancel_task_fanout(task_id);
                self.own_task_done(
                    req.now,
                    task_id,
                    Err((Status::Cancelled, "cancelled by its caller".into())),
                );
                if modern {
                    return Ok(Served::Now("{}".to_owned()));
                }
                let task = own_task_json(&self.tasks, task_id).ok_or_else(unknown)?;
                Ok(Served::Now(Value::Object(task).to_string()))
            }
        }
    }

    /// The caller's tasks of the gateway's own, as `tasks/list` shows them.
    pub(super) fn own_tasks_of(&self, creator: &tasks::Creator) -> Vec<Value> {
        self.tasks
            .mine(creator)
            .into_iter()
            .filter(|(p, _)| *p == tasks::GATEWAY_PROJECT)
            .filter_map(|(_, id)| own_task_json(&self.tasks, id).map(Value::Object))
            .collect()
    }
}

/// A task of the gateway's own, as `tasks/get` shows it (2025-11-25), with the id its
/// creator knows.
pub(super) fn own_task_json(tasks: &crate::tasks::Tasks, id: &str) -> Option<Map<String, Value>> {
    let record = tasks.get(tasks::GATEWAY_PROJECT, id)?;
    let own = record.own.as_deref()?;
    let shown = tasks.seal(
        &Sealed {
            project: tasks::GATEWAY_PROJECT.to_owned(),
            sled_id: id.to_owned(),
            right: record.right,
        },
        &record.creator,
    );
    let ttl = record.expires.saturating_duration_since(record.created);
    let mut t = Map::new();
    t.insert("taskId".into(), Value::String(shown));
    t.insert("status".into(), json!(record.status.name()));
    if let Some(m) = &own.message {
        t.insert("statusMessage".into(), json!(m));
    }
    t.insert("createdAt".into(), json!(iso8601(own.created_ms)));
    t.insert("lastUpdatedAt".into(), json!(iso8601(own.updated_ms)));
    t.insert(
        "ttl".into(),
        json!(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
    );
    t.insert("pollInterval".into(), json!(POLL_INTERVAL_MS));
    Some(t)
}

/// A 2026-07-28 `DetailedTask` of a task of the gateway's own: the result or error inlined
/// once it has one.
pub(super) fn own_modern(
    tasks: &crate::tasks::Tasks,
    id: &str,
    task: Map<String, Value>,
) -> Map<String, Value> {
    let mut t = modern_task(task);
    let Some(record) = tasks.get(tasks::GATEWAY_PROJECT, id) else {
        return t;
    };
    match (record.status, record.own.as_deref()) {
        (
            Status::Completed,
            Some(Own {
                result: Some(r), ..
            }),
        ) => {
            if let Ok(v) = serde_json::from_str::<Map<String, Value>>(r) {
                t.insert("result".into(), super::tasks::modern_tool_result(v));
            }
        }
        (Status::Failed, Some(own)) => {
            t.insert(
                "error".into(),
                json!({
                    "code": crate::error::code::INTERNAL_ERROR,
                    "message": own.message.clone().unwrap_or_default(),
                }),
            );
        }
        _ => {}
    }
    t
}

/// `tasks/result` of a task of the gateway's own that ended.
pub(super) fn own_result(tasks: &crate::tasks::Tasks, id: &str) -> Result<String, RpcError> {
    let Some(record) = tasks.get(tasks::GATEWAY_PROJECT, id) else {
        return Err(RpcError::UnknownTask {
            method: "tasks/result".into(),
        });
    };
    let own = record.own.as_deref();
    match (record.status, own) {
        (
            Status::Completed,
            Some(Own {
                result: Some(r), ..
            }),
        ) => {
            let mut v: Map<String, Value> = serde_json::from_str(r).unwrap_or_default();
            let shown = tasks.seal(
                &Sealed {
                    project: tasks::GATEWAY_PROJECT.to_owned(),
                    sled_id: id.to_owned(),
                    right: record.right,
                },
                &record.creator,
            );
            v.insert(
                "_meta".into(),
                json!({ tasks::RELATED_TASK: { "taskId": shown } }),
            );
            Ok(Value::Object(v).to_string())
        }
        (status, own) => Err(RpcError::TaskEnded {
            status: status.name(),
            message: own.and_then(|o| o.message.clone()).unwrap_or_default(),
        }),
    }
}

impl Gateway {
    /// A `tasks/result` waiting for one of the gateway's own tasks, whose client went away:
    /// forgotten at once rather than answered when the fan-out ends. Whether it was one.
    pub(super) fn own_wait_aborted(&mut self, token: HttpToken) -> bool {
        let mut found = false;
        self.own_waiters.retain(|_, waiting| {
            let before = waiting.len();
            waiting.retain(|(t, _)| *t != token);
            found |= waiting.len() != before;
            !waiting.is_empty()
        });
        found
    }
}

/// Milliseconds since the Unix epoch as an RFC 3339 UTC timestamp with milliseconds.
fn iso8601(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(at).to_string()
}
