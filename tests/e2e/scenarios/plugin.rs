//! The kubectl plugin: `kubectl-lock` run directly and as `kubectl lock` / `kubectl unlock`
//! (found on PATH), against the real discovery, with the locks it makes enforced.

use std::collections::BTreeMap;

use anyhow::{Result, ensure};
use serde_json::json;

use super::scale::deployment;
use crate::kubectl::{self, Out};
use crate::suite::{Ctx, ENFORCE_WITHIN, locked};

pub(super) fn plugin(ctx: &Ctx, args: &[&str]) -> Out {
    let kubeconfig = ctx.env.kubectl.kubeconfig.to_string_lossy().into_owned();
    let mut full = args.to_vec();
    full.extend(["--kubeconfig", kubeconfig.as_str()]);
    kubectl::run(&ctx.env.cfg.plugin_bin, &full, None, None)
}

pub(super) type Row = BTreeMap<String, String>;

/// The rows of a kubectl-style table, cells found by the header's column offsets (a cell may
/// hold spaces: `any resource named x`).
pub(super) fn table(text: &str) -> Vec<Row> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let bytes = header.as_bytes();
    let starts: Vec<usize> = (0..bytes.len())
        .filter(|&i| bytes[i] != b' ' && (i == 0 || bytes[i - 1] == b' '))
        .collect();
    let cell = |line: &str, k: usize| -> String {
        let start = starts[k].min(line.len());
        let end = starts
            .get(k + 1)
            .map_or(line.len(), |e| (*e).min(line.len()));
        line.get(start..end).unwrap_or_default().trim().to_owned()
    };
    lines
        .map(|line| {
            (0..starts.len())
                .map(|k| (cell(header, k), cell(line, k)))
                .collect()
        })
        .collect()
}

/// `Ok` when `holds`; else what was `expected` of `out`, and what it was.
pub(super) fn expect(out: &Out, holds: bool, expected: &str) -> Result<()> {
    let (cmd, code) = (&out.cmd, out.code());
    let (stdout, stderr) = (out.stdout.trim(), out.stderr.trim());
    ensure!(
        holds,
        "`{cmd}`: expected {expected}, got exit {code:?}\n    stdout: {stdout}\n    stderr: {stderr}"
    );
    Ok(())
}

pub(super) fn stdout_starts(out: &Out, prefix: &str) -> Result<()> {
    let holds = out.ok() && out.stdout.starts_with(prefix);
    expect(out, holds, &format!("stdout `{prefix}...`"))
}

