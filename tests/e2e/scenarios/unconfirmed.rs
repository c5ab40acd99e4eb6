//! `kubectl lock` when the lock cannot be confirmed in force. In kube-system, which the
//! registration leaves out, it refuses to create the Lock (exit 1, nothing created) unless
//! `--force-unenforced`, which creates it with a note and without waiting; the webhook then
//! marks it `NotSentToWebhook` and `kubectl lock list` marks it unenforced. A lock whose dry run
//! is allowed (the caller exempts themselves) is created, reported not in force after
//! `--timeout` (exit 1), and left for `kubectl unlock`.

use std::time::{Duration, Instant};

use anyhow::{Result, bail, ensure};
use serde_json::{Value, json};

use super::plugin::expect;
use crate::kubectl::Out;
use crate::suite::Ctx;

/// The webhook writes status in the background; it must show within this.
const VISIBLE_WITHIN: Duration = Duration::from_secs(30);

pub fn run(ctx: &Ctx) -> Result<()> {
    let name = format!("kol-e2e-{}-unconfirmed", ctx.env.run);
    let result = excluded(ctx, &name);
    // Leave kube-system as it was, whatever happened.
    for kind in ["lock", "configmap"] {
        ctx.k(&[
            "delete",
            kind,
            &name,
            "-n",
            "kube-system",
            "--ignore-not-found",
        ]);
    }
    result?;
    exempt_self(ctx)
}

/// Exit `code`, one line on stderr that is exactly `error: {text}`.
fn fails_with(out: &Out, code: i32, text: &str) -> Result<()> {
    let holds = out.code() == Some(code) && out.stderr.trim_end() == format!("error: {text}");
    expect(out, holds, &format!("exit {code} and `error: {text}`"))
}

fn excluded(ctx: &Ctx, name: &str) -> Result<()> {
    ctx.configmap("kube-system", name, json!({}))?;
    let lock = format!("Lock kube-system/{name}");
    let why = "the webhook registration leaves out namespace \"kube-system\" (nothing in kube-system or kube-node-lease is sent to the webhook)";
    let out = ctx.k(&["lock", &format!("cm/{name}"), "-n", "kube-system"]);
    fails_with(
        &out,
        1,
        &format!(
            "{lock} would never be enforced: {why} (pass --force-unenforced to create it anyway)"
        ),
    )?;
    let path = format!("/apis/objectlock.dev/v1alpha1/namespaces/kube-system/locks/{name}");
    let got = ctx.rest().get(&path)?;
    ensure!(
        got.code == 404,
        "a refused kubectl lock created {lock} anyway: {} {}",
        got.code,
        got.body
    );

    // Forced: created at once, with a note, not waited for (it can never be confirmed).
    let start = Instant::now();
    let out = ctx.k(&[
        "lock",
        &format!("cm/{name}"),
        "-n",
        "kube-system",
        "--force-unenforced",
        "--timeout",
        "1m",
    ]);
    let took = start.elapsed();
    ensure!(
        out.ok()
            && out.stdout
                == format!(
                    "locked configmaps \"{name}\" in namespace \"kube-system\" with {lock} (UPDATE, DELETE; held by user \"{}\")\n",
                    ctx.env.user
                )
            && out
                .stderr
                .contains(&format!("{lock} is not enforced: {why}")),
        "`{}`: expected the lock without confirmation and a note; got exit {:?}: {} {}",
        out.cmd,
        out.code(),
        out.stdout.trim(),
        out.stderr.trim()
    );
    ensure!(
        took < Duration::from_secs(60),
        "kubectl lock --force-unenforced waited its --timeout ({took:?}) for a lock that can never be confirmed"
    );
    let start = Instant::now();
    let condition = loop {
        let lock = ctx.rest().get(&path)?.body;
        if let Some(c) = condition(&lock)
            && c.0 == "NotSentToWebhook"
        {
            ensure!(
                lock["status"]["enforcedBy"]
                    .as_array()
                    .is_none_or(|e| e.is_empty()),
                "a Lock in kube-system lists enforcing instances: {}",
                lock["status"]
            );
            break c;
        }
        if start.elapsed() > VISIBLE_WITHIN {
            bail!(
                "{lock}: no NotSentToWebhook condition within {VISIBLE_WITHIN:?}: {}",
                lock["status"]
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    ensure!(
        condition.1 == "False",
        "the NotSentToWebhook condition is not False: {condition:?}"
    );
    let listed = ctx.k(&["lock", "list", "-n", "kube-system"]).check()?;
    let row = listed
        .stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_default();
    ensure!(
        row.contains("unenforced") && listed.stderr.contains("unenforced"),
        "kubectl lock list does not mark {lock} unenforced: {}{}",
        listed.stdout,
        listed.stderr
    );
    Ok(())
}

/// The caller exempts themselves: their own dry run is allowed, so the lock never confirms.
fn exempt_self(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    ctx.configmap(n, "mine", json!({}))?;
    let user = ctx
        .k(&[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ])
        .check()?
        .stdout
        .trim()
        .to_owned();
    let out = ctx.k(&[
        "lock",
        "cm/mine",
        "-n",
        n,
        "--exempt-user",
        &user,
        "--timeout",
        "3s",
    ]);
    fails_with(
        &out,
        1,
        &format!(
            "Lock {n}/mine was created but is not in force after 3s (it stays; kubectl unlock removes it): 1 instance(s) enforce it, but a dry run of the guarded operation was allowed: the namespace or resource is not sent to the webhook (check the ValidatingWebhookConfiguration), or the API server that answered calls an instance that has not seen the lock"
        ),
    )?;
    // It stays, enforced by the webhook (for anyone but the caller), and unlocks.
    let lock = ctx
        .rest()
        .get(&format!(
            "/apis/objectlock.dev/v1alpha1/namespaces/{n}/locks/mine"
        ))?
        .body;
    ensure!(
        condition(&lock).is_some_and(|c| c.0 == "Enforcing")
            && lock["spec"]["exempt"]["users"] == json!([user]),
        "the unconfirmed Lock is not there as made: {lock}"
    );
    ctx.k(&["label", "configmap", "mine", "-n", n, "x=1"])
        .allowed()?;
    let out = ctx.k(&["unlock", "cm/mine", "-n", n]);
    ensure!(
        out.ok() && out.stdout.starts_with("unlocked configmaps \"mine\""),
        "kubectl unlock of the unconfirmed lock: {} {}",
        out.stdout,
        out.stderr
    );
    Ok(())
}

/// The Lock's `Enforced` condition as (reason, status).
fn condition(lock: &Value) -> Option<(String, String)> {
    lock["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Enforced")
        .map(|c| {
            (
                c["reason"].as_str().unwrap_or_default().to_owned(),
                c["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
}
