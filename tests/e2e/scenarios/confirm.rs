//! How `kubectl lock` says a lock is in force, through the real API server: an UPDATE-only lock
//! is confirmed by a refused dry-run UPDATE (a dry-run DELETE would be allowed), a Warn-mode
//! lock once the webhook reports it, a lock on a missing object enforced but not tried; and
//! `kubectl lock list` counts the instances (ENFORCED) and the refused writes (BLOCKED).

use anyhow::{Result, ensure};
use serde_json::json;

use super::enforcement::wait_for;
use super::plugin::{expect, table};
use crate::kubectl::Out;
use crate::suite::{Ctx, locked};

fn ends_with(out: &Out, suffix: &str) -> Result<()> {
    let holds = out.ok() && out.stdout.ends_with(suffix);
    expect(out, holds, &format!("stdout `...{suffix}`"))
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    for name in ["update-only", "soft", "blocked"] {
        ctx.configmap(&ns, name, json!({}))?;
    }
    let lock = |args: &[&str]| {
        let mut full = vec!["lock"];
        full.extend(args);
        full.extend(["-n", n, "--timeout", "30s"]);
        ctx.k(&full)
    };
    ends_with(
        &lock(&["cm/update-only", "--operations", "UPDATE"]),
        "(enforced by 1)\n",
    )?;
    ends_with(
        &lock(&["cm/later", "--allow-missing"]),
        "(enforced by 1; not tried: the object does not exist)\n",
    )?;
    ends_with(
        &lock(&["cm/soft", "--warn"]),
        "(seen by the webhook; mode Warn: changes are allowed with a warning)\n",
    )?;
    ends_with(&lock(&["cm/blocked"]), "(enforced by 1)\n")?;

    // Two refused writes: the first Event at once, the second counted into its series.
    for _ in 0..2 {
        ctx.k(&["delete", "configmap", "blocked", "-n", n, "--wait=false"])
            .refused(&locked("configmaps", n, "blocked", None))?;
    }
    let row = wait_for(|| {
        let out = ctx.k(&["lock", "list", "-n", n]).check()?;
        let row = table(&out.stdout)
            .into_iter()
            .find(|r| r.get("NAME").map(String::as_str) == Some("blocked"));
        Ok(row.filter(|r| r.get("BLOCKED").map(String::as_str) == Some("2")))
    })
    .map_err(|e| e.context("`kubectl lock list` never showed BLOCKED 2 for the refused Lock"))?;
    ensure!(
        row.get("ENFORCED").map(String::as_str) == Some("1"),
        "lock list row of blocked: {row:?}"
    );
    Ok(())
}
