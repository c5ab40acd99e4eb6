//! Rule 7: a locked object that is Terminating may only lose its finalizers (otherwise it would
//! be stuck forever); its content stays locked, so deleting first is no way around an
//! UPDATE-only lock.

use anyhow::{Result, ensure};
use serde_json::json;

use crate::suite::Ctx;

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
               "metadata": {"name": "held", "finalizers": ["example.com/e2e-hold"]},
               "data": {"state": "original"}}),
    )?;
    let path = format!("/api/v1/namespaces/{ns}/configmaps/held");
    // An UPDATE-only lock: the DELETE goes through, and the object stays Terminating on its
    // finalizer.
    ctx.lock(
        ns,
        "held",
        json!({"operations": ["UPDATE"], "reason": "snapshot"}),
    )?;
    ctx.update_enforced(&path)?;
    rest.delete(&path)?.allowed("delete held")?;
    ensure!(
        rest.get(&path)?.body["metadata"]["deletionTimestamp"].is_string(),
        "held is not Terminating"
    );

    // Terminating is no way around the lock: its content may not change.
    let data = format!(
        "configmaps \"held\" in namespace \"{ns}\" is locked by Lock {ns}/held (data changed): snapshot"
    );
    rest.merge_patch(&path, &json!({"data": {"state": "changed"}}))?
        .refused("a data change of the Terminating object", &data)?;
    let annotations = format!(
        "configmaps \"held\" in namespace \"{ns}\" is locked by Lock {ns}/held (metadata.annotations changed): snapshot"
    );
    rest.probe_update(&path)?
        .refused("an annotation of the Terminating object", &annotations)?;
    ensure!(
        rest.get(&path)?.body["data"]["state"] == "original",
        "the content of held changed"
    );

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
    .allowed()?;
    ensure!(
        rest.get(&path)?.code == 404,
        "held still exists after its finalizer was removed"
    );
    Ok(())
}
