//! Certificate rotation under load: while a client keeps writing through the API server, the
//! serving pair is replaced with one from a new `certs` run (a new CA: `certs` makes one each
//! time), in the three steps of the README (*Operations*, Certificate rotation): a caBundle
//! trusting the old and the new CA, the new pair installed over the files `serve` reads and
//! SIGHUP (what `systemctl reload` sends), then a caBundle of the new CA alone.
//!
//! The caBundle is changed with a patch of the registration's entries, not by re-applying
//! `manifests cluster`: that resets the narrowed registration to `may-be-locked: false`, so
//! until the webhook writes its conditions again (milliseconds, *Narrowed or broad*) the API
//! server sends nothing, and a locked write in that window is allowed.
//!
//! The client's writes all reach the webhook: a selector Lock in the namespace sends every write
//! of it there (narrowed registration), so an unlocked ConfigMap's dry-run updates are allowed
//! by the webhook itself and the locked one's are refused with the lock's message. Every
//! answer is counted; any other (a failed webhook call, a TLS error, a timeout, a locked write
//! allowed) is a failed admission and fails the scenario. The served certificate is read with
//! a TLS handshake of the test's own. After the last step the API server trusts only the new
//! CA, and a changed caBundle gives it a new client (new connections): the answers after it
//! come over the new pair. The suite's files are left holding the new pair and CA for the
//! scenarios after.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;

use crate::env::WebhookMode;
use crate::kubectl::run as exec;
use crate::rest::Reply;
use crate::scenarios::metrics::{requests, scrape};
use crate::suite::{Ctx, NAMESPACED_DENIAL, locked, skip};
use crate::webhook::{self, METRICS_PORT, PORT};

/// Answers of each kind the client must have seen in a phase before the next begins.
const EACH: usize = 5;
/// How long the client keeps going once the last step is applied.
const AFTER: Duration = Duration::from_secs(5);
/// Generous bounds for the waits (a shared machine).
const WITHIN: Duration = Duration::from_secs(60);

/// Before the first step; during the rotation (from the first step to the last); after it.
const PHASES: [&str; 3] = ["before", "during", "after"];

