//! Rule 7: a locked object that is already Terminating may still be updated (finalizer
//! removal), with a warning; otherwise it would be stuck forever.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use serde_json::json;

use crate::kubectl::warning_matches;
use crate::suite::{Ctx, ENFORCE_WITHIN};

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let result = check(ctx, &ns);
    if result.is_err() {
        // Otherwise the namespace would stay Terminating on the finalizer.
        ctx.unlock(&ns, "held").ok();
        ctx.k(&[
            "patch",
            "configmap",
            "held",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ]);
    }
    result
}

fn check(ctx: &Ctx, ns: &str) -> Result<()> {
    let n = ns;
    let rest = ctx.rest();
    ctx.create(
        &format!("/api/v1/namespaces/{ns}/configmaps"),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "held", "finalizers": ["example.com/e2e-hold"]}}),
    )?;
    let path = format!("/api/v1/namespaces/{ns}/configmaps/held");
    // Deleted before the lock: it stays Terminating on its finalizer.
    rest.delete(&path)?.allowed("delete held")?;
    ensure!(
        rest.get(&path)?.body["metadata"]["deletionTimestamp"].is_string(),
        "held is not Terminating"
    );
    ctx.lock(ns, "held", json!({"reason": "snapshot"}))?;

    // The warning shows the webhook sees the lock (an update of a Terminating object is never
    // refused, so a refusal cannot show it).
    let warning =
        format!("configmaps \"held\" is being deleted: update allowed despite Lock {ns}/held");
    let start = Instant::now();
    loop {
        let reply = rest.probe_update(&path)?;
        reply.allowed("dry-run update of the Terminating object")?;
        if reply.warnings.iter().any(|w| warning_matches(w, &warning)) {
            break;
        }
        if start.elapsed() > ENFORCE_WITHIN {
            bail!(
                "no warning `{warning}` after {ENFORCE_WITHIN:?}: {:?}",
                reply.warnings
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    // The finalizer's owner removes it, as a controller would: allowed, and the object goes.
    ctx.k(&[
        "patch",
        "configmap",
        "held",
        "-n",
        n,
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ])
    .allowed_warning(&warning)?;
    ensure!(
        rest.get(&path)?.code == 404,
        "held still exists after its finalizer was removed"
    );
    Ok(())
}
