//! Audit annotations, as the README names them (`<webhook>/lock`, `warn-locks`, `exempted-by`,
//! `expired-locks`), read from the API server's own audit log: the local control plane is
//! restarted with one.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use crate::suite::Ctx;

pub fn run(ctx: &Ctx) -> Result<()> {
    let env = ctx.env;
    env.needs_local()?;
    if let Some(took) = env.restarted()? {
        ctx.note(format!(
            "API server restarted with an audit log in {:.1}s",
            took.as_secs_f64()
        ));
    }
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let auditor = format!("kol-e2e-{}-auditor", env.run);
    for name in ["locked", "warned", "exempt", "expired", "sentinel"] {
        ctx.configmap(&ns, name, json!({}))?;
    }
    ctx.lock(&ns, "locked", json!({"reason": "audited"}))?;
    ctx.lock(&ns, "warned", json!({"mode": "Warn"}))?;
    ctx.lock(&ns, "exempt", json!({"exempt": {"users": [auditor]}}))?;
    ctx.lock(&ns, "expired", json!({"expiresAt": "2020-01-01T00:00:00Z"}))?;
    ctx.lock(&ns, "sentinel", json!({}))?;
    // The narrowed registration leaves expired locks out; a selector Lock that matches nothing
    // sends the whole namespace, so the write under the expired lock still reaches the webhook.
    ctx.lock(
        &ns,
        "send-all",
        json!({"selector": {"matchLabels": {"objectlock.dev/e2e-none": "x"}}}),
    )?;
    ctx.update_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/sentinel"))?;

    let as_auditor = format!("--as={auditor}");
    ctx.k(&["label", "configmap", "locked", "-n", n, "x=1"])
        .refused("locked by Lock")?;
    ctx.k(&["label", "configmap", "warned", "-n", n, "x=1"])
        .allowed()?;
    ctx.k(&[
        "label",
        "configmap",
        "exempt",
        "-n",
        n,
        "x=1",
        &as_auditor,
        "--as-group=system:masters",
    ])
    .allowed()?;
    ctx.k(&["label", "configmap", "expired", "-n", n, "x=1"])
        .allowed()?;

    let expected = [
        (
            "locked",
            "namespaced.objectlock.dev/lock",
            format!("Lock {n}/locked"),
        ),
        (
            "warned",
            "namespaced.objectlock.dev/warn-locks",
            format!("Lock {n}/warned"),
        ),
        (
            "exempt",
            "namespaced.objectlock.dev/exempted-by",
            format!("Lock {n}/exempt (user {auditor})"),
        ),
        (
            "expired",
            "namespaced.objectlock.dev/expired-locks",
            format!("Lock {n}/expired"),
        ),
    ];
    let start = Instant::now();
    loop {
        let log = std::fs::read_to_string(env.audit_log()).unwrap_or_default();
        let events: Vec<Value> = log
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| {
                e["objectRef"]["namespace"] == n
                    && e["verb"] == "patch"
                    && e["stage"] == "ResponseComplete"
            })
            .collect();
        let missing: Vec<String> = expected
            .iter()
            .filter(|(name, key, value)| {
                !events.iter().any(|e| {
                    e["objectRef"]["name"] == *name
                        && e["annotations"][*key].as_str() == Some(value.as_str())
                })
            })
            .map(|(name, key, value)| {
                let seen: Vec<&Value> = events
                    .iter()
                    .filter(|e| e["objectRef"]["name"] == *name)
                    .map(|e| &e["annotations"])
                    .collect();
                format!("{name}: {key}={value} (seen: {seen:?})")
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("audit annotations missing:\n    {}", missing.join("\n    "));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
