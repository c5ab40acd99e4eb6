//! Rule 1: a Lock asking for CREATE reserves its name, one asking for CONNECT keeps exec,
//! attach and port-forward out of its pod; the default lock does neither. The registration
//! sends CREATE and CONNECT only for the names of Locks asking for them.

use anyhow::{Result, ensure};
use serde_json::{Value, json};

use crate::rest::Reply;
use crate::scenarios::pods::pod;
use crate::scenarios::scale::deployment;
use crate::suite::{Ctx, NAMESPACED_DENIAL, locked};

const REASON: &str = "VM snapshot";

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let reserved = ctx.cluster_name("reserved");
    let result = checks(ctx, &ns, &reserved);
    // Nothing left asking for CREATE or CONNECT, whatever happened: the scenarios that count
    // the registration's entries of those operations run after this one.
    let rest = ctx.rest();
    let leftovers = [
        format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/web-v2"),
        format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/db-0"),
        format!("/apis/objectlock.dev/v1alpha1/clusterlocks/{reserved}"),
    ];
    for path in leftovers {
        let reply = rest.delete(&path)?;
        ensure!(
            reply.ok() || reply.code == 404,
            "DELETE {path}: {} {}",
            reply.code,
            reply.message()
        );
    }
    result
}

fn checks(ctx: &Ctx, ns: &str, name: &str) -> Result<()> {
    let n = ns;
    let rest = ctx.rest();
    let deployments = format!("/apis/apps/v1/namespaces/{ns}/deployments");
    let dry_create = |name: &str| -> Result<Reply> {
        rest.post(
            &format!("{deployments}?dryRun=All"),
            &deployment(name, json!({})),
        )
    };

    // Without a Lock asking for it, creation and scaling work; a default Lock refuses the
    // deletion and the scale of its Deployment, not the creation of its name.
    ctx.create(&deployments, deployment("web", json!({})))?;
    ctx.k(&["scale", "deployment", "web", "-n", n, "--replicas=2"])
        .allowed()?;
    ctx.lock(ns, "web", json!({}))?;
    ctx.delete_enforced(&format!("{deployments}/web"))?;
    let web = locked("deployments.apps", ns, "web", None);
    ctx.k(&["scale", "deployment", "web", "-n", n, "--replicas=3"])
        .refused(&format!("{NAMESPACED_DENIAL}{web}"))?;
    ctx.k(&["delete", "deployment", "web", "-n", n])
        .refused(&web)?;
    // Admission comes before the store's AlreadyExists: a 409, not a 403, is an admitted create.
    let again = dry_create("web")?;
    ensure!(
        again.code == 409,
        "a second Deployment web, with a default Lock web: {} {} (expected 409 AlreadyExists)",
        again.code,
        again.message()
    );

    // CREATE: the name is reserved, for the resources the Lock covers.
    ctx.lock(
        ns,
        "web-v2",
        json!({"operations": ["CREATE", "UPDATE", "DELETE"], "reason": REASON,
               "resources": [{"apiGroups": ["apps"], "resources": ["deployments"]}]}),
    )?;
    let enforced = ctx.enforced("dry-run create of deployments web-v2", || {
        dry_create("web-v2")
    })?;
    ctx.figure(format!(
        "a Lock asking CREATE refused its name's creation {} ms after it was created",
        enforced.after.as_millis()
    ));
    let reserved = format!(
        "cannot create: {}",
        locked("deployments.apps", ns, "web-v2", Some(REASON))
    );
    ctx.k(&[
        "create",
        "deployment",
        "web-v2",
        "-n",
        n,
        "--image=registry.invalid/web:2",
    ])
    .refused(&reserved)?;
    // Another name, another resource of the name, and a name still to be generated.
    ctx.k(&[
        "create",
        "deployment",
        "web-v3",
        "-n",
        n,
        "--image=registry.invalid/web:3",
    ])
    .allowed()?;
    ctx.configmap(ns, "web-v2", json!({}))?;
    let mut generated = deployment("ignored", json!({}));
    generated["metadata"] = json!({"generateName": "web-v2-"});
    rest.post(&deployments, &generated)?
        .allowed("create with generateName")?;

    // CONNECT: exec, attach, port-forward and proxy into the locked pod are refused before the
    // API server looks for its node; another pod is not the lock's.
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    ctx.create(&pods, pod("db-0", json!({})))?;
    ctx.create(&pods, pod("db-1", json!({})))?;
    ctx.lock(
        ns,
        "db-0",
        json!({"operations": ["CONNECT"], "reason": REASON}),
    )?;
    let exec = |pod: &str| -> Result<Reply> {
        rest.call(
            "POST",
            &format!("{pods}/{pod}/exec?command=true&stdout=true"),
            "application/json",
            None,
        )
    };
    ctx.enforced("exec into db-0", || exec("db-0"))?;
    let guarded = locked("pods", ns, "db-0", Some(REASON));
    ctx.k(&["exec", "db-0", "-n", n, "--", "true"])
        .refused(&format!("cannot exec: {guarded}"))?;
    for (sub, verb) in [
        ("attach?stdout=true", "attach"),
        ("portforward?ports=80", "port-forward"),
        ("proxy", "proxy"),
    ] {
        rest.call(
            "POST",
            &format!("{pods}/db-0/{sub}"),
            "application/json",
            None,
        )?
        .refused(sub, &format!("cannot {verb}: {guarded}"))?;
    }
    let other = ctx.k(&["exec", "db-1", "-n", n, "--", "true"]);
    ensure!(
        !other.ok() && !other.stderr.contains("is locked by"),
        "exec into db-1 (no host: it cannot succeed) failed for the lock: {}",
        other.stderr.trim()
    );
    // The CONNECT-only Lock leaves the pod's own changes alone.
    rest.probe_update(&format!("{pods}/db-0"))?
        .allowed("dry-run update of a pod a CONNECT-only Lock holds")?;
    enforced_condition(ctx, ns, "db-0")?;

    // Unlocked, exec fails only for want of a node.
    ctx.unlock(ns, "db-0")?;
    ctx.released(
        "exec into db-0 after unlock",
        crate::suite::ENFORCE_WITHIN,
        || {
            let reply = exec("db-0")?;
            Ok(Reply {
                code: if reply.code == 403 { 403 } else { 200 },
                ..reply
            })
        },
    )?;

    // A ClusterLock asking CREATE reserves a Namespace name.
    ctx.cluster_lock(
        name,
        json!({"operations": ["CREATE"], "resources": [{"apiGroups": [""], "resources": ["namespaces"]}]}),
    )?;
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    let enforced = ctx.enforced("dry-run create of a reserved namespace", || {
        rest.post("/api/v1/namespaces?dryRun=All", &namespace)
    })?;
    enforced.refusal.refused(
        "dry-run create of a reserved namespace",
        &format!("cannot create: namespaces \"{name}\" is locked by ClusterLock {name}"),
    )
}

/// The Lock's `Enforced` condition is True once an instance confirms the registration sends
/// its CONNECTs.
fn enforced_condition(ctx: &Ctx, ns: &str, name: &str) -> Result<()> {
    let lock: Value = ctx
        .rest()
        .get(&format!(
            "/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/{name}"
        ))?
        .body;
    let conditions = lock["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let enforced = conditions.iter().find(|c| c["type"] == "Enforced");
    ensure!(
        enforced.is_some_and(|c| c["status"] == "True"),
        "Lock {ns}/{name} refuses exec, yet its status says {enforced:?}"
    );
    Ok(())
}
