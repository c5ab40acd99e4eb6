//! A Lock this version cannot read still locks its own name, UPDATE and DELETE, through the
//! real API server and the narrowed registration; the other Locks of its namespace work as
//! usual, and its unlocked objects stay writable (no namespace-wide refusal). One that names its
//! `resources` locks those only: never more than its creator's rights were checked for, and its
//! status says so.
//!
//! Such a Lock comes from a newer version during an upgrade: its CRD allows a value this one
//! does not know. The Lock CRD is widened here the same way (`mode: Audit`) for the length of the
//! scenario, then narrowed back once the Lock is gone.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};

use super::scale::deployment;
use crate::suite::{Ctx, ENFORCE_WITHIN, lock_path};

const CRD: &str = "locks.objectlock.dev";

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    for name in ["odd", "delete-only", "free", "scoped"] {
        ctx.configmap(&ns, name, json!({}))?;
    }
    ctx.create(
        &format!("/apis/apps/v1/namespaces/{ns}/deployments"),
        deployment("scoped", json!({})),
    )?;
    let enum_path = mode_enum(ctx)?;
    ctx.json_patch(
        "crd",
        CRD,
        &json!([{"op": "add", "path": format!("{enum_path}/-"), "value": "Audit"}]),
    )?;
    let result = check(ctx, &ns);
    // The Lock goes before the CRD is narrowed back, as after a downgrade.
    let cleanup = ctx
        .unlock(&ns, "odd")
        .and_then(|()| {
            let reply = ctx.rest().delete(&lock_path(&ns, "scoped"))?;
            ensure!(
                reply.ok() || reply.code == 404,
                "cannot delete Lock {ns}/scoped: {} {}",
                reply.code,
                reply.message()
            );
            Ok(())
        })
        .and_then(|()| {
            ctx.json_patch(
                "crd",
                CRD,
                &json!([{"op": "test", "path": format!("{enum_path}/2"), "value": "Audit"},
                   {"op": "remove", "path": format!("{enum_path}/2")}]),
            )
        });
    result.and(cleanup)
}

