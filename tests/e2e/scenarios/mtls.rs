//! mTLS as the README sets it up: `certs --client`, `manifests apiserver`, the API server with
//! `--admission-control-config-file`, `serve` with `tls.client_ca`. A locked write refused
//! through the API server shows it presented its client certificate; a client without one is
//! refused by the webhook itself. On the way, with the webhook stopped: `failurePolicy: Fail`
//! refuses writes, while unlocking and kube-system still work (the emergency-unlock section).

use std::path::Path;

use anyhow::{Context, Result, ensure};
use serde_json::json;

use crate::kubectl::run as exec;
use crate::suite::{Ctx, NAMESPACED_DENIAL, locked};
use crate::webhook::{Serve, URL};

pub fn run(ctx: &Ctx) -> Result<()> {
    let env = ctx.env;
    env.needs_local()?;
    if let Some(took) = env.restarted()? {
        ctx.note(format!(
            "API server restarted with the AdmissionConfiguration in {:.1}s",
            took.as_secs_f64()
        ));
    }
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    ctx.configmap(&ns, "m", json!({}))?;
    ctx.configmap(&ns, "free", json!({}))?;

    // The webhook stopped.
    let running = env.serve.lock().ok().and_then(|mut s| s.take());
    if let Some(serve) = running {
        serve.stop()?;
    }
    // The registration is narrowed to the locked names: an unlocked object never waits on
    // the webhook (the narrowing scenario checks that locked ones are refused).
    ctx.k(&["label", "configmap", "free", "-n", n, "x=1"])
        .allowed()
        .context("updating an unlocked object with the webhook stopped")?;
    ctx.lock(&ns, "tmp", json!({}))?;
    ctx.k(&["delete", "lock", "tmp", "-n", n])
        .allowed()
        .context("unlocking with the webhook stopped")?;
    let ks = format!("kol-e2e-{}-mtls", env.run);
    let kube_system = (|| -> Result<()> {
        ctx.k(&["create", "configmap", &ks, "-n", "kube-system"])
            .check()?;
        ctx.k(&["label", "configmap", &ks, "-n", "kube-system", "x=1"])
            .allowed()?;
        Ok(())
    })();
    ctx.k(&[
        "delete",
        "configmap",
        &ks,
        "-n",
        "kube-system",
        "--ignore-not-found",
    ]);
    kube_system.context("kube-system with the webhook stopped")?;

    // Started again, requiring client certificates.
    let serve = Serve::start(&env.cfg.server_bin, &env.files, true)?;
    if let Ok(mut s) = env.serve.lock() {
        *s = Some(serve);
    }
    ctx.lock(&ns, "m", json!({"reason": "mtls"}))?;
    let path = format!("/api/v1/namespaces/{ns}/configmaps/m");
    let enforced = ctx.update_enforced(&path)?;
    ctx.note(format!(
        "with client certificates required, a Lock was enforced {:.0} ms after creation",
        enforced.after.as_secs_f64() * 1000.0
    ));
    let message = format!(
        "{NAMESPACED_DENIAL}{}",
        locked("configmaps", n, "m", Some("mtls"))
    );
    ctx.k(&["delete", "configmap", "m", "-n", n])
        .refused(&message)?;
    ctx.k(&["label", "configmap", "free", "-n", n, "x=1"])
        .allowed()?;

    // Directly: without a client certificate the handshake fails; with the API server's, the
    // review is answered.
    let curl = Path::new("curl");
    if !exec(curl, &["--version"], None, None).ok() {
        ctx.note("no curl: the direct check without a client certificate is left out");
        return Ok(());
    }
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/configmap-delete-unlocked.json");
    let data = format!("@{}", fixture.display());
    let ca = env.files.pki("ca.crt");
    let ca = ca.to_string_lossy();
    let base = [
        "-sS",
        "--max-time",
        "5",
        "--cacert",
        &ca,
        "-H",
        "content-type: application/json",
        "--data-binary",
        &data,
    ];
    let mut without = base.to_vec();
    without.push(URL);
    let out = exec(curl, &without, None, None);
    ensure!(
        !out.ok() && out.stdout.is_empty(),
        "curl without a client certificate was answered: {}",
        out.stdout
    );
    ctx.note(format!(
        "curl without a client certificate: {}",
        out.stderr.trim()
    ));
    let (cert, key) = (
        env.files.pki("apiserver-client.crt"),
        env.files.pki("apiserver-client.key"),
    );
    let (cert, key) = (cert.to_string_lossy(), key.to_string_lossy());
    let mut with = base.to_vec();
    with.extend(["--cert", &cert, "--key", &key, URL]);
    let out = exec(curl, &with, None, None).check()?;
    ensure!(
        out.stdout.contains("\"allowed\":true"),
        "curl with the client certificate: {}",
        out.stdout
    );
    Ok(())
}
