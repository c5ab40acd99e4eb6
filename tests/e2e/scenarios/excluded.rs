//! kube-system is never sent to the webhook (the registration's namespaceSelector): a Lock
//! there is inert, so the control plane never waits on the webhook.

use anyhow::Result;
use serde_json::json;

use crate::expect;
use crate::suite::Ctx;

pub fn run(ctx: &Ctx) -> Result<()> {
    let name = format!("kol-e2e-{}", ctx.env.run);
    let result = check(ctx, &name);
    // Leave kube-system as it was, whatever happened.
    ctx.k(&[
        "delete",
        "lock",
        &name,
        "-n",
        "kube-system",
        "--ignore-not-found",
    ]);
    ctx.k(&[
        "delete",
        "configmap",
        &name,
        "-n",
        "kube-system",
        "--ignore-not-found",
    ]);
    result
}

fn check(ctx: &Ctx, name: &str) -> Result<()> {
    ctx.configmap("kube-system", name, json!({}))?;
    let out = ctx.k(&["lock", &format!("cm/{name}"), "-n", "kube-system"]);
    if expect::PLUGIN_LOCKS_EXCLUDED_NAMESPACES {
        out.check()?;
        ctx.note("kubectl lock created a Lock in kube-system, where it is never enforced");
    } else {
        anyhow::ensure!(
            !out.ok(),
            "kubectl lock in kube-system succeeded: {}",
            out.stdout
        );
        ctx.lock("kube-system", name, json!({}))?;
    }
    // A lock created afterwards elsewhere is enforced, so the webhook has seen the first.
    let ns = ctx.namespace("")?;
    ctx.configmap(&ns, "sentinel", json!({}))?;
    ctx.lock(&ns, "sentinel", json!({}))?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/sentinel"))?;
    ctx.k(&["label", "configmap", name, "-n", "kube-system", "x=1"])
        .allowed()?;
    ctx.k(&["delete", "configmap", name, "-n", "kube-system"])
        .allowed()?;
    Ok(())
}
