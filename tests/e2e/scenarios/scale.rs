//! Rule 4 on a Deployment: `scale` is locked like the object, `status` is not.

use anyhow::Result;
use serde_json::{Value, json};

use crate::suite::{Ctx, NAMESPACED_DENIAL, locked};

const REASON: &str = "release freeze";

/// A Deployment whose pods never schedule (no scheduler is needed).
pub fn deployment(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"e2e-app": name}},
            "template": {
                "metadata": {"labels": {"e2e-app": name}},
                "spec": {"containers": [{"name": "c", "image": "registry.invalid/web:1"}]}
            }
        }
    })
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let rest = ctx.rest();
    ctx.create(
        &format!("/apis/apps/v1/namespaces/{ns}/deployments"),
        deployment("web", json!({})),
    )?;
    ctx.lock(&ns, "web", json!({"reason": REASON}))?;
    let path = format!("/apis/apps/v1/namespaces/{ns}/deployments/web");
    ctx.update_enforced(&path)?;
    let message = locked("deployments.apps", &ns, "web", Some(REASON));

    ctx.k(&["scale", "deployment", "web", "-n", n, "--replicas=3"])
        .refused(&format!("{NAMESPACED_DENIAL}{message}"))?;
    rest.merge_patch(&format!("{path}/scale"), &json!({"spec": {"replicas": 2}}))?
        .refused("PATCH deployments/scale", &message)?;
    // The Deployment controller writes status between our GET and PUT; a
    // 409 says nothing about the lock, so read again and retry.
    let mut put = None;
    for _ in 0..5 {
        let mut wanted = rest.get(&format!("{path}/scale"))?.body;
        wanted["spec"]["replicas"] = json!(4);
        let reply = rest.put(&format!("{path}/scale"), &wanted)?;
        if reply.code != 409 {
            put = Some(reply);
            break;
        }
    }
    put.ok_or_else(|| anyhow::anyhow!("PUT deployments/scale: 409 Conflict five times"))?
        .refused("PUT deployments/scale", &message)?;
    ctx.k(&[
        "set",
        "image",
        "deployment/web",
        "-n",
        n,
        "c=registry.invalid/web:2",
    ])
    .refused(&message)?;
    ctx.k(&["rollout", "restart", "deployment/web", "-n", n])
        .refused(&message)?;

    ctx.k(&[
        "patch",
        "deployment",
        "web",
        "-n",
        n,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"example.com/E2E","status":"True"}]}}"#,
    ])
    .allowed()?;
    Ok(())
}
