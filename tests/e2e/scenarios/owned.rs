//! Locks owned by an object (`kubectl lock ... --owner KIND/NAME`): the Kubernetes garbage
//! collector deletes them with their owner, and the object they locked is writable again.

use std::time::Duration;

use anyhow::{Result, ensure};

use super::plugin::{Row, fails, stdout_starts, table};
use crate::suite::{Ctx, ENFORCE_WITHIN, locked};

/// How long the garbage collector may take: it notices a new resource type (the lock CRDs) on
/// its periodic discovery, every 30 s, then deletes dependents within moments.
const COLLECTED_WITHIN: Duration = Duration::from_secs(90);

pub fn run(ctx: &Ctx) -> Result<()> {
    if !ctx.env.kcm {
        ctx.note("no controller manager (garbage collector): owned locks not followed");
        return Ok(());
    }
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let rest = ctx.rest();
    ctx.configmap(&ns, "data", serde_json::json!({}))?;
    ctx.k(&[
        "create",
        "job",
        "backup",
        "-n",
        n,
        "--image=registry.invalid/backup:1",
    ])
    .check()?;
    let job_uid = ctx
        .k(&[
            "get",
            "job",
            "backup",
            "-n",
            n,
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .check()?
        .stdout;

    // The lock of the ConfigMap, owned by the Job doing the work.
    let out = ctx.k(&["lock", "cm/data", "-n", n, "--owner", "job/backup"]);
    stdout_starts(
        &out,
        &format!(
            "locked configmaps \"data\" in namespace \"{ns}\" with Lock {ns}/data (UPDATE, DELETE; held by user \"{}\"; owned by Job/backup) (enforced by",
            ctx.env.user
        ),
    )?;
    let lock_path = format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/data");
    let lock = rest.get(&lock_path)?;
    let reference = &lock.body["metadata"]["ownerReferences"];
    ensure!(
        reference
            == &serde_json::json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "backup",
                                     "uid": job_uid}]),
        "ownerReferences of Lock {ns}/data: {reference}"
    );
    // Shown by kubectl get (printer columns) and by kubectl lock list.
    let got = ctx.k(&["get", "lock", "data", "-n", n]).check()?;
    let cells = |rows: &[Row], cols: &[&str]| -> Vec<String> {
        let row = rows.first().cloned().unwrap_or_default();
        cols.iter()
            .map(|c| row.get(*c).cloned().unwrap_or_default())
            .collect()
    };
    ensure!(
        cells(&table(&got.stdout), &["OWNER-KIND", "OWNER"]) == ["Job", "backup"],
        "kubectl get lock shows no owner: {}",
        got.stdout
    );
    let listed = ctx.k(&["lock", "list", "-n", n]).check()?;
    ensure!(
        cells(&table(&listed.stdout), &["NAME", "OWNER"]) == ["data", "Job/backup"],
        "kubectl lock list shows no owner: {}",
        listed.stdout
    );
    let data = format!("/api/v1/namespaces/{ns}/configmaps/data");
    ctx.update_enforced(&data)?;
    ctx.k(&["label", "cm", "data", "-n", n, "x=1"])
        .refused(&locked("configmaps", n, "data", None))?;

    // A ClusterLock takes cluster-scoped owners only: refused before anything is created.
    let target_ns = ctx.namespace("target")?;
    fails(
        &ctx.k(&[
            "lock",
            &format!("ns/{target_ns}"),
            "-n",
            n,
            "--owner",
            "job/backup",
        ]),
        1,
        "--owner job/backup: jobs.batch are namespaced",
    )?;
    let role = ctx.cluster_name("owner");
    ctx.k(&[
        "create",
        "clusterrole",
        &role,
        "--verb=get",
        "--resource=pods",
    ])
    .check()?;
    let out = ctx.k(&[
        "lock",
        &format!("namespace/{target_ns}"),
        "--owner",
        &format!("clusterrole/{role}"),
    ]);
    stdout_starts(
        &out,
        &format!(
            "locked namespaces \"{target_ns}\" with ClusterLock {target_ns} (UPDATE, DELETE; held by user \"{}\"; owned by ClusterRole/{role})",
            ctx.env.user
        ),
    )?;
    let namespace = format!("/api/v1/namespaces/{target_ns}");
    ctx.update_enforced(&namespace)?;

    // The owners go; the garbage collector takes their locks, and the objects are free.
    ctx.k(&["delete", "job", "backup", "-n", n]).check()?;
    let took = ctx.gone(&lock_path, COLLECTED_WITHIN)?;
    ctx.note(format!(
        "owned Lock deleted {:.1}s after its Job",
        took.as_secs_f64()
    ));
    ctx.released("update after the owner's deletion", ENFORCE_WITHIN, || {
        rest.probe_update(&data)
    })?;
    ctx.k(&["label", "cm", "data", "-n", n, "x=1"]).allowed()?;

    ctx.k(&["delete", "clusterrole", &role]).check()?;
    let cluster_lock = format!("/apis/objectlock.dev/v1alpha1/clusterlocks/{target_ns}");
    let took = ctx.gone(&cluster_lock, COLLECTED_WITHIN)?;
    ctx.note(format!(
        "owned ClusterLock deleted {:.1}s after its ClusterRole",
        took.as_secs_f64()
    ));
    ctx.released(
        "namespace update after its owner's deletion",
        ENFORCE_WITHIN,
        || rest.probe_update(&namespace),
    )?;
    Ok(())
}