fn check(ctx: &Ctx, ns: &str) -> Result<()> {
    let path = |name: &str| format!("/api/v1/namespaces/{ns}/configmaps/{name}");
    // Meant as "audited": unreadable here, so enforced, UPDATE and DELETE. The API server serves
    // the widened CRD moments after the patch: until then the create is refused.
    let odd = json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
        "metadata": {"name": "odd"},
        "spec": {"mode": "Audit", "reason": "from a newer version"}});
    let start = Instant::now();
    loop {
        let reply = ctx.rest().post(
            &format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks"),
            &odd,
        )?;
        if reply.ok() {
            break;
        }
        ensure!(
            reply.code == 422
                && reply.message().contains("Unsupported value: \"Audit\"")
                && start.elapsed() < ENFORCE_WITHIN,
            "cannot create the Lock with mode Audit: {} {}",
            reply.code,
            reply.message()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    ctx.lock(ns, "delete-only", json!({"operations": ["DELETE"]}))?;
    let refused = ctx.update_enforced(&path("odd"))?.refusal;
    ensure!(
        refused
            .message()
            .contains(&format!("Lock {ns}/odd: from a newer version")),
        "refused, but not by the unreadable Lock: {}",
        refused.message()
    );
    ensure!(
        refused
            .warnings
            .iter()
            .any(|w| w.contains(&format!("Lock {ns}/odd: unreadable spec"))
                && w.contains("spec.mode")),
        "the refusal does not say the Lock is unreadable: {:?}",
        refused.warnings
    );
    ctx.delete_enforced(&path("odd"))?;
    // Unreadable, but its resources and operations read: DELETE of the ConfigMap of its name is
    // refused, its UPDATE and a Deployment of the same name are not (its creator's rights were
    // checked for that only).
    ctx.lock(
        ns,
        "scoped",
        json!({"mode": "Audit", "resources": [{"apiGroups": [""], "resources": ["configmaps"]}],
               "operations": ["DELETE"], "reason": "configmaps only"}),
    )?;
    let scoped = ctx.delete_enforced(&path("scoped"))?.refusal;
    ensure!(
        scoped
            .message()
            .contains(&format!("Lock {ns}/scoped: configmaps only")),
        "refused, but not by the unreadable Lock: {}",
        scoped.message()
    );
    ctx.rest()
        .probe_update(&path("scoped"))?
        .allowed("update of a ConfigMap whose unreadable Lock locks DELETE only")?;
    // Its status says what it refuses: DELETE, not UPDATE.
    let message = unparseable_message(ctx, ns, "scoped")?;
    ensure!(
        message.contains(": DELETE of the locked object is refused;"),
        "the Enforced condition of Lock {ns}/scoped does not say DELETE only: {message}"
    );
    let deployment = format!("/apis/apps/v1/namespaces/{ns}/deployments/scoped");
    ctx.rest()
        .probe_update(&deployment)?
        .allowed("update of a Deployment named as an unreadable Lock on ConfigMaps")?;
    ctx.rest()
        .probe_delete(&deployment)?
        .allowed("delete of a Deployment named as an unreadable Lock on ConfigMaps")?;
    // The rest of the namespace as usual.
    ctx.delete_enforced(&path("delete-only"))?;
    ctx.rest()
        .probe_update(&path("delete-only"))?
        .allowed("update of an object whose Lock locks DELETE only")?;
    ctx.rest()
        .probe_update(&path("free"))?
        .allowed("update of an unlocked object next to an unreadable Lock")?;
    ctx.rest()
        .probe_delete(&path("free"))?
        .allowed("delete of an unlocked object next to an unreadable Lock")?;
    // kubectl lock list and kubectl unlock read it as the webhook does.
    let list = ctx.k(&["lock", "list", "-n", ns]).check()?;
    let row = (list.stdout.lines())
        .find(|l| l.starts_with("scoped "))
        .map(|l| l.split_whitespace().collect::<Vec<_>>());
    ensure!(
        row.as_ref()
            .is_some_and(|r| r.get(2..4) == Some(&["configmaps", "DELETE"][..])),
        "kubectl lock list does not show Lock {ns}/scoped as configmaps, DELETE: {}",
        list.stdout
    );
    let unlocked = ctx.k(&["unlock", "configmap/scoped", "-n", ns]).check()?;
    ensure!(
        unlocked.stderr.contains(&format!(
            "note: Lock {ns}/scoped: unreadable spec, fails closed until fixed: spec.mode"
        )),
        "kubectl unlock of an unreadable Lock does not say so: {}",
        unlocked.stderr
    );
    let gone = ctx.rest().get(&lock_path(ns, "scoped"))?;
    ensure!(
        gone.code == 404,
        "Lock {ns}/scoped is still there after kubectl unlock: {} {}",
        gone.code,
        gone.message()
    );
    ctx.note(format!(
        "refusal of the unreadable Lock's object: {}; warning: {}",
        refused.message(),
        refused.warnings.join(" | ")
    ));
    Ok(())
}

/// The message of Lock `ns/name`'s `Enforced` condition once the webhook has marked it
/// `Unparseable`.
fn unparseable_message(ctx: &Ctx, ns: &str, name: &str) -> Result<String> {
    let path = lock_path(ns, name);
    let start = Instant::now();
    loop {
        let lock = ctx.rest().get(&path)?;
        let conditions = lock.body["status"]["conditions"].as_array().cloned();
        let enforced = conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c["type"] == "Enforced" && c["reason"] == "Unparseable");
        if let Some(condition) = enforced {
            return Ok(condition["message"].as_str().unwrap_or_default().to_owned());
        }
        ensure!(
            start.elapsed() < ENFORCE_WITHIN,
            "Lock {ns}/{name} is not marked Unparseable within {ENFORCE_WITHIN:?}: {}",
            lock.body["status"]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The JSON pointer of `spec.mode`'s enum in the served version of the Lock CRD.
fn mode_enum(ctx: &Ctx) -> Result<String> {
    let out = ctx.k(&["get", "crd", CRD, "-o", "json"]).check()?;
    let crd: Value = serde_json::from_str(&out.stdout).context("CRD JSON")?;
    let versions = crd["spec"]["versions"]
        .as_array()
        .context("the Lock CRD has no versions")?;
    let index = versions
        .iter()
        .position(|v| v["served"] == true && v["storage"] == true)
        .context("the Lock CRD has no stored version")?;
    let path = format!(
        "/spec/versions/{index}/schema/openAPIV3Schema/properties/spec/properties/mode/enum"
    );
    let values = crd
        .pointer(&path)
        .and_then(Value::as_array)
        .context("the Lock CRD has no enum for spec.mode")?;
    ensure!(
        values.len() == 2 && !values.iter().any(|v| v == "Audit"),
        "spec.mode's enum is not this version's: {values:?}"
    );
    Ok(path)
}
