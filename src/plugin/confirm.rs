//! `kubectl lock` waits until the new lock is in force: an instance reports it in the lock's
//! status, and a server-side dry run of the guarded operation is refused by it (status alone for
//! Warn, missing objects, and CREATE or CONNECT only).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};

use super::error::{detail, status_code};
use super::{Cluster, PluginError, Target};
use crate::api::{LockKey, LockMode, LockOperation, LockSpec};

const POLL: Duration = Duration::from_millis(250);

const NO_INSTANCE: &str = "no kube-object-lock instance has reported it as enforced (status.enforcedBy is empty): is the webhook running, and may it patch locks/status?";

/// The operation whose dry run must be refused: none for a Warn-mode lock; for CREATE or
/// CONNECT only, and for a lock on fields (which may let the probe's annotation through), the
/// status alone confirms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Probe {
    Delete,
    Update,
    None,
    Status,
}

impl Probe {
    pub(super) fn for_spec(spec: &LockSpec) -> Probe {
        let asks = |op| spec.operations().contains(&op);
        if spec.mode == Some(LockMode::Warn) {
            Probe::None
        } else if asks(LockOperation::Delete) {
            Probe::Delete
        } else if asks(LockOperation::Update)
            && spec.fields.is_none()
            && spec.except_fields.is_none()
        {
            Probe::Update
        } else {
            Probe::Status
        }
    }
}

/// Waits up to `timeout` for `lock` to be in force on `target`; how, for the `locked` line.
pub(super) async fn confirm(
    cluster: &Cluster,
    target: &Target,
    lock: &LockKey,
    probe: Probe,
    timeout: Duration,
) -> Result<String, PluginError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let pending = match lock.api(cluster.client.clone()).get(&lock.name).await {
            Ok(object) => match assess(&object, probe) {
                Assessment::Done(confirmed) => return Ok(confirmed),
                Assessment::Fatal(why) => return Err(not_in_force(lock, None, why)),
                Assessment::Pending(why) => why,
                Assessment::Try(n) => match try_refusal(cluster, target, lock, probe, n).await {
                    Ok(confirmed) => return Ok(confirmed),
                    Err(why) => why,
                },
            },
            Err(e) if status_code(&e) == Some(404) => {
                return Err(PluginError::Message(format!(
                    "{lock} was deleted while waiting for it to be in force: {}",
                    detail(&e)
                )));
            }
            Err(e) => format!(
                "the dry run could not be made: cannot read {lock}: {}",
                detail(&e)
            ),
        };
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return Err(not_in_force(lock, Some(timeout), pending));
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
    }
}

fn untried(n: usize) -> String {
    format!(" (enforced by {n}; not tried: the object does not exist)")
}

fn not_in_force(lock: &LockKey, waited: Option<Duration>, reason: String) -> PluginError {
    let waited =
        (waited.map(|w| format!(" after {}", humantime::format_duration(w)))).unwrap_or_default();
    PluginError::NotInForce(format!(
        "{lock} was created but is not in force{waited} (it stays; kubectl unlock removes it): {reason}"
    ))
}

/// What the lock's status says; `Try(n)`: enforced by `n` instances, try the dry run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Assessment {
    Done(String),
    Fatal(String),
    Pending(String),
    Try(usize),
}

pub(super) fn assess(object: &DynamicObject, probe: Probe) -> Assessment {
    let generation = object.metadata.generation.unwrap_or(0);
    let status = &object.data["status"];
    let conditions = status["conditions"].as_array().cloned().unwrap_or_default();
    let enforced = conditions.iter().find(|c| c["type"] == "Enforced");
    let reason = enforced.and_then(|c| c["reason"].as_str()).unwrap_or("");
    // The plugin cannot read the registration; the instances can, and say so in the status.
    if matches!(reason, "NotSentToWebhook" | "NamespaceNotSelected") {
        let message = enforced.and_then(|c| c["message"].as_str()).unwrap_or("");
        return Assessment::Fatal(format!("the webhook is never sent its objects: {message}"));
    }
    let current = |v: &&Value| v["observedGeneration"].as_i64().unwrap_or(0) >= generation;
    let instances = (status["enforcedBy"].as_array().into_iter().flatten())
        .filter(current)
        .count();
    if probe == Probe::None
        && instances == 0
        && reason == "WarnMode"
        && enforced.as_ref().is_some_and(current)
    {
        return Assessment::Done(
            " (seen by the webhook; mode Warn: changes are allowed with a warning)".to_owned(),
        );
    }
    match (instances, probe) {
        (0, _) => Assessment::Pending(NO_INSTANCE.to_owned()),
        (n, Probe::None) => Assessment::Done(untried(n)),
        (n, Probe::Status) => Assessment::Done(format!(
            " (enforced by {n}; not tried: no dry run shows CREATE or CONNECT)"
        )),
        (n, _) => Assessment::Try(n),
    }
}

/// Dry-runs the guarded operation: confirmed only when this lock refused it (or the object does
/// not exist), else why not.
async fn try_refusal(
    cluster: &Cluster,
    target: &Target,
    lock: &LockKey,
    probe: Probe,
    n: usize,
) -> Result<String, String> {
    let api = cluster.api(&target.resource.api_resource(), target.namespace.as_deref());
    let result = match probe {
        Probe::Delete => {
            let params = DeleteParams::default().dry_run();
            api.delete(&target.name, &params).await.map(|_| ())
        }
        _ => {
            let params = PatchParams::default().dry_run();
            // Never stored: a dry run.
            let patch = json!({ "metadata": { "annotations": {
                "objectlock.dev/lock-check": Timestamp::now().to_string() } } });
            api.patch(&target.name, &params, &Patch::Merge(&patch))
                .await
                .map(|_| ())
        }
    };
    match result {
        Ok(()) => Err(format!(
            "{n} instance(s) enforce it, but a dry run of the guarded operation was allowed: the namespace or resource is not sent to the webhook (check the ValidatingWebhookConfiguration), or the API server that answered calls an instance that has not seen the lock"
        )),
        Err(e) => classify(&e, lock, n),
    }
}

