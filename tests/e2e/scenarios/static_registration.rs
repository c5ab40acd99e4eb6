//! The registration from a file, as the README's *Register from a file* sets it up: `manifests
//! static` in a directory, `manifests apiserver --static-manifests-dir` for the
//! AdmissionConfiguration, the API server restarted with it (and, before Kubernetes 1.37, the
//! feature gate `ManifestBasedAdmissionControlConfig`), the webhook with
//! `registration.narrow = false`, the API registration deleted. A Lock is then enforced through
//! the static registration alone, its status says so, and the registration can be neither
//! deleted nor shadowed through the API. Moving the file out of the directory (the emergency
//! unlock) withdraws it without a restart; moving it back restores it. At the end the API
//! registration, the webhook and the API server's flags are as they were.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::json;

use crate::harness::Harness;
use crate::kubectl::run as exec;
use crate::rest::until_refused;
use crate::scenarios::sigterm::{instances, poll};
use crate::suite::{Ctx, ENFORCE_WITHIN, NAMESPACED_DENIAL, locked, skip};
use crate::webhook::{self, REGISTRATION, URL};

/// The feature gate of manifest-based admission (alpha in 1.36).
const GATE: &str = "ManifestBasedAdmissionControlConfig";
/// The configuration's name in the manifest.
const STATIC_NAME: &str = "kube-object-lock.static.k8s.io";
/// How long a change of the directory may take to show: the API server watches it, with a
/// poll every minute behind the watch.
const RELOAD_WITHIN: Duration = Duration::from_secs(90);

pub fn run(ctx: &Ctx) -> Result<()> {
    let env = ctx.env;
    env.needs_local()?;
    let harness = (env.cfg.harness.as_ref()).context("the local control plane")?;
    let Some(gate) = gate_flag(harness)? else {
        return skip(format!(
            "this kube-apiserver has no manifest-based admission (no feature gate {GATE} in its --help)"
        ));
    };
    let dir = env.files.dir.join("static");
    let manifests = dir.join("manifests");
    std::fs::create_dir_all(&manifests)?;
    let bin = &env.cfg.server_bin;
    let (ca, url) = (env.files.pki("ca.crt"), URL.to_owned());
    let ca = ca.to_string_lossy();
    let yaml = exec(
        bin,
        &["manifests", "static", "--ca-file", &ca, "--url", &url],
        None,
        None,
    )
    .check()?
    .stdout;
    std::fs::write(manifests.join("kube-object-lock.yaml"), yaml)?;
    let apiserver = dir.join("apiserver");
    let path = |p: &Path| p.to_string_lossy().into_owned();
    exec(
        bin,
        &[
            "manifests",
            "apiserver",
            "--client-cert",
            &path(&env.files.pki("apiserver-client.crt")),
            "--client-key",
            &path(&env.files.pki("apiserver-client.key")),
            "--url",
            &url,
            "--dir",
            &path(&apiserver),
            "--static-manifests-dir",
            &path(&manifests),
        ],
        None,
        None,
    )
    .check()?;
    let previous = (env.apiserver_args.lock().ok())
        .and_then(|a| a.clone())
        .unwrap_or_default();
    let args = format!(
        "--admission-control-config-file={} {gate}",
        apiserver.join("admission-config.yaml").display()
    );
    let took = harness.restart(&args);
    let result = took.and_then(|took| {
        ctx.note(format!(
            "API server restarted with {GATE} and the static manifest in {:.1}s",
            took.as_secs_f64()
        ));
        // No API registration left for the instance to narrow: it keeps none.
        ctx.with_webhook_settings(
            &[("KUBE_OBJECT_LOCK__REGISTRATION__NARROW", "false")],
            || from_the_file(ctx, &manifests),
        )
    });
    let restored = restore(ctx, harness, &previous);
    result?;
    restored
}

/// The `--feature-gates` flag the API server needs for manifest-based admission (empty when it
/// is on by default), or `None` when it has none.
fn gate_flag(harness: &Harness) -> Result<Option<String>> {
    let bin = harness.dir.join("bin/kube-apiserver");
    let help = std::process::Command::new(&bin)
        .arg("--help")
        .output()
        .with_context(|| format!("{} --help", bin.display()))?;
    let text = String::from_utf8_lossy(&help.stdout);
    let Some(line) = text.lines().find(|l| l.contains(&format!("{GATE}="))) else {
        return Ok(None);
    };
    Ok(Some(if line.contains("default=true") {
        String::new()
    } else {
        format!("--feature-gates={GATE}=true")
    }))
}

