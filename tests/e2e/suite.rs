//! One run: set up once (CRDs, webhook, registration), run the scenarios (in parallel, each in
//! its own namespaces; those that restart the API server alone, last), clean up, report.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::env::{Config, Skip, WebhookMode};
use crate::kubectl::{Kubectl, Out};
use crate::rest::{Enforced, Reply, Rest, until_refused};
use crate::webhook::{self, Files, Serve};

/// Label on every object the run creates, so that clean-up finds them.
pub const RUN_LABEL: &str = "objectlock.dev/e2e-run";
/// How long a new lock may take to be enforced before a check gives up (generous: the machine
/// is shared; the latency scenario measures the real figure).
pub const ENFORCE_WITHIN: Duration = Duration::from_secs(30);

/// The API path of the Lock `ns/name`.
pub fn lock_path(ns: &str, name: &str) -> String {
    format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/{name}")
}

/// A scenario.
pub struct Scenario {
    pub name: &'static str,
    /// Restarts the API server or the webhook: runs alone, after the others.
    pub exclusive: bool,
    pub run: fn(&Ctx) -> Result<()>,
}

/// A scenario that cannot run here, with the reason (one line).
#[derive(Debug)]
pub struct Skipped(pub String);

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Skipped {}

/// Ends a scenario as skipped.
pub fn skip<T>(reason: impl Into<String>) -> Result<T> {
    Err(Skipped(reason.into()).into())
}

/// `KOL_E2E_REQUIRE=1`: what the suite needs is known to be there, so a skip is a failure.
fn required() -> bool {
    std::env::var("KOL_E2E_REQUIRE").is_ok_and(|v| v == "1")
}

/// Ends a scenario as skipped, or as failed under `KOL_E2E_REQUIRE=1`: for what CI's machine
/// must have (root, `ip netns`) but a user's may lack.
pub fn skip_unless_required<T>(reason: impl Into<String>) -> Result<T> {
    let reason = reason.into();
    if required() {
        bail!("KOL_E2E_REQUIRE=1, but {reason}");
    }
    skip(reason)
}

/// What every scenario shares.
pub struct Env {
    pub cfg: Config,
    pub kubectl: Kubectl,
    pub rest: Rest,
    /// Who the suite is (`kubectl auth whoami`): the holder of the locks it takes with the plugin.
    pub user: String,
    pub run: String,
    pub files: Files,
    /// The run's own namespace: the webhook's ServiceAccount and the sentinel lock.
    pub system_ns: String,
    pub serve: Mutex<Option<Serve>>,
    /// APISERVER_ARGS the local control plane was restarted with, to undo at the end.
    pub apiserver_args: Mutex<Option<String>>,
    /// A controller manager runs (namespaces are emptied and removed).
    pub kcm: bool,
    /// The registration sends `pods/resize`.
    pub resize_registered: bool,
    /// Figures printed at the end.
    pub figures: Mutex<Vec<String>>,
}