pub(super) fn fails(out: &Out, code: i32, text: &str) -> Result<()> {
    let line = out.stderr.lines().count() == 1 && out.stderr.starts_with("error: ");
    let holds = out.code() == Some(code) && line && out.stderr.contains(text);
    expect(
        out,
        holds,
        &format!("exit {code} and one line `error: ...{text}...`"),
    )
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let rest = ctx.rest();
    ctx.configmap(&ns, "app-config", json!({}))?;
    ctx.create(
        &format!("/apis/apps/v1/namespaces/{ns}/deployments"),
        deployment("web", json!({})),
    )?;
    ctx.k(&[
        "create",
        "service",
        "clusterip",
        "web",
        "-n",
        n,
        "--tcp=80:80",
    ])
    .check()?;

    // The binary itself, with an expiry and a reason.
    let out = plugin(
        ctx,
        &[
            "cm/app-config",
            "-n",
            n,
            "--for",
            "2h",
            "--reason",
            "release freeze",
        ],
    );
    stdout_starts(
        &out,
        &format!(
            "locked configmaps \"app-config\" in namespace \"{ns}\" with Lock {ns}/app-config (UPDATE, DELETE; until "
        ),
    )?;
    // Confirmed in force before it says so: the status names an instance, a dry run is refused.
    ensure!(
        out.stdout
            .trim_end()
            .ends_with("): release freeze (enforced by 1)"),
        "{}",
        out.stdout
    );
    ctx.update_enforced(&format!("/api/v1/namespaces/{ns}/configmaps/app-config"))?;
    ctx.k(&["delete", "configmap", "app-config", "-n", n, "--wait=false"])
        .refused(&locked(
            "configmaps",
            n,
            "app-config",
            Some("release freeze"),
        ))?;

    // Through kubectl, which finds kubectl-lock on PATH; a kind name resolved by discovery.
    let out = ctx.k(&["lock", "Deployment.apps/web", "-n", n]);
    stdout_starts(
        &out,
        &format!(
            "locked deployments.apps \"web\" in namespace \"{ns}\" with Lock {ns}/web (UPDATE, DELETE; \
             held by user \"{}\")",
            ctx.env.user
        ),
    )?;
    let deploy = format!("/apis/apps/v1/namespaces/{ns}/deployments/web");
    ctx.update_enforced(&deploy)?;
    ctx.k(&["scale", "deploy", "web", "-n", n, "--replicas=2"])
        .refused(&locked("deployments.apps", n, "web", None))?;
    // The lock covers the Deployment only; the Service of the same name cannot get its own.
    ctx.k(&["label", "service", "web", "-n", n, "x=1"])
        .allowed()?;
    fails(
        &ctx.k(&["lock", "svc/web", "-n", n]),
        1,
        &format!("Lock {ns}/web already exists"),
    )?;
    fails(&ctx.k(&["lock", "cm/missing", "-n", n]), 1, "missing")?;
    let out = ctx.k(&["lock", "cm/missing", "-n", n, "--allow-missing"]);
    stdout_starts(&out, "locked configmaps \"missing\"")?;
    fails(&ctx.k(&["lock", "cm/x", "--bogus"]), 2, "--bogus")?;
    fails(&ctx.k(&["lock", "widgets/x", "-n", n]), 1, "widgets")?;

    // list: the namespace (no NAMESPACE column, as kubectl get -n), then every namespace.
    let out = ctx.k(&["lock", "list", "-n", n]).check()?;
    let rows = table(&out.stdout);
    let header = out.stdout.lines().next().unwrap_or_default();
    ensure!(
        [
            "NAME", "KIND", "COVERS", "TARGET", "MODE", "EXPIRES", "REASON"
        ]
        .iter()
        .all(|c| header.contains(c)),
        "lock list header: {}",
        out.stdout
    );
    let row = |rows: &[Row], ns: Option<&str>, name: &str| -> Row {
        rows.iter()
            .find(|r| {
                r.get("NAME").map(String::as_str) == Some(name)
                    && ns.is_none_or(|ns| r.get("NAMESPACE").map(String::as_str) == Some(ns))
            })
            .cloned()
            .unwrap_or_default()
    };
    let cells = |r: &Row, cols: &[&str]| -> Vec<String> {
        cols.iter()
            .map(|c| r.get(*c).cloned().unwrap_or_default())
            .collect()
    };
    let cols = ["KIND", "COVERS", "TARGET", "MODE"];
    let app = row(&rows, None, "app-config");
    ensure!(
        cells(&app, &cols) == ["Lock", "configmaps", "exists", "Enforce"]
            && app
                .get("EXPIRES")
                .is_some_and(|e| e.starts_with("1h5") || e.starts_with("2h"))
            && app.get("REASON").map(String::as_str) == Some("release freeze"),
        "lock list row of app-config: {app:?}\n{}",
        out.stdout
    );
    let web = row(&rows, None, "web");
    ensure!(
        cells(&web, &["KIND", "COVERS", "TARGET", "MODE", "EXPIRES"])
            == ["Lock", "deployments.apps", "exists", "Enforce", "never"],
        "lock list row of web: {web:?}"
    );
    let missing = row(&rows, None, "missing");
    ensure!(
        cells(&missing, &["COVERS", "TARGET"]) == ["configmaps", "missing"],
        "lock list row of missing: {missing:?}"
    );
    let all = ctx.k(&["lock", "list", "-A"]).check()?;
    let app = row(&table(&all.stdout), Some(n), "app-config");
    ensure!(
        cells(&app, &cols) == ["Lock", "configmaps", "exists", "Enforce"],
        "lock list -A lacks {n}/app-config: {}",
        all.stdout
    );
    let empty_ns = ctx.namespace("empty")?;
    let out = ctx.k(&["lock", "list", "-n", &empty_ns]);
    ensure!(
        out.ok() && !out.stdout.lines().any(|l| l.starts_with(empty_ns.as_str())),
        "lock list of an empty namespace: {} {}",
        out.stdout,
        out.stderr
    );

    // A cluster-scoped object gets a ClusterLock; -n is ignored with a note.
    let target_ns = ctx.namespace("target")?;
    let out = ctx.k(&["lock", &format!("ns/{target_ns}"), "-n", n]);
    stdout_starts(
        &out,
        &format!("locked namespaces \"{target_ns}\" with ClusterLock {target_ns}"),
    )?;
    ensure!(
        out.stderr.contains("note: "),
        "no note about -n: {}",
        out.stderr
    );
    ctx.update_enforced(&format!("/api/v1/namespaces/{target_ns}"))?;
    let listed = ctx.k(&["lock", "list", "-n", n]).check()?;
    let cluster = row(&table(&listed.stdout), None, &target_ns);
    ensure!(
        cells(&cluster, &["KIND", "COVERS", "TARGET"]) == ["ClusterLock", "namespaces", "exists"],
        "lock list -n does not show the ClusterLock: {}",
        listed.stdout
    );
    let out = ctx.k(&["unlock", &format!("namespace/{target_ns}")]);
    stdout_starts(&out, &format!("unlocked namespaces \"{target_ns}\""))?;

    // unlock, by kubectl unlock (the same binary under its other name).
    let out = ctx.k(&["unlock", "deploy/web", "-n", n]);
    stdout_starts(
        &out,
        &format!("unlocked deployments.apps \"web\" in namespace \"{ns}\" (deleted Lock {ns}/web)"),
    )?;
    ctx.released("deployment update after unlock", ENFORCE_WITHIN, || {
        rest.probe_update(&deploy)
    })?;
    ctx.k(&["scale", "deploy", "web", "-n", n, "--replicas=2"])
        .allowed()?;
    fails(
        &ctx.k(&["unlock", "deploy/web", "-n", n]),
        1,
        &format!("no lock on deployments.apps \"web\" in namespace \"{ns}\""),
    )?;
    // A lock covering another resource is left alone.
    fails(
        &ctx.k(&["unlock", "secret/app-config", "-n", n]),
        1,
        "covers",
    )?;
    Ok(())
}