fn classify(error: &kube::Error, lock: &LockKey, n: usize) -> Result<String, String> {
    let message = detail(error);
    match status_code(error) {
        Some(404) => Ok(untried(n)),
        _ if names_lock(&message, &lock.to_string()) => Ok(format!(" (enforced by {n})")),
        _ if message.starts_with("admission webhook ") => Err(format!(
            "another admission webhook refused the dry run first, so it cannot show this lock: {message}"
        )),
        _ => Err(format!("the dry run could not be made: {message}")),
    }
}

/// Whether a refusal (`... is locked by Lock prod/web: reason; Lock prod/b (to unlock ...)`)
/// lists `lock` as a whole name.
fn names_lock(message: &str, lock: &str) -> bool {
    let Some((_, listed)) = message.split_once(" is locked by ") else {
        return false;
    };
    listed.match_indices(lock).any(|(at, _)| {
        let before = &listed[..at];
        let after = listed[at + lock.len()..].chars().next();
        (before.is_empty() || before.ends_with("; "))
            && after.is_none_or(|c| matches!(c, ':' | ';' | ' '))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(generation: i64, status: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
            "metadata": {"name": "web", "namespace": "prod", "generation": generation},
            "spec": {}, "status": status,
        }))
        .expect("an object")
    }

    #[test]
    fn status_decides_whether_to_try() {
        let entry = |g: i64| json!({"instance": "cp-1", "observedGeneration": g, "since": "2026-01-01T00:00:00Z"});
        let warn = json!({"conditions": [{"type": "Enforced", "status": "False", "reason": "WarnMode", "message": "m", "observedGeneration": 2}]});
        let excluded = json!({"conditions": [{"type": "Enforced", "status": "False", "reason": "NotSentToWebhook", "message": "namespace kube-system is left out"}]});
        let pending = Assessment::Pending(NO_INSTANCE.into());
        for (status, probe, want) in [
            (json!(null), Probe::Delete, pending.clone()),
            // An entry for an older generation does not count.
            (json!({"enforcedBy": [entry(1)]}), Probe::Delete, pending),
            (
                json!({"enforcedBy": [entry(2), entry(3)]}),
                Probe::Update,
                Assessment::Try(2),
            ),
            (
                json!({"enforcedBy": [entry(2)]}),
                Probe::None,
                Assessment::Done(untried(1)),
            ),
            (
                warn,
                Probe::None,
                Assessment::Done(
                    " (seen by the webhook; mode Warn: changes are allowed with a warning)".into(),
                ),
            ),
            (
                excluded,
                Probe::Delete,
                Assessment::Fatal(
                    "the webhook is never sent its objects: namespace kube-system is left out"
                        .into(),
                ),
            ),
        ] {
            assert_eq!(assess(&object(2, status.clone()), probe), want, "{status}");
        }
        // Not selected by the registration's namespaceSelector: never waited for either, even
        // with another instance's entry still there, nor as a Warn-mode lock.
        let message = "namespace dev is not selected by the webhook registration's namespaceSelector (lockable=true)";
        let unselected = json!({"enforcedBy": [entry(1)], "conditions": [{"type": "Enforced", "status": "False", "reason": "NamespaceNotSelected", "message": message, "observedGeneration": 1}]});
        for probe in [Probe::Delete, Probe::Update, Probe::None] {
            let Assessment::Fatal(why) = assess(&object(1, unselected.clone()), probe) else {
                panic!("{probe:?}: not fatal")
            };
            let error = not_in_force(&LockKey::lock("dev", "web"), None, why).to_string();
            assert!(
                error.contains("Lock dev/web") && error.contains("(lockable=true)"),
                "the refusal gives the reason: {error}"
            );
        }
    }

    #[test]
    fn only_a_refusal_by_this_lock_confirms() {
        let lock = LockKey::lock("prod", "web");
        let locked = "admission webhook \"namespaced.objectlock.dev\" denied the request: configmaps \"web\" in namespace \"prod\" is locked by";
        for (message, want) in [
            (
                format!("{locked} Lock prod/web: freeze (to unlock: kubectl delete lock web -n prod)"),
                "Ok(\" (enforced by 2)\")",
            ),
            (
                format!("{locked} Lock prod/a: x; Lock prod/web (to unlock: kubectl delete lock a web -n prod)"),
                "Ok(\" (enforced by 2)\")",
            ),
            (format!("{locked} Lock prod/web-selector"), "another admission webhook"),
            (
                "admission webhook \"policy.example.com\" denied the request: no".into(),
                "another admission webhook",
            ),
            (
                "configmaps \"web\" is forbidden: User \"bob\" cannot delete resource \"configmaps\""
                    .into(),
                "the dry run could not be made",
            ),
        ] {
            let status = kube::core::Status::failure(&message, "Forbidden").with_code(403);
            let tried = format!("{:?}", classify(&kube::Error::Api(status.boxed()), &lock, 2));
            assert!(tried.contains(want), "{message}: {tried}");
        }
    }
}
