//! The ENFORCED and BLOCKED columns of `kubectl lock list`: what the lock's status and its
//! events say about it.
//!
//! ENFORCED is the number of instances in `status.enforcedBy` for the lock's current
//! generation (`-`: no instance has reported it). BLOCKED is the number of refusals recorded
//! as `Blocked` events regarding the lock (the sum of their series counts), as far back as the
//! API server keeps events (`--event-ttl`, 1 h by default).

use std::collections::HashMap;

use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

use crate::events::{BLOCKED, REPORTING_CONTROLLER};

/// ENFORCED: instances enforcing the lock's current generation; `-` without any status.
pub(super) fn enforced(lock: &DynamicObject) -> String {
    let generation = lock.metadata.generation.unwrap_or(0);
    match lock.data["status"]["enforcedBy"].as_array() {
        None if lock.data["status"]["enforcedCount"].is_null() => "-".to_owned(),
        None => "0".to_owned(),
        Some(entries) => entries
            .iter()
            .filter(|e| e["observedGeneration"].as_i64().unwrap_or(0) >= generation)
            .count()
            .to_string(),
    }
}

/// Refusal counts by the uid of the lock they regard.
#[derive(Debug, Default)]
pub(super) struct Blocked {
    by_uid: HashMap<String, i64>,
}

impl Blocked {
    /// Reads the Blocked events in `namespace` (every namespace when `None`).
    pub(super) async fn read(
        client: &kube::Client,
        namespace: Option<&str>,
    ) -> Result<Blocked, kube::Error> {
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource()),
            None => Api::all_with(client.clone(), &resource()),
        };
        let params = ListParams::default().fields(&format!(
            "reason={BLOCKED},reportingController={REPORTING_CONTROLLER}"
        ));
        let mut blocked = Blocked::default();
        for event in api.list(&params).await?.items {
            blocked.add(&event.data);
        }
        Ok(blocked)
    }

    /// Counts one event (`series.count`, else 1) for the lock it regards.
    pub(super) fn add(&mut self, event: &Value) {
        let Some(uid) = event["regarding"]["uid"].as_str().filter(|u| !u.is_empty()) else {
            return;
        };
        let count = event["series"]["count"].as_i64().unwrap_or(1).max(1);
        *self.by_uid.entry(uid.to_owned()).or_default() += count;
    }

    /// Adds the counts of `other`.
    pub(super) fn merge(&mut self, other: Blocked) {
        for (uid, count) in other.by_uid {
            *self.by_uid.entry(uid).or_default() += count;
        }
    }

    /// BLOCKED for `lock`.
    pub(super) fn of(&self, lock: &DynamicObject) -> String {
        let uid = lock.metadata.uid.as_deref().unwrap_or_default();
        self.by_uid.get(uid).copied().unwrap_or(0).to_string()
    }
}

fn resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "events.k8s.io".to_owned(),
        version: "v1".to_owned(),
        api_version: "events.k8s.io/v1".to_owned(),
        kind: "Event".to_owned(),
        plural: "events".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lock(generation: i64, status: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
            "metadata": {"name": "web", "namespace": "prod", "uid": "u-1", "generation": generation},
            "status": status,
        }))
        .expect("an object")
    }

    #[test]
    fn enforced_counts_current_entries() {
        let entry = |g: i64| json!({"instance": "cp", "observedGeneration": g, "since": "2026-01-01T00:00:00Z"});
        assert_eq!(enforced(&lock(1, Value::Null)), "-");
        assert_eq!(enforced(&lock(1, json!({"enforcedCount": 0}))), "0");
        assert_eq!(
            enforced(&lock(2, json!({"enforcedBy": [entry(2), entry(1)]}))),
            "1"
        );
    }

    #[test]
    fn blocked_sums_series_by_uid() {
        let mut blocked = Blocked::default();
        blocked.add(&json!({"regarding": {"uid": "u-1"}, "series": {"count": 57}}));
        blocked.add(&json!({"regarding": {"uid": "u-1"}}));
        blocked.add(&json!({"regarding": {"uid": "u-2"}, "series": {"count": 3}}));
        blocked.add(&json!({"regarding": {}}));
        assert_eq!(blocked.of(&lock(1, Value::Null)), "58");
        let mut other = Blocked::default();
        other.add(&json!({"regarding": {"uid": "u-1"}}));
        blocked.merge(other);
        assert_eq!(blocked.of(&lock(1, Value::Null)), "59");
    }
}