impl Env {
    /// Restarts the local control plane, its API server with the AdmissionConfiguration of
    /// `manifests apiserver` (it then presents the client certificate of `certs --client` to
    /// the webhook) and an audit log of ConfigMap writes ([`Env::audit_log`]); the flags are
    /// removed again at the end of the run.
    pub fn restart_apiserver(&self) -> Result<Duration> {
        let Some(harness) = &self.cfg.harness else {
            bail!("not the local control plane");
        };
        let config = webhook::apiserver_files(&self.cfg.server_bin, &self.files)?;
        let policy = self.files.dir.join("audit-policy.yaml");
        std::fs::write(
            &policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n  resources: [{group: \"\", resources: [configmaps]}]\n- level: None\n",
        )?;
        let args = format!(
            "--admission-control-config-file={} --audit-policy-file={} --audit-log-path={}",
            config.display(),
            policy.display(),
            self.audit_log().display()
        );
        if let Ok(mut a) = self.apiserver_args.lock() {
            *a = Some(args.clone());
        }
        harness.restart(&args)
    }

    /// The API server's audit log once [`Env::restart_apiserver`] ran.
    pub fn audit_log(&self) -> PathBuf {
        self.files.dir.join("audit.log")
    }

    /// Restarts the API server unless this run did already.
    pub fn restarted(&self) -> Result<Option<Duration>> {
        if self
            .apiserver_args
            .lock()
            .map(|a| a.is_some())
            .unwrap_or(false)
        {
            return Ok(None);
        }
        self.restart_apiserver().map(Some)
    }

    /// Skips unless the suite runs the webhook and the cluster is the local control plane.
    pub fn needs_local(&self) -> Result<()> {
        if self.cfg.mode != WebhookMode::Own {
            return skip("KOL_E2E_WEBHOOK=external: the webhook is not the suite's to restart");
        }
        if self.cfg.harness.is_none() {
            return skip(
                "the cluster is not the local control plane (~/.cache/control-plane): its API server cannot be restarted from here",
            );
        }
        Ok(())
    }
}

/// One scenario's view.
pub struct Ctx<'a> {
    pub env: &'a Env,
    pub name: &'static str,
    notes: RefCell<Vec<String>>,
}

impl Ctx<'_> {
    /// A line printed under the scenario's result.
    pub fn note(&self, line: impl Into<String>) {
        self.notes.borrow_mut().push(line.into());
    }

    /// A figure printed in the run's summary too.
    pub fn figure(&self, line: impl Into<String>) {
        let line = line.into();
        self.note(line.clone());
        if let Ok(mut figures) = self.env.figures.lock() {
            figures.push(format!("{}: {line}", self.name));
        }
    }

    /// Stops the suite's webhook and starts it again with the same settings.
    pub fn restart_webhook(&self) -> Result<()> {
        self.with_webhook_stopped(|| Ok(()))
    }

    /// Stops the suite's webhook with SIGTERM, runs `between`, and starts the webhook again with
    /// the same settings whatever `between` returned.
    pub fn with_webhook_stopped<T>(&self, between: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut slot = self
            .env
            .serve
            .lock()
            .map_err(|_| anyhow::anyhow!("the webhook's slot is poisoned"))?;
        let serve = slot
            .take()
            .ok_or_else(|| anyhow::anyhow!("the suite's webhook is not running"))?;
        let (started, result) =
            serve.restart_after(&self.env.cfg.server_bin, &self.env.files, between);
        *slot = Some(started?);
        result
    }

    /// Runs `between` with the suite's webhook replaced by one with `settings` (environment)
    /// besides its own, then starts the suite's again as it was.
    pub fn with_webhook_settings<T>(
        &self,
        settings: &[(&str, &str)],
        between: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let client_ca = (self.env.serve.lock().ok())
            .and_then(|s| s.as_ref().map(Serve::client_ca))
            .unwrap_or(false);
        let (bin, files) = (&self.env.cfg.server_bin, &self.env.files);
        self.with_webhook_stopped(|| {
            let other = Serve::start_with(bin, files, client_ca, settings)?;
            let result = between();
            other.stop()?;
            result
        })
    }

    /// `kubectl ARGS...`.
    pub fn k(&self, args: &[&str]) -> Out {
        self.env.kubectl.run(args)
    }

    /// A JSON patch (RFC 6902) of the cluster-scoped `kind/name`, as an administrator makes it.
    pub fn json_patch(&self, kind: &str, name: &str, patch: &serde_json::Value) -> Result<()> {
        self.k(&["patch", kind, name, "--type=json", "-p", &patch.to_string()])
            .check()
            .map(drop)
    }

    /// `kubectl ARGS...` with stdin.
    pub fn k_in(&self, args: &[&str], stdin: &str) -> Out {
        self.env.kubectl.run_stdin(args, Some(stdin))
    }

    pub fn rest(&self) -> &Rest {
        &self.env.rest
    }

    /// A new namespace `kol-e2e-<run>-<scenario>[-suffix]`.
    pub fn namespace(&self, suffix: &str) -> Result<String> {
        let name = if suffix.is_empty() {
            format!("kol-e2e-{}-{}", self.env.run, self.name)
        } else {
            format!("kol-e2e-{}-{}-{suffix}", self.env.run, self.name)
        };
        create_namespace(&self.env.rest, &self.env.run, &name)?;
        Ok(name)
    }