#[derive(Default)]
struct Tally {
    allowed: [usize; 3],
    refused: [usize; 3],
    failed: usize,
    /// The first few failures, as the client saw them.
    failures: Vec<String>,
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let env = ctx.env;
    if env.cfg.mode != WebhookMode::Own {
        return skip(
            "KOL_E2E_WEBHOOK=external: the webhook's certificate files are not the suite's",
        );
    }
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    ctx.configmap(n, "held", json!({}))?;
    ctx.configmap(n, "free", json!({}))?;
    ctx.lock(n, "held", json!({"reason": "rotation"}))?;
    // Selects nothing, but sends every write of the namespace to the webhook.
    ctx.lock(
        n,
        "all-sent",
        json!({"selector": {"matchLabels": {"objectlock.dev/e2e-never": "1"}}}),
    )?;
    let held = format!("/api/v1/namespaces/{n}/configmaps/held");
    let free = format!("/api/v1/namespaces/{n}/configmaps/free");
    ctx.update_enforced(&held)?;
    let allowed_series = requests("UPDATE", "allowed");
    let start = Instant::now();
    loop {
        let before = scrape(METRICS_PORT)?.get(&allowed_series);
        ctx.rest()
            .probe_update(&free)?
            .allowed("dry-run update of the unlocked ConfigMap")?;
        if scrape(METRICS_PORT)?.get(&allowed_series) > before {
            break;
        }
        ensure!(
            start.elapsed() < WITHIN,
            "the unlocked ConfigMap's writes never reached the webhook (the selector Lock is not in the registration)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let message = format!(
        "{NAMESPACED_DENIAL}{}",
        locked("configmaps", n, "held", Some("rotation"))
    );

    let dir = env.files.dir.join("rotation");
    std::fs::create_dir_all(&dir)?;
    let old_ca = dir.join("ca-old.crt");
    std::fs::copy(env.files.pki("ca.crt"), &old_ca)?;
    let old_served = served(ctx, &[&old_ca])?;
    let allowed_before = scrape(METRICS_PORT)?.get(&allowed_series);

    let phase = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let tally = Mutex::new(Tally::default());
    let rest = ctx.rest();
    let rotation = std::thread::scope(|scope| {
        let client = scope.spawn(|| {
            let mut locked_one = false;
            while !stop.load(Ordering::SeqCst) {
                locked_one = !locked_one;
                let path = if locked_one { &held } else { &free };
                let reply = rest.probe_update(path);
                let now = phase.load(Ordering::SeqCst);
                let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
                match classify(reply, locked_one, &message) {
                    Ok(true) => t.allowed[now] += 1,
                    Ok(false) => t.refused[now] += 1,
                    Err(e) => {
                        t.failed += 1;
                        if t.failures.len() < 5 {
                            t.failures
                                .push(format!("{} ({}): {e:#}", path, PHASES[now]));
                        }
                    }
                }
                drop(t);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let rotation = rotate(ctx, &dir, &old_ca, &phase, &tally);
        stop.store(true, Ordering::SeqCst);
        match client.join() {
            Ok(()) => rotation,
            Err(_) => Err(anyhow::anyhow!("the client thread panicked")),
        }
    });
    let tally = tally.into_inner().unwrap_or_else(|e| e.into_inner());
    // The failures first: they are the point.
    ensure!(
        tally.failed == 0,
        "{} failed admission(s) while the certificate was rotated: {}",
        tally.failed,
        tally.failures.join("; ")
    );
    let rotation = rotation?;
    for (i, name) in PHASES.iter().enumerate() {
        ensure!(
            tally.allowed[i] > 0 && tally.refused[i] > 0,
            "{name} the rotation: {} allowed and {} refused answers, expected both",
            tally.allowed[i],
            tally.refused[i]
        );
    }
    ensure!(
        rotation.served != old_served,
        "the new certificate is the old one"
    );
    // Every allowed answer came from the webhook, not from the API server alone.
    let allowed: usize = tally.allowed.iter().sum();
    let refused: usize = tally.refused.iter().sum();
    let moved = scrape(METRICS_PORT)?.get(&allowed_series) - allowed_before;
    ensure!(
        moved >= allowed as f64,
        "the webhook counted {moved} allowed UPDATEs, fewer than the {allowed} the client saw allowed"
    );
    let rotating = tally.allowed[1] + tally.refused[1];
    ctx.note(format!(
        "served serial {} before, {} after; expiry metric {}",
        rotation.old_serial, rotation.new_serial, rotation.expiry
    ));
    ctx.figure(format!(
        "{} writes, {rotating} of them during the rotation: {allowed} allowed, {refused} refused, 0 failed; new certificate served {:.0} ms after the files were replaced (SIGHUP), {:.1}s after the first step",
        allowed + refused,
        rotation.after_install.as_secs_f64() * 1000.0,
        rotation.after_start.as_secs_f64()
    ));
    Ok(())
}

/// `Ok(true)` allowed, `Ok(false)` refused with the lock's message, `Err` anything else.
fn classify(reply: Result<Reply>, locked_one: bool, message: &str) -> Result<bool> {
    let reply = reply?;
    if locked_one {
        reply.refused("dry-run update of the locked ConfigMap", message)?;
        Ok(false)
    } else {
        reply.allowed("dry-run update of the unlocked ConfigMap")?;
        Ok(true)
    }
}

/// What the rotation saw.
struct Rotation {
    /// The certificate served at the end (DER).
    served: Vec<u8>,
    old_serial: String,
    new_serial: String,
    /// From the new files in place (and SIGHUP) to the new certificate served.
    after_install: Duration,
    /// From the first step (its 3 s pause included) to the new certificate served.
    after_start: Duration,
    /// `certificate_expiry_timestamp_seconds` once the new pair is served.
    expiry: i64,
}

/// The README's three steps, with the client running; moves `phase` on.
fn rotate(
    ctx: &Ctx,
    dir: &Path,
    old_ca: &Path,
    phase: &AtomicUsize,
    tally: &Mutex<Tally>,
) -> Result<Rotation> {
    let env = ctx.env;
    let bin = &env.cfg.server_bin;
    wait_for_answers(tally, 0)?;
    let old_serial = serial(&served(ctx, &[old_ca])?)?;

    // 1. A new pair (and CA), and a caBundle trusting both CAs.
    let start = Instant::now();
    phase.store(1, Ordering::SeqCst);
    let new = dir.join("pki-new");
    exec(
        bin,
        &[
            "certs",
            "--out",
            &new.to_string_lossy(),
            "--san",
            "127.0.0.1",
        ],
        None,
        None,
    )
    .check()?;
    let new_ca = new.join("ca.crt");
    let both = dir.join("ca-both.crt");
    let mut bundle = std::fs::read(old_ca)?;
    bundle.extend(std::fs::read(&new_ca)?);
    std::fs::write(&both, bundle)?;
    set_ca_bundle(ctx, &both).context("step 1: the caBundle of both CAs")?;
    // The API servers must have the new bundle before the webhook serves the new pair (the
    // README's steps run on different machines); they watch the registration.
    std::thread::sleep(Duration::from_secs(3));

    // 2. The new pair over the files `serve` reads, as the README installs it; then reload.
    let pki = env.files.dir.join("pki");
    let (crt, key) = (new.join("tls.crt"), new.join("tls.key"));
    exec(
        Path::new("install"),
        &[
            "-m",
            "0600",
            &crt.to_string_lossy(),
            &key.to_string_lossy(),
            &pki.to_string_lossy(),
        ],
        None,
        None,
    )
    .check()
    .context("step 2: installing the new pair")?;
    let installed = Instant::now();
    // The suite's ca.crt follows the pair (curl in the scenarios after, a later `register`).
    for file in ["ca.crt", "ca.key"] {
        std::fs::copy(new.join(file), pki.join(file))?;
    }
    let pid = env
        .serve
        .lock()
        .ok()
        .and_then(|s| s.as_ref().map(|s| s.pid()))
        .context("the suite's webhook is not running")?;
    let pid = rustix::process::Pid::from_raw(pid as i32).context("no pid")?;
    rustix::process::kill_process(pid, rustix::process::Signal::HUP)
        .context("SIGHUP to the webhook")?;
    let expected: Vec<u8> = CertificateDer::pem_file_iter(&crt)?
        .next()
        .context("no certificate in the new tls.crt")??
        .to_vec();
    let roots = [old_ca, new_ca.as_path()];
    let served_now = loop {
        // A handshake that fails is a finding too: the webhook must serve one pair or the other.
        let served_now = served(ctx, &roots).context("a handshake during the rotation")?;
        if served_now == expected {
            break served_now;
        }
        ensure!(
            installed.elapsed() < WITHIN,
            "the webhook still serves the old certificate {WITHIN:?} after the new one was installed and SIGHUP sent; log: {}",
            webhook::tail(&env.files.log(), 10)
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let (after_install, after_start) = (installed.elapsed(), start.elapsed());

    // 3. Trust only the new CA.
    set_ca_bundle(ctx, &new_ca).context("step 3: the caBundle of the new CA")?;
    phase.store(2, Ordering::SeqCst);
    let applied = Instant::now();
    wait_for_answers(tally, 2)?;
    std::thread::sleep(AFTER.saturating_sub(applied.elapsed()));
    ensure!(
        served(ctx, &[&new_ca])? == expected,
        "after the last step, the webhook does not serve the new certificate"
    );
    health()?;
    let expiry = scrape(METRICS_PORT)?.get("kube_object_lock_certificate_expiry_timestamp_seconds");
    let not_after = not_after(&expected)?;
    ensure!(
        expiry as i64 == not_after,
        "kube_object_lock_certificate_expiry_timestamp_seconds is {expiry}, the new certificate's end is {not_after}"
    );
    Ok(Rotation {
        new_serial: serial(&served_now)?,
        served: served_now,
        old_serial,
        after_install,
        after_start,
        expiry: expiry as i64,
    })
}

/// Sets the caBundle of every entry of the registration to the PEM file `ca` (a strategic merge
/// patch keyed by the entries' names; nothing else changes).
fn set_ca_bundle(ctx: &Ctx, ca: &Path) -> Result<()> {
    use base64::Engine;
    let reply = ctx.rest().get(&format!(
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{}",
        webhook::REGISTRATION
    ))?;
    ensure!(
        reply.ok(),
        "GET the registration: {} {}",
        reply.code,
        reply.message()
    );
    let bundle = base64::engine::general_purpose::STANDARD.encode(std::fs::read(ca)?);
    let entries: Vec<_> = reply.body["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["name"].as_str())
        .map(|name| json!({"name": name, "clientConfig": {"caBundle": bundle}}))
        .collect();
    ensure!(!entries.is_empty(), "the registration has no entries");
    let patch = json!({"webhooks": entries}).to_string();
    ctx.k(&[
        "patch",
        "validatingwebhookconfiguration",
        webhook::REGISTRATION,
        "--type=strategic",
        "-p",
        &patch,
    ])
    .check()?;
    Ok(())
}

/// Waits until the client has seen both kinds of answers [`EACH`] times in `phase` (or failed).
fn wait_for_answers(tally: &Mutex<Tally>, phase: usize) -> Result<()> {
    let start = Instant::now();
    loop {
        {
            let t = tally.lock().unwrap_or_else(|e| e.into_inner());
            if t.failed > 0 {
                bail!("failed admissions: {}", t.failures.join("; "));
            }
            if t.allowed[phase] >= EACH && t.refused[phase] >= EACH {
                return Ok(());
            }
            ensure!(
                start.elapsed() < WITHIN,
                "{} the rotation: only {} allowed and {} refused answers in {WITHIN:?}",
                PHASES[phase],
                t.allowed[phase],
                t.refused[phase]
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The certificate the webhook serves (DER), from a handshake verified against `cas`. The
/// client presents the API server's client certificate, in case `tls.client_ca` is set.
fn served(ctx: &Ctx, cas: &[&Path]) -> Result<Vec<u8>> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in cas {
        for cert in CertificateDer::pem_file_iter(ca)? {
            roots.add(cert?)?;
        }
    }
    let files = &ctx.env.files;
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(files.pki("apiserver-client.crt"))?
            .collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_file(files.pki("apiserver-client.key"))?;
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    let name = ServerName::try_from("127.0.0.1")?.to_owned();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name)?;
    let mut sock = TcpStream::connect(("127.0.0.1", PORT))?;
    sock.set_read_timeout(Some(Duration::from_secs(5)))?;
    sock.set_write_timeout(Some(Duration::from_secs(5)))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)
            .with_context(|| format!("TLS handshake with 127.0.0.1:{PORT}"))?;
    }
    let cert = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .context("the webhook presented no certificate")?
        .to_vec();
    conn.send_close_notify();
    let _ = conn.complete_io(&mut sock);
    Ok(cert)
}

/// The serial number of a DER certificate, in hex.
fn serial(der: &[u8]) -> Result<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)?;
    Ok(cert.raw_serial_as_string())
}

/// The end of validity of a DER certificate, Unix seconds.
fn not_after(der: &[u8]) -> Result<i64> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)?;
    Ok(cert.validity().not_after.timestamp())
}

/// `GET /healthz` on the metrics listener answers 200.
fn health() -> Result<()> {
    let mut stream = TcpStream::connect(("127.0.0.1", METRICS_PORT))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw)?;
    let status = raw.lines().next().unwrap_or_default();
    ensure!(
        status.contains(" 200 "),
        "GET /healthz after the rotation: {raw}"
    );
    Ok(())
}
