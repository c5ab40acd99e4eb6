//! `kubectl lock list`: the Locks of a namespace (or all) and the ClusterLocks, with what each
//! covers, whether its target exists, how many instances enforce it and how many refusals its
//! `Blocked` events record.

use std::collections::{BTreeSet, HashMap};

use futures::StreamExt;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, ListParams};

use super::cli::{ConnectionArgs, ListArgs};
use super::discovery::Discovered;
use super::error::{detail, one_line, status_code};
use super::{Cluster, PluginError, Report, owner, spec};
use crate::api::{self, LockKind, LockSpec};
use crate::events::{BLOCKED, REPORTING_CONTROLLER};

const CONCURRENT_LOOKUPS: usize = 8;

pub(super) async fn list(
    connection: &ConnectionArgs,
    args: &ListArgs,
) -> Result<Report, PluginError> {
    let cluster = Cluster::connect(connection).await?;
    let namespace = (!args.all_namespaces).then(|| cluster.namespace(connection));
    let mut notes = vec![];
    let params = ListParams::default();
    let locks = cluster
        .api(&LockKind::Lock.api_resource(), namespace.as_deref())
        .list(&params)
        .await
        .map_err(|e| match &namespace {
            Some(ns) => cluster.failed(&e, format!("cannot list Locks in namespace \"{ns}\"")),
            None => cluster.failed(&e, "cannot list Locks"),
        })?;
    // Who may only read one namespace's Locks still gets them listed.
    let cluster_locks = match cluster
        .api(&LockKind::ClusterLock.api_resource(), None)
        .list(&params)
        .await
    {
        Ok(list) => list.items,
        Err(e) if namespace.is_some() && status_code(&e) == Some(403) => {
            notes.push(format!("ClusterLocks are not listed: {}", detail(&e)));
            vec![]
        }
        Err(e) => return Err(cluster.failed(&e, "cannot list ClusterLocks")),
    };
    let objects: Vec<DynamicObject> = locks.items.into_iter().chain(cluster_locks).collect();
    if objects.is_empty() {
        notes.push(match &namespace {
            Some(ns) => format!("no Locks in namespace \"{ns}\" and no ClusterLocks"),
            None => "no Locks and no ClusterLocks".to_owned(),
        });
        return Report::ok(String::new(), notes);
    }

    let specs: Vec<LockSpec> = (objects.iter().map(spec::read))
        .map(|(spec, note)| {
            notes.extend(note);
            spec
        })
        .collect();
    let groups: BTreeSet<String> = specs
        .iter()
        .filter_map(|spec| spec::single_resource(spec).map(|(group, _)| group))
        .collect();
    let discovered = match groups.is_empty() {
        true => Discovered::default(),
        false => cluster.discover(Some(&groups), false).await?,
    };
    let targets: Vec<&'static str> = futures::stream::iter(objects.iter().zip(&specs))
        .map(|(o, spec)| target_state(&cluster, &discovered, o, spec))
        .buffered(CONCURRENT_LOOKUPS)
        .collect()
        .await;

    let blocked = blocked(&cluster, namespace.as_deref(), &mut notes).await;

    let now = Timestamp::now();
    let header = "NAMESPACE NAME KIND COVERS OPERATIONS TARGET OWNER MODE ENFORCED BLOCKED EXPIRES HOLDER REASON";
    let skip = usize::from(!args.all_namespaces);
    let mut marked = false;
    let header = header.split(' ').skip(skip).map(str::to_owned).collect();
    let rows = (objects.iter().zip(&specs).zip(targets)).map(|((o, spec), target)| {
        let name = o.metadata.name.clone().unwrap_or_default();
        let namespace = o.metadata.namespace.as_deref();
        let uid = o.metadata.uid.as_deref().unwrap_or_default();
        let row = [
            namespace.unwrap_or("-").to_owned(),
            name.clone(),
            LockKind::for_namespace(namespace.unwrap_or(""))
                .as_str()
                .to_owned(),
            spec::describe_covers(&name, spec),
            spec::operations(spec),
            target.to_owned(),
            owners(o),
            match unenforced(o, spec) {
                true => {
                    marked = true;
                    UNENFORCED.to_owned()
                }
                false => format!("{:?}", spec.mode.unwrap_or_default()),
            },
            enforced(o),
            (blocked.as_ref()).map_or("-".to_owned(), |b| {
                b.get(uid).copied().unwrap_or(0).to_string()
            }),
            spec::time_left(spec, now),
            (spec.holder.as_ref()).map_or("-".to_owned(), spec::holder_cell),
            one_line(spec.reason.as_deref().unwrap_or_default()),
        ];
        // Every cell is the Lock's own text: a reason or holder may carry control characters.
        (row.into_iter().skip(skip))
            .map(|cell| api::escape(&cell).into_owned())
            .collect()
    });
    let rows: Vec<Vec<String>> = std::iter::once(header).chain(rows).collect();
    if marked {
        notes.push(format!(
            "locks marked {UNENFORCED} are not enforced: the webhook registration leaves out {}, and the namespaces its namespaceSelector does not select (status reason {NOT_SELECTED})",
            api::EXCLUDED_NAMESPACES.join(" and ")
        ));
    }
    Report::ok(table(&rows), notes)
}