    /// A cluster-scoped name unique to the run.
    pub fn cluster_name(&self, what: &str) -> String {
        format!("kol-e2e-{}-{}-{what}", self.env.run, self.name)
    }

    /// POSTs `object` to `collection` (a REST path) and checks it was created.
    pub fn create(&self, collection: &str, object: Value) -> Result<Value> {
        let reply = self.env.rest.post(collection, &object)?;
        if !reply.ok() {
            bail!(
                "cannot create in {collection}: {} {}",
                reply.code,
                reply.message()
            );
        }
        Ok(reply.body)
    }

    /// A ConfigMap `ns/name` with `labels`.
    pub fn configmap(&self, ns: &str, name: &str, labels: Value) -> Result<()> {
        self.create(
            &format!("/api/v1/namespaces/{ns}/configmaps"),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": name, "labels": labels}, "data": {"state": "original"}}),
        )
        .map(drop)
    }

    /// A Lock `ns/name` with `spec`.
    pub fn lock(&self, ns: &str, name: &str, spec: Value) -> Result<()> {
        self.create(
            &format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks"),
            json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
                   "metadata": {"name": name}, "spec": spec}),
        )
        .map(drop)
    }

    /// A ClusterLock `name` with `spec`, labelled for clean-up.
    pub fn cluster_lock(&self, name: &str, spec: Value) -> Result<()> {
        self.create(
            "/apis/objectlock.dev/v1alpha1/clusterlocks",
            json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "ClusterLock",
                   "metadata": {"name": name, "labels": {RUN_LABEL: self.env.run}},
                   "spec": spec}),
        )
        .map(drop)
    }

    /// Deletes the Lock `ns/name`.
    pub fn unlock(&self, ns: &str, name: &str) -> Result<()> {
        let reply = self.env.rest.delete(&lock_path(ns, name))?;
        reply.allowed(&format!("delete Lock {ns}/{name}"))
    }

    /// Waits until `probe` is refused (a new lock is enforced), noting how long it took.
    pub fn enforced(&self, what: &str, probe: impl FnMut() -> Result<Reply>) -> Result<Enforced> {
        let enforced = until_refused(ENFORCE_WITHIN, probe).with_context(|| what.to_owned())?;
        Ok(enforced)
    }

    /// Waits until a dry-run UPDATE of `path` is refused.
    pub fn update_enforced(&self, path: &str) -> Result<Enforced> {
        self.enforced(&format!("dry-run update of {path}"), || {
            self.env.rest.probe_update(path)
        })
    }

    /// Waits until a dry-run DELETE of `path` is refused.
    pub fn delete_enforced(&self, path: &str) -> Result<Enforced> {
        self.enforced(&format!("dry-run delete of {path}"), || {
            self.env.rest.probe_delete(path)
        })
    }

    /// Waits until GET `path` answers 404 (an object deleted by a controller), at most
    /// `within`; how long it took.
    pub fn gone(&self, path: &str, within: Duration) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let reply = self.env.rest.get(path)?;
            if reply.code == 404 {
                return Ok(start.elapsed());
            }
            if start.elapsed() > within {
                bail!(
                    "{path} still exists after {within:?}: {}",
                    reply.body["status"]
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Repeats `probe` until it is allowed (a lock released), at most `within`.
    pub fn released(
        &self,
        what: &str,
        within: Duration,
        mut probe: impl FnMut() -> Result<Reply>,
    ) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let reply = probe()?;
            if reply.ok() {
                return Ok(start.elapsed());
            }
            if start.elapsed() > within {
                bail!(
                    "{what}: still refused after {within:?}: {} {}",
                    reply.code,
                    reply.message()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Creates a labelled namespace.
fn create_namespace(rest: &Rest, run: &str, name: &str) -> Result<()> {
    let reply = rest.post(
        "/api/v1/namespaces",
        &json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": {RUN_LABEL: run}}}),
    )?;
    if !reply.ok() {
        bail!(
            "cannot create namespace {name}: {} {}",
            reply.code,
            reply.message()
        );
    }
    Ok(())
}

/// The locked message for a namespaced object and its same-named Lock.
pub fn locked(resource: &str, ns: &str, name: &str, reason: Option<&str>) -> String {
    let reason = reason.map(|r| format!(": {r}")).unwrap_or_default();
    format!(
        "{resource} \"{name}\" in namespace \"{ns}\" is locked by Lock {ns}/{name}{reason} (to unlock: kubectl delete lock {name} -n {ns})"
    )
}

/// The prefix the API server puts before a denial of the namespaced webhook.
pub const NAMESPACED_DENIAL: &str =
    "admission webhook \"namespaced.objectlock.dev\" denied the request: ";
/// The same for the cluster-scoped webhook.
pub const CLUSTER_DENIAL: &str =
    "admission webhook \"cluster.objectlock.dev\" denied the request: ";

/// The whole suite cannot run here: a pass with one line, unless `KOL_E2E_REQUIRE=1` says a
/// cluster is known to be there (CI after building the control plane), where it is a failure.
fn skipped(reason: &str) -> ExitCode {
    if required() {
        println!("e2e: error: KOL_E2E_REQUIRE=1, but the suite cannot run: {reason}");
        return ExitCode::FAILURE;
    }
    println!("e2e: skipped: {reason}");
    ExitCode::SUCCESS
}

/// Runs `selected`, printing one line per scenario and a summary.
pub fn run(selected: Vec<Scenario>) -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let started = Instant::now();
    let cfg = match Config::discover() {
        Ok(Ok(cfg)) => cfg,
        Ok(Err(Skip(reason))) => return skipped(&reason),
        Err(mistake) => {
            println!("e2e: error: {mistake}");
            return ExitCode::FAILURE;
        }
    };
    let env = match setup(cfg) {
        Ok(Ok(env)) => env,
        Ok(Err(Skip(reason))) => return skipped(&reason),
        Err((e, files)) => {
            println!("e2e: setup failed: {e:#}");
            if let Some(dir) = files {
                println!("e2e: files kept in {}", dir.display());
            }
            return ExitCode::FAILURE;
        }
    };
    println!("e2e: setup done in {:.1}s", started.elapsed().as_secs_f64());

    let (exclusive, parallel): (Vec<_>, Vec<_>) = selected.into_iter().partition(|s| s.exclusive);
    let results = Mutex::new(Vec::new());
    let queue = Mutex::new(parallel.into_iter().collect::<VecDeque<_>>());
    let print = Mutex::new(());
    std::thread::scope(|scope| {
        for _ in 0..env.cfg.jobs {
            scope.spawn(|| {
                loop {
                    let next = queue.lock().ok().and_then(|mut q| q.pop_front());
                    let Some(scenario) = next else { break };
                    let result = run_one(&env, &scenario, &print);
                    if let Ok(mut r) = results.lock() {
                        r.push(result);
                    }
                }
            });
        }
    });
    for scenario in exclusive {
        let result = run_one(&env, &scenario, &print);
        if let Ok(mut r) = results.lock() {
            r.push(result);
        }
    }

    let teardown = teardown(&env);
    let results = results.into_inner().unwrap_or_default();
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, r, _)| *r == Verdict::Failed)
        .map(|(n, _, _)| *n)
        .collect();
    let skipped = results
        .iter()
        .filter(|(_, r, _)| *r == Verdict::Skipped)
        .count();
    let figures = env.figures.lock().map(|f| f.clone()).unwrap_or_default();
    if !figures.is_empty() {
        println!("e2e: figures:");
        for f in figures {
            println!("  {f}");
        }
    }
    if let Err(e) = &teardown {
        println!("e2e: clean-up failed: {e:#}");
    }
    println!(
        "e2e: {} scenarios: {} passed, {} failed, {skipped} skipped in {:.1}s",
        results.len(),
        results.len() - failed.len() - skipped,
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    if failed.is_empty() && teardown.is_ok() {
        let _ = std::fs::remove_dir_all(&env.files.dir);
        ExitCode::SUCCESS
    } else {
        // Again at the end, where a log cut to its tail still shows why.
        for (name, _, line) in results.iter().filter(|(_, r, _)| *r == Verdict::Failed) {
            println!("e2e: {name}: {}", clip(line, 2000));
        }
        println!(
            "e2e: failed: {}; webhook log and files kept in {}",
            failed.join(", "),
            env.files.dir.display()
        );
        ExitCode::FAILURE
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Passed,
    Failed,
    Skipped,
}

/// At most `max` bytes of `text`, cut at a character boundary.
fn clip(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn run_one(env: &Env, scenario: &Scenario, print: &Mutex<()>) -> (&'static str, Verdict, String) {
    let ctx = Ctx {
        env,
        name: scenario.name,
        notes: RefCell::new(Vec::new()),
    };
    let start = Instant::now();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (scenario.run)(&ctx)));
    let secs = start.elapsed().as_secs_f64();
    let (verdict, line) = match outcome {
        Ok(Ok(())) => (Verdict::Passed, format!("ok ({secs:.1}s)")),
        Ok(Err(e)) => match e.downcast_ref::<Skipped>() {
            Some(why) => (Verdict::Skipped, format!("skipped: {why}")),
            None => (Verdict::Failed, format!("FAILED ({secs:.1}s): {e:#}")),
        },
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            (
                Verdict::Failed,
                format!("FAILED ({secs:.1}s): panic: {what}"),
            )
        }
    };
    let _guard = print.lock();
    println!("e2e: {} ... {line}", scenario.name);
    for note in ctx.notes.borrow().iter() {
        println!("    {note}");
    }
    (scenario.name, verdict, line)
}

/// Everything before the scenarios. `Err` carries the files directory to keep, if any.
fn setup(cfg: Config) -> std::result::Result<Result<Env, Skip>, (anyhow::Error, Option<PathBuf>)> {
    let run = format!(
        "{:06x}",
        (u64::from(std::process::id()) ^ now_nanos() ^ (now_nanos() >> 24)) & 0xff_ffff
    );
    let cleanup_kubectl = cfg.kubectl.clone();
    let own = cfg.mode == WebhookMode::Own;
    let dir = std::env::temp_dir().join(format!("kol-e2e-{run}"));
    let files = Files { dir: dir.clone() };
    let fail = |e: anyhow::Error| (e, Some(dir.clone()));
    std::fs::create_dir_all(&dir).map_err(|e| fail(e.into()))?;
    let inner = || -> Result<Result<Env, Skip>> {
        let plugin_dir = dir.join("plugins");
        std::fs::create_dir_all(&plugin_dir)?;
        for name in ["kubectl-lock", "kubectl-unlock"] {
            std::os::unix::fs::symlink(&cfg.plugin_bin, plugin_dir.join(name))?;
        }
        let mut kubectl = cfg.kubectl.clone();
        kubectl.plugin_dir = Some(plugin_dir);
        let rest = Rest::new(&cfg.kubeconfig)?;

        let version: Value =
            serde_json::from_str(&kubectl.run(&["version", "-o", "json"]).check()?.stdout)?;
        let whoami: Value = serde_json::from_str(
            &kubectl
                .run(&["auth", "whoami", "-o", "json"])
                .check()?
                .stdout,
        )?;
        let user = whoami["status"]["userInfo"]["username"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let existing = webhook::registered_url(&kubectl)?;
        match (cfg.mode, existing.as_deref()) {
            (WebhookMode::Own, Some(url)) if url != webhook::URL => {
                return Ok(Err(Skip(format!(
                    "ValidatingWebhookConfiguration {} already exists and calls {url}; to test that webhook set KOL_E2E_WEBHOOK=external",
                    webhook::REGISTRATION
                ))));
            }
            (WebhookMode::External, None) => {
                return Ok(Err(Skip(format!(
                    "KOL_E2E_WEBHOOK=external, but there is no ValidatingWebhookConfiguration {}",
                    webhook::REGISTRATION
                ))));
            }
            _ => {}
        }
        println!(
            "e2e: cluster {} (server {}, kubectl {}) as {user}; webhook: {}; control plane: {}",
            cfg.kubeconfig.display(),
            version["serverVersion"]["gitVersion"]
                .as_str()
                .unwrap_or("?"),
            version["clientVersion"]["gitVersion"]
                .as_str()
                .unwrap_or("?"),
            match cfg.mode {
                WebhookMode::Own => format!("{} from {}", webhook::URL, cfg.server_bin.display()),
                WebhookMode::External => "external (KOL_E2E_WEBHOOK=external)".to_owned(),
            },
            match &cfg.harness {
                Some(h) => format!(
                    "local ({}{})",
                    h.dir.display(),
                    if h.kcm {
                        ", with kube-controller-manager"
                    } else {
                        ""
                    }
                ),
                None => "not the local one (no restart scenarios)".to_owned(),
            }
        );

        let system_ns = format!("kol-e2e-{run}");
        create_namespace(&rest, &run, &system_ns)?;
        let mut serve = None;
        if cfg.mode == WebhookMode::Own {
            webhook::make_certs(&cfg.server_bin, &files)?;
            webhook::install_crds(&cfg.server_bin, &kubectl)?;
            webhook::identity(&kubectl, &system_ns, "kube-object-lock", &files)?;
            serve = Some(Serve::start(&cfg.server_bin, &files, false)?);
            webhook::register(
                &cfg.server_bin,
                &kubectl,
                &files,
                &format!("{system_ns}/kube-object-lock"),
            )?;
        } else {
            kubectl
                .run(&[
                    "get",
                    "crd",
                    "locks.objectlock.dev",
                    "clusterlocks.objectlock.dev",
                ])
                .check()
                .context("KOL_E2E_WEBHOOK=external needs the CRDs installed")?;
        }
        let registered = Instant::now();

        // The registration is in force once a lock is: the sentinel.
        let cm = format!("/api/v1/namespaces/{system_ns}/configmaps");
        let created = rest.post(
            &cm,
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "sentinel"}}),
        )?;
        created.allowed("create configmap sentinel")?;
        let locks = format!("/apis/objectlock.dev/v1alpha1/namespaces/{system_ns}/locks");
        rest.post(
            &locks,
            &json!({"apiVersion": "objectlock.dev/v1alpha1", "kind": "Lock",
                    "metadata": {"name": "sentinel"}, "spec": {"reason": "e2e sentinel"}}),
        )?
        .allowed("create Lock sentinel")?;
        let enforced = until_refused(Duration::from_secs(60), || {
            rest.probe_delete(&format!("{cm}/sentinel"))
        })
        .context("the registration never took effect (a Lock was not enforced)")?;
        println!(
            "e2e: registration in force {:.2}s after it was applied ({} writes allowed, {} failed before)",
            registered.elapsed().as_secs_f64(),
            enforced.allowed_before,
            enforced.failed_before
        );

        let vwc: Value = serde_json::from_str(
            &kubectl
                .run(&[
                    "get",
                    "validatingwebhookconfiguration",
                    webhook::REGISTRATION,
                    "-o",
                    "json",
                ])
                .check()?
                .stdout,
        )?;
        let resize_registered = vwc["webhooks"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|w| w["rules"].as_array().into_iter().flatten())
            .flat_map(|r| r["resources"].as_array().into_iter().flatten())
            .any(|r| r == "pods/resize" || r == "*/*");
        let kcm = match &cfg.harness {
            Some(h) => h.kcm,
            None => kubectl
                .run(&[
                    "get",
                    "lease",
                    "-n",
                    "kube-system",
                    "kube-controller-manager",
                ])
                .ok(),
        };
        Ok(Ok(Env {
            cfg,
            kubectl,
            rest,
            user,
            run: run.clone(),
            files: Files { dir: dir.clone() },
            system_ns,
            serve: Mutex::new(serve),
            apiserver_args: Mutex::new(None),
            kcm,
            resize_registered,
            figures: Mutex::new(Vec::new()),
        }))
    };
    match inner() {
        Ok(result) => Ok(result),
        Err(e) => {
            // Leave the cluster as it was: no registration pointing at a stopped webhook.
            let k = &cleanup_kubectl;
            if own
                && let Ok(Some(url)) = webhook::registered_url(k)
                && url == webhook::URL
            {
                let _ = cleanup_registration(k);
            }
            let system_ns = format!("kol-e2e-{run}");
            k.run(&["delete", "locks", "--all", "-n", &system_ns, "--wait=false"]);
            k.run(&[
                "delete",
                "namespace",
                &system_ns,
                "--wait=false",
                "--ignore-not-found",
            ]);
            let log = webhook::tail(&dir.join("serve.log"), 20);
            let e = if log.is_empty() {
                e
            } else {
                e.context(format!("webhook log:\n{log}"))
            };
            Err(fail(e))
        }
    }
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn cleanup_registration(k: &Kubectl) -> Result<()> {
    k.run(&[
        "delete",
        "validatingwebhookconfiguration",
        webhook::REGISTRATION,
        "--ignore-not-found",
    ])
    .check()?;
    Ok(())
}

