//! "Locking objects" and rules 1, 3, 6 and 9: every way to write a locked object is refused with
//! the README's message, dry runs too; CREATE, other objects and the locks themselves are not.

use anyhow::{Result, ensure};
use serde_json::{Value, json};

use crate::suite::{Ctx, NAMESPACED_DENIAL, locked};

const REASON: &str = "VM snapshot in progress";

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let rest = ctx.rest();
    ctx.configmap(&ns, "app-config", json!({}))?;
    ctx.configmap(&ns, "other", json!({}))?;
    // As the README does it.
    ctx.k_in(
        &["create", "-f", "-"],
        &format!(
            "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata:\n  name: app-config\n  namespace: {ns}\nspec:\n  reason: {REASON}   # optional\n"
        ),
    )
    .check()?;
    let path = format!("/api/v1/namespaces/{ns}/configmaps/app-config");
    let enforced = ctx.update_enforced(&path)?;
    ctx.note(format!(
        "enforced {:.0} ms after the Lock was created",
        enforced.after.as_secs_f64() * 1000.0
    ));
    let message = format!(
        "{NAMESPACED_DENIAL}{}",
        locked("configmaps", &ns, "app-config", Some(REASON))
    );
    // The exact text, as an API client receives it.
    ensure!(
        enforced.refusal.message() == message,
        "refusal message\n    expected: {message}\n    got:      {}",
        enforced.refusal.message()
    );

    let n = ns.as_str();
    let cm = ["configmap", "app-config", "-n", n];
    let with = |verb: &str, extra: &[&str]| {
        let mut args = vec![verb];
        args.extend_from_slice(&cm);
        args.extend_from_slice(extra);
        ctx.k(&args)
    };
    with("label", &["checked=yes"]).refused(&message)?;
    with("annotate", &["checked=yes"]).refused(&message)?;
    with(
        "patch",
        &["--type=merge", "-p", r#"{"data":{"state":"merge"}}"#],
    )
    .refused(&message)?;
    with(
        "patch",
        &["--type=strategic", "-p", r#"{"data":{"state":"smp"}}"#],
    )
    .refused(&message)?;
    with(
        "patch",
        &[
            "--type=json",
            "-p",
            r#"[{"op":"replace","path":"/data/state","value":"json"}]"#,
        ],
    )
    .refused(&message)?;
    with("label", &["checked=yes", "--dry-run=server"]).refused(&message)?;
    with("delete", &["--dry-run=server"]).refused(&message)?;
    with("delete", &["--wait=false"]).refused(&message)?;

    // PUT (kubectl replace) and apply, client-side and server-side.
    let current: Value = serde_json::from_str(&with("get", &["-o", "json"]).check()?.stdout)?;
    let mut replaced = current.clone();
    replaced["data"]["state"] = json!("replaced");
    ctx.k_in(&["replace", "-f", "-"], &replaced.to_string())
        .refused(&message)?;
    let applied = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app-config\n  namespace: {ns}\ndata:\n  state: applied\n"
    );
    ctx.k_in(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &applied,
    )
    .refused(&message)?;
    ctx.k_in(&["apply", "-f", "-"], &applied)
        .refused(&message)?;

    // The REST API: every verb, the Status as the README describes it.
    rest.put(&path, &replaced)?.refused("PUT", &message)?;
    rest.merge_patch(&path, &json!({"data": {"state": "rest"}}))?
        .refused("merge PATCH", &message)?;
    rest.call(
        "PATCH",
        &path,
        "application/json-patch+json",
        Some(&json!([{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}])),
    )?
    .refused("JSON PATCH", &message)?;
    rest.call(
        "PATCH",
        &format!("{path}?fieldManager=e2e&force=true"),
        "application/apply-patch+yaml",
        Some(&Value::String(applied.clone())),
    )?
    .refused("server-side apply", &message)?;
    rest.delete(&path)?.refused("DELETE", &message)?;
    rest.delete(&format!("{path}?dryRun=All"))?
        .refused("DELETE ?dryRun=All", &message)?;
    rest.call(
        "DELETE",
        &path,
        "application/json",
        Some(&json!({"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Foreground"})),
    )?
    .refused("DELETE with DeleteOptions", &message)?;
    let now: Value = rest.get(&path)?.body;
    ensure!(
        now["data"]["state"] == "original"
            && now["metadata"]["resourceVersion"] == current["metadata"]["resourceVersion"],
        "the locked ConfigMap changed: {now}"
    );

    // Another object in the namespace is not affected.
    ctx.k(&["label", "configmap", "other", "-n", n, "checked=yes"])
        .allowed()?;

    // CREATE is never looked at: an object created under an existing Lock's name.
    ctx.lock(&ns, "future", json!({"reason": "before it exists"}))?;
    ctx.k(&["create", "configmap", "future", "-n", n])
        .allowed()?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/future"))?;

    // Locks are never locked: a Lock whose empty spec covers every resource named "guard",
    // itself included, can still be changed and deleted.
    ctx.configmap(&ns, "guard", json!({}))?;
    ctx.lock(&ns, "guard", json!({}))?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/guard"))?;
    ctx.k(&["label", "lock", "guard", "-n", n, "checked=yes"])
        .allowed()?;
    ctx.k(&[
        "patch",
        "lock",
        "guard",
        "-n",
        n,
        "--type=merge",
        "-p",
        r#"{"spec":{"reason":"changed"}}"#,
    ])
    .allowed()?;
    // Short names and the category, as the README lists them.
    for kind in ["locks", "lk", "objectlocks"] {
        let out = ctx.k(&["get", kind, "-n", n, "-o", "name"]).check()?;
        ensure!(
            out.stdout.contains("app-config") && out.stdout.contains("guard"),
            "kubectl get {kind}: {}",
            out.stdout
        );
    }
    ctx.k(&["delete", "lock", "guard", "-n", n]).allowed()?;

    // Unlock; the object can then go.
    ctx.k(&["delete", "lock", "app-config", "-n", n])
        .allowed()?;
    let took = ctx.released("delete after unlock", crate::suite::ENFORCE_WITHIN, || {
        rest.probe_delete(&path)
    })?;
    ctx.note(format!(
        "released {:.0} ms after the Lock was deleted",
        took.as_secs_f64() * 1000.0
    ));
    with("delete", &[]).allowed()?;
    Ok(())
}