/// Refusal counts by the uid of the lock they regard, from the events of `namespace` (all when
/// `None`) and of `default`, where ClusterLocks' are; `None` (with a note) when unreadable.
async fn blocked(
    cluster: &Cluster,
    namespace: Option<&str>,
    notes: &mut Vec<String>,
) -> Option<HashMap<String, i64>> {
    let mut namespaces = vec![namespace];
    if namespace.is_some_and(|ns| ns != "default") {
        namespaces.push(Some("default"));
    }
    let params = ListParams::default().fields(&format!(
        "reason={BLOCKED},reportingController={REPORTING_CONTROLLER}"
    ));
    let mut total = HashMap::new();
    for ns in namespaces {
        let api: Api<Event> = match ns {
            Some(ns) => Api::namespaced(cluster.client.clone(), ns),
            None => Api::all(cluster.client.clone()),
        };
        match api.list(&params).await {
            Ok(events) => count_blocked(&mut total, &events.items),
            Err(e) => {
                notes.push(format!(
                    "BLOCKED is not shown: cannot list events.events.k8s.io{}: {}",
                    ns.map(|ns| format!(" in namespace \"{ns}\""))
                        .unwrap_or_default(),
                    detail(&e)
                ));
                return None;
            }
        }
    }
    Some(total)
}

fn count_blocked(total: &mut HashMap<String, i64>, events: &[Event]) {
    for event in events {
        let uid = event.regarding.as_ref().and_then(|r| r.uid.clone());
        if let Some(uid) = uid.filter(|u| !u.is_empty()) {
            let count = event.series.as_ref().map_or(1, |s| s.count).max(1);
            *total.entry(uid).or_default() += i64::from(count);
        }
    }
}

/// ENFORCED: instances enforcing the lock's current generation; `-` without any status.
fn enforced(lock: &DynamicObject) -> String {
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

/// The MODE of a lock the webhook never hears of.
const UNENFORCED: &str = "unenforced";
const NOT_SELECTED: &str = "NamespaceNotSelected";

/// A lock in (or on) a namespace the registration leaves out, or whose status says its
/// namespace is not selected (the plugin cannot read the registration, the instances can).
fn unenforced(lock: &DynamicObject, spec: &LockSpec) -> bool {
    let conditions = lock.data["status"]["conditions"].as_array();
    let not_selected = (conditions.into_iter().flatten())
        .any(|c| c["type"] == "Enforced" && c["reason"] == NOT_SELECTED);
    not_selected
        || match lock.metadata.namespace.as_deref() {
            Some(ns) => api::is_excluded_namespace(ns),
            None => {
                let name = lock.metadata.name.as_deref().unwrap_or_default();
                api::is_excluded_namespace(name)
                    && spec::single_resource(spec)
                        .is_some_and(|(g, r)| g.is_empty() && r == "namespaces")
            }
        }
}

/// TARGET: `exists`, `missing`, or `-` when it cannot be told.
async fn target_state(
    cluster: &Cluster,
    discovered: &Discovered,
    lock: &DynamicObject,
    spec: &LockSpec,
) -> &'static str {
    let Some((group, plural)) = spec::single_resource(spec) else {
        return "-";
    };
    let namespace = lock.metadata.namespace.as_deref();
    let Some(resource) = discovered.find(&group, &plural) else {
        let unreadable = discovered.failures.iter().any(|(g, _)| *g == group);
        return if unreadable { "-" } else { "missing" };
    };
    // A Lock covers namespaced objects only, a ClusterLock cluster-scoped ones only.
    if resource.namespaced != namespace.is_some() {
        return "missing";
    }
    let name = lock.metadata.name.as_deref().unwrap_or_default();
    match cluster
        .api(&resource.api_resource(), namespace)
        .get(name)
        .await
    {
        Ok(_) => "exists",
        Err(e) if status_code(&e) == Some(404) => "missing",
        Err(_) => "-",
    }
}

