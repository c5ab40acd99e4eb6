//! Least-privileged users for scenarios about who may do what: each a client certificate issued
//! by the cluster's own signer (a CertificateSigningRequest for `kube-apiserver-client`, approved
//! by the suite), in a kubeconfig of its own, with no rights until a scenario binds some.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine;
use serde_json::json;

use crate::kubectl::Kubectl;
use crate::suite::{Ctx, ENFORCE_WITHIN, RUN_LABEL};

const SIGNER: &str = "kubernetes.io/kube-apiserver-client";
const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

/// A user with a kubeconfig of its own.
pub struct User {
    /// The user name the API server sees.
    pub name: String,
    /// kubectl (and its plugins) as this user.
    pub kubectl: Kubectl,
}

impl User {
    /// `kubectl ARGS...` as this user.
    pub fn k(&self, args: &[&str]) -> crate::kubectl::Out {
        self.kubectl.run(args)
    }

    /// `kubectl ARGS...` with stdin, as this user.
    pub fn k_in(&self, args: &[&str], stdin: &str) -> crate::kubectl::Out {
        self.kubectl.run_stdin(args, Some(stdin))
    }

    /// A merge patch of the Lock `ns/name`, as this user.
    pub fn patch_lock(
        &self,
        ns: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> crate::kubectl::Out {
        let patch = patch.to_string();
        self.k(&[
            "patch",
            "lock",
            name,
            "-n",
            ns,
            "--type=merge",
            "-p",
            &patch,
        ])
    }
}

/// A new user `kol-e2e-<run>-<what>`, member of `groups` (and system:authenticated).
pub fn user(ctx: &Ctx, what: &str, groups: &[&str]) -> Result<User> {
    let name = ctx.cluster_name(what);
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name.as_str());
    for group in groups {
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, *group);
    }
    let csr = params.serialize_request(&key)?.pem()?;
    let b64 = base64::engine::general_purpose::STANDARD;
    ctx.create(
        CSRS,
        json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
               "metadata": {"name": name, "labels": {RUN_LABEL: ctx.env.run}},
               "spec": {"request": b64.encode(csr), "signerName": SIGNER,
                        "usages": ["client auth"], "expirationSeconds": 3600}}),
    )?;
    ctx.k(&["certificate", "approve", &name])
        .check()
        .with_context(|| format!("approving the certificate of {name}"))?;
    let cert = issued(ctx, &name)?;

    let path: PathBuf = ctx.env.files.dir.join(format!("{name}.kubeconfig"));
    let certificate = json!({
        "client-certificate-data": b64.encode(cert),
        "client-key-data": b64.encode(key.serialize_pem()),
    });
    crate::webhook::kubeconfig_for(&ctx.env.kubectl, &name, certificate, &path)?;
    let mut kubectl = ctx.env.kubectl.clone();
    kubectl.kubeconfig = path;
    let whoami = kubectl.run(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    if whoami.stdout != name {
        bail!("the kubeconfig of {name} authenticates as {whoami:?}");
    }
    Ok(User { name, kubectl })
}

/// Waits for the signer (the controller manager) to issue the certificate.
fn issued(ctx: &Ctx, name: &str) -> Result<Vec<u8>> {
    let start = Instant::now();
    loop {
        let reply = ctx.rest().get(&format!("{CSRS}/{name}"))?;
        if let Some(cert) = reply.body["status"]["certificate"].as_str() {
            return Ok(base64::engine::general_purpose::STANDARD.decode(cert)?);
        }
        if start.elapsed() > Duration::from_secs(30) {
            bail!(
                "the certificate of {name} was not issued within 30s (is kube-controller-manager running?)"
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Binds `role` (a ClusterRole) to `user` in `ns`, or cluster-wide when `ns` is `None`.
pub fn bind(ctx: &Ctx, user: &User, role: &str, ns: Option<&str>) -> Result<()> {
    let binding = format!("{}-{role}", user.name);
    let args: Vec<&str> = match ns {
        Some(ns) => vec![
            "create",
            "rolebinding",
            &binding,
            "-n",
            ns,
            "--clusterrole",
            role,
            "--user",
            &user.name,
        ],
        None => vec![
            "create",
            "clusterrolebinding",
            &binding,
            "--clusterrole",
            role,
            "--user",
            &user.name,
        ],
    };
    ctx.k(&args).check()?;
    if ns.is_none() {
        let label = format!("{RUN_LABEL}={}", ctx.env.run);
        ctx.k(&["label", "clusterrolebinding", &binding, &label])
            .check()?;
    }
    let role: serde_json::Value = serde_json::from_str(
        &ctx.k(&["get", "clusterrole", role, "-o", "json"])
            .check()?
            .stdout,
    )?;
    let rule = &role["rules"][0];
    let (verb, resource, group) = (
        rule["verbs"][0].as_str().unwrap_or_default(),
        rule["resources"][0].as_str().unwrap_or_default(),
        rule["apiGroups"][0].as_str().unwrap_or_default(),
    );
    let resource = match resource.split_once('/') {
        Some((res, sub)) if !group.is_empty() => format!("{res}.{group}/{sub}"),
        _ if !group.is_empty() => format!("{resource}.{group}"),
        _ => resource.to_string(),
    };
    granted(
        &format!("{} to {}", binding, user.name),
        ns,
        verb,
        &resource,
        |args| user.k(args),
    )
}

/// Waits until the API server's authorizer has seen a new binding: it learns of bindings through
/// its own watch, so the first request after the binding's creation may still be refused.
pub fn granted(
    what: &str,
    ns: Option<&str>,
    verb: &str,
    resource: &str,
    can_i: impl Fn(&[&str]) -> crate::kubectl::Out,
) -> Result<()> {
    let mut args = vec!["auth", "can-i", verb, resource];
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    let start = Instant::now();
    loop {
        let out = can_i(&args);
        if out.stdout.trim() == "yes" {
            return Ok(());
        }
        if start.elapsed() > ENFORCE_WITHIN {
            bail!(
                "{what}: `{}` still says {:?} after {ENFORCE_WITHIN:?}: {}",
                out.cmd,
                out.stdout.trim(),
                out.stderr.trim()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