/// The checks with the API registration gone.
fn from_the_file(ctx: &Ctx, manifests: &Path) -> Result<()> {
    ctx.k(&["delete", "validatingwebhookconfiguration", REGISTRATION])
        .check()?;
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    ctx.configmap(n, "held", json!({}))?;
    ctx.configmap(n, "free", json!({}))?;
    let held = format!("/api/v1/namespaces/{n}/configmaps/held");
    let free = format!("/api/v1/namespaces/{n}/configmaps/free");
    let message = format!(
        "{NAMESPACED_DENIAL}{}",
        locked("configmaps", n, "held", Some("static"))
    );
    ctx.lock(n, "held", json!({"reason": "static"}))?;
    let enforced = ctx.update_enforced(&held)?;
    enforced.refusal.refused("update of held", &message)?;
    ctx.rest()
        .probe_update(&free)?
        .allowed("an unlocked update through the static registration")?;
    // The instance vouches for it (what `kubectl lock` waits for): it keeps no registration.
    let lock = format!("/apis/objectlock.dev/v1alpha1/namespaces/{n}/locks/held");
    poll(ENFORCE_WITHIN, || {
        let lock = ctx.rest().get(&lock)?.body;
        Ok((!instances(&lock).is_empty()).then_some(()))
    })
    .context("the Lock's status never named an instance enforcing it")?;
    ctx.note(format!(
        "API registration deleted: a Lock enforced through the static one {:.0} ms after its creation, its status Enforced",
        enforced.after.as_secs_f64() * 1000.0
    ));

    // Not in the API: neither deleted nor replaced through it.
    let delete = ctx.k(&["delete", "validatingwebhookconfiguration", STATIC_NAME]);
    ensure!(
        !delete.ok() && delete.stderr.contains("NotFound"),
        "deleting {STATIC_NAME} through the API: {}{}",
        delete.stderr.trim(),
        delete.stdout.trim()
    );
    let shadow = json!({"apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration", "metadata": {"name": STATIC_NAME}});
    let created = ctx.rest().post(
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
        &shadow,
    )?;
    ensure!(
        created.code == 422 && created.message().contains("reserved"),
        "creating {STATIC_NAME} through the API: {} {}",
        created.code,
        created.message()
    );
    ctx.rest()
        .probe_update(&held)?
        .refused("update of held after the API tried", &message)?;

    // The emergency unlock: the file out of the directory, no restart.
    let file = manifests.join("kube-object-lock.yaml");
    let aside = manifests.with_file_name("kube-object-lock.yaml.aside");
    std::fs::rename(&file, &aside)?;
    let out = ctx.released("update of held, the file moved out", RELOAD_WITHIN, || {
        ctx.rest().probe_update(&held)
    });
    std::fs::rename(&aside, &file)?;
    let out = out?;
    let back = until_refused(RELOAD_WITHIN, || ctx.rest().probe_update(&held))
        .context("the manifest moved back, yet the Lock is not enforced")?;
    back.refusal
        .refused("update of held, the file back", &message)?;
    ctx.figure(format!(
        "static registration: the file moved out of the directory, writes allowed {:.1}s later; moved back, refused {:.1}s later (no restart)",
        out.as_secs_f64(),
        back.after.as_secs_f64()
    ));
    Ok(())
}

/// The API registration applied again, the API server restarted with the flags it had, and the
/// registration in force (the run's sentinel Lock refuses again).
fn restore(ctx: &Ctx, harness: &Harness, previous: &str) -> Result<()> {
    let env = ctx.env;
    let sa = format!("{}/kube-object-lock", env.system_ns);
    let mut errors = Vec::new();
    if let Err(e) = webhook::register(&env.cfg.server_bin, &env.kubectl, &env.files, &sa) {
        errors.push(format!("registering again: {e:#}"));
    }
    if let Err(e) = harness.restart(previous) {
        errors.push(format!("restarting the API server as it was: {e:#}"));
    }
    let sentinel = format!("/api/v1/namespaces/{}/configmaps/sentinel", env.system_ns);
    let start = Instant::now();
    if let Err(e) = until_refused(Duration::from_secs(60), || {
        ctx.rest().probe_delete(&sentinel)
    }) {
        errors.push(format!(
            "the API registration not in force again after {:.0}s: {e:#}",
            start.elapsed().as_secs_f64()
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        bail!("{}", errors.join("; "))
    }
}