/// Leaves the cluster as it was: registration, webhook, API server flags, test objects.
fn teardown(env: &Env) -> Result<()> {
    let k = &env.kubectl;
    let mut errors = Vec::new();
    if env.cfg.mode == WebhookMode::Own {
        // First, so that no write fails on a stopped webhook.
        if let Err(e) = cleanup_registration(k) {
            errors.push(format!("{e:#}"));
        }
        let binding = k.run(&[
            "get",
            "clusterrolebinding",
            "kube-object-lock",
            "-o",
            "jsonpath={.subjects[0].namespace}",
        ]);
        if binding.ok() && binding.stdout.trim() == env.system_ns {
            k.run(&[
                "delete",
                "clusterrolebinding,clusterrole",
                "kube-object-lock",
            ]);
        }
        if let Some(serve) = env.serve.lock().ok().and_then(|mut s| s.take())
            && let Err(e) = serve.stop()
        {
            errors.push(format!("{e:#}"));
        }
        let args = env.apiserver_args.lock().ok().and_then(|mut a| a.take());
        if let (Some(_), Some(harness)) = (args, &env.cfg.harness) {
            match harness.restart("") {
                Ok(took) => println!(
                    "e2e: control plane restarted without the test flags ({:.1}s)",
                    took.as_secs_f64()
                ),
                Err(e) => errors.push(format!("restoring the API server: {e:#}")),
            }
        }
    }
    let selector = format!("{RUN_LABEL}={}", env.run);
    let out = k.run(&[
        "delete",
        "clusterlocks,clusterroles,clusterrolebindings,certificatesigningrequests",
        "-l",
        &selector,
        "--ignore-not-found",
    ]);
    if !out.ok() {
        errors.push(out.stderr);
    }
    // ClusterLocks the plugin made carry no label: by name.
    let prefix = format!("clusterlock.objectlock.dev/kol-e2e-{}", env.run);
    let cluster_locks = k.run(&["get", "clusterlocks", "-o", "name"]);
    for name in cluster_locks
        .stdout
        .lines()
        .filter(|l| l.starts_with(&prefix))
    {
        k.run(&["delete", name, "--ignore-not-found"]);
    }
    let namespaces = k.run(&["get", "namespaces", "-l", &selector, "-o", "name"]);
    for ns in namespaces.stdout.lines() {
        let ns = ns.trim_start_matches("namespace/");
        // With an external webhook still registered, a namespace with Locks cannot go.
        k.run(&["delete", "locks", "--all", "-n", ns, "--wait=false"]);
    }
    let out = k.run(&["delete", "namespaces", "-l", &selector, "--wait=false"]);
    if !out.ok() {
        errors.push(out.stderr);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        bail!("{}", errors.join("; "))
    }
}
