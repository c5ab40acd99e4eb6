//! Rule 5: DELETECOLLECTION reaches admission as one DELETE per item without `request.name`;
//! the locked item is found by `oldObject.metadata.name` and survives. The API server deletes
//! the items in name order and gives up at the first refusal (one deletion worker by default):
//! the items before the locked one are gone, those after it stay.

use anyhow::{Result, ensure};
use serde_json::json;

use crate::suite::{Ctx, locked};

const REASON: &str = "keep b";

fn names(ctx: &Ctx, ns: &str) -> Result<Vec<String>> {
    let out = ctx
        .k(&["get", "configmaps", "-n", ns, "-l", "batch=1", "-o", "name"])
        .check()?;
    Ok(out
        .stdout
        .lines()
        .map(|l| l.trim_start_matches("configmap/").to_owned())
        .collect())
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    for name in ["a", "b", "c"] {
        ctx.configmap(&ns, name, json!({"batch": "1"}))?;
    }
    ctx.lock(&ns, "b", json!({"reason": REASON}))?;
    ctx.delete_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/b"))?;
    let message = locked("configmaps", &ns, "b", Some(REASON));
    let collection = format!("/api/v1/namespaces/{ns}/configmaps?labelSelector=batch%3D1");

    // Dry run: refused, nothing deleted.
    let reply = ctx.rest().delete(&format!("{collection}&dryRun=All"))?;
    ensure!(
        !reply.ok() && reply.message().contains(&message),
        "dry-run DELETECOLLECTION: expected the lock's refusal, got {} {}",
        reply.code,
        reply.message()
    );
    ensure!(
        names(ctx, &ns)? == ["a", "b", "c"],
        "a dry run deleted something"
    );

    // kubectl, as the README's rule 5 has it.
    let out = ctx.k(&["delete", "--raw", &collection]);
    ensure!(
        !out.ok() && out.stderr.contains(&message),
        "kubectl delete --raw on the collection: expected the lock's refusal, got: {} {}",
        out.stdout.trim(),
        out.stderr.trim()
    );
    let left = names(ctx, &ns)?;
    ensure!(
        !left.contains(&"a".to_owned()) && left.contains(&"b".to_owned()),
        "after DELETECOLLECTION: {left:?}, expected a deleted and the locked b kept"
    );
    ctx.note(format!(
        "left after DELETECOLLECTION of a, b (locked), c: {left:?}"
    ));

    // The REST API: what status the whole request gets.
    ctx.configmap(&ns, "a2", json!({"batch": "1"}))?;
    let reply = ctx.rest().delete(&collection)?;
    ensure!(
        !reply.ok() && reply.message().contains(&message),
        "DELETECOLLECTION: expected the lock's refusal, got {} {}",
        reply.code,
        reply.message()
    );
    ctx.note(format!(
        "DELETECOLLECTION with one locked item: HTTP {} {}",
        reply.code,
        reply.reason()
    ));
    let left = names(ctx, &ns)?;
    ensure!(
        !left.contains(&"a2".to_owned()) && left.contains(&"b".to_owned()),
        "after DELETECOLLECTION over REST: {left:?}, expected a2 deleted and b kept"
    );
    Ok(())
}