/// OWNER: `Job/backup` for each ownerReference, `-` without any.
fn owners(lock: &DynamicObject) -> String {
    match lock.metadata.owner_references.as_deref() {
        None | Some([]) => "-".to_owned(),
        Some(references) => (references.iter().map(owner::short))
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// Columns separated by three spaces, as kubectl prints them; the first row is the header.
fn table(rows: &[Vec<String>]) -> String {
    let mut widths = vec![0; rows.first().map_or(0, Vec::len)];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let line: String = (row.iter().zip(&widths))
            .map(|(cell, width)| format!("{cell:<width$}   "))
            .collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_column() {
        let lock = |owners: serde_json::Value| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
                "metadata": {"name": "data", "namespace": "prod", "ownerReferences": owners},
            }))
            .expect("an object")
        };
        let reference = |kind: &str, name: &str| serde_json::json!({"apiVersion": "v1", "kind": kind, "name": name, "uid": "u"});
        assert_eq!(owners(&lock(serde_json::Value::Null)), "-");
        assert_eq!(owners(&lock(serde_json::json!([]))), "-");
        assert_eq!(
            owners(&lock(serde_json::json!([
                reference("Job", "backup"),
                reference("ConfigMap", "x")
            ]))),
            "Job/backup,ConfigMap/x"
        );
    }

    #[test]
    fn locks_in_excluded_or_unselected_namespaces_are_marked_unenforced() {
        let lock = |ns: &str, reason: &str| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
                "metadata": {"name": "data", "namespace": ns},
                "status": {"conditions": [{"type": "Enforced", "reason": reason}]},
            }))
            .expect("an object")
        };
        let spec = LockSpec::default();
        assert!(!unenforced(&lock("prod", "Enforcing"), &spec));
        assert!(unenforced(&lock("prod", NOT_SELECTED), &spec));
        assert!(unenforced(&lock("kube-system", "Enforcing"), &spec));
    }

    #[test]
    fn enforced_and_blocked_columns() {
        let lock = |generation: i64, status: serde_json::Value| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
                "metadata": {"name": "web", "namespace": "prod", "generation": generation},
                "status": status,
            }))
            .expect("an object")
        };
        let entry = |g: i64| serde_json::json!({"instance": "cp", "observedGeneration": g, "since": "2026-01-01T00:00:00Z"});
        assert_eq!(enforced(&lock(1, serde_json::Value::Null)), "-");
        assert_eq!(
            enforced(&lock(1, serde_json::json!({"enforcedCount": 0}))),
            "0"
        );
        let current = serde_json::json!({"enforcedBy": [entry(2), entry(1)]});
        assert_eq!(enforced(&lock(2, current)), "1");

        let event = |regarding: serde_json::Value, series: serde_json::Value| -> Event {
            serde_json::from_value(serde_json::json!({
                "metadata": {}, "eventTime": null, "regarding": regarding, "series": series,
            }))
            .expect("an event")
        };
        let series = |count: i32| serde_json::json!({"count": count, "lastObservedTime": "2026-01-01T00:00:00.000000Z"});
        let mut total = HashMap::new();
        count_blocked(
            &mut total,
            &[
                event(serde_json::json!({"uid": "u-1"}), series(57)),
                event(serde_json::json!({"uid": "u-1"}), serde_json::Value::Null),
                event(serde_json::json!({"uid": "u-2"}), series(3)),
                event(serde_json::json!({}), series(5)),
            ],
        );
        count_blocked(
            &mut total,
            &[event(
                serde_json::json!({"uid": "u-1"}),
                serde_json::Value::Null,
            )],
        );
        assert_eq!(
            total,
            HashMap::from([("u-1".into(), 59), ("u-2".into(), 3)])
        );
    }

    #[test]
    fn columns_line_up() {
        let rows = vec![
            vec!["NAME".to_owned(), "KIND".to_owned(), "REASON".to_owned()],
            vec!["web".to_owned(), "Lock".to_owned(), "".to_owned()],
            vec![
                "a-long-name".to_owned(),
                "ClusterLock".to_owned(),
                "why not".to_owned(),
            ],
        ];
        assert_eq!(
            table(&rows),
            "NAME          KIND          REASON\n\
             web           Lock\n\
             a-long-name   ClusterLock   why not\n"
        );
    }
}
