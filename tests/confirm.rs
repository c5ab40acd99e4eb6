//! `kubectl lock` confirms that a lock is in force, and `kubectl lock list` shows ENFORCED and
//! BLOCKED: the real plugin binary against the fake API server, which sends dry-run writes
//! through the real webhook (HTTPS, AdmissionReview), whose instance writes lock status and
//! refusal events back to the fake.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::fake_apiserver::{FakeApiServer, USER};
use support::{TestServer, fixture};

const LOCK_BIN: &str = env!("CARGO_BIN_EXE_kubectl-lock");
/// The namespace and object of the captured DELETE fixture.
const NS: &str = "demo-015226";

struct Setup {
    api: FakeApiServer,
    dir: tempfile::TempDir,
    server: Option<TestServer>,
}

#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// A fake cluster with a ConfigMap and a Deployment; `webhook`: a running webhook instance
/// (`cp-1`) writing status and events; `registered`: the fake sends it dry-run writes.
async fn setup(webhook: bool, registered: bool) -> Setup {
    support::init();
    let api = FakeApiServer::start().await;
    let meta = |name: &str| json!({ "metadata": { "name": name } });
    api.add_object(
        &format!("/api/v1/namespaces/{NS}/configmaps"),
        meta("locked-a"),
    );
    api.add_object(
        &format!("/apis/apps/v1/namespaces/{NS}/deployments"),
        meta("web"),
    );
    let server = match webhook {
        false => None,
        true => {
            let server = TestServer::start_reporting_on(&api).await;
            if registered {
                api.register_webhook(&server.url("/validate"), &server.certs.path("ca.crt"));
            }
            Some(server)
        }
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
         contexts:\n- name: fake\n  context:\n    cluster: fake\n    namespace: {NS}\n\
         current-context: fake\n",
        api.url()
    );
    std::fs::write(dir.path().join("kubeconfig"), kubeconfig).expect("write kubeconfig");
    Setup { api, dir, server }
}

impl Setup {
    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    async fn lock(&self, args: &[&str]) -> Run {
        run(Path::new(LOCK_BIN), args, &self.kubeconfig()).await
    }

    /// The writes of objects the fake received (dry runs: nothing else is accepted).
    fn dry_runs(&self) -> Vec<String> {
        let log = self.api.request_log();
        let write = |r: &&String| {
            (r.starts_with("DELETE ") || r.starts_with("PATCH ")) && !r.contains("objectlock.dev")
        };
        log.iter().filter(write).cloned().collect()
    }
}

async fn run(binary: &Path, args: &[&str], kubeconfig: &Path) -> Run {
    let mut command = Command::new(binary);
    command
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBE_RS_DEBUG_OVERRIDE_URL");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("join")
        .expect("the plugin runs");
    Run {
        code: output.status.code().expect("exited"),
        stdout: String::from_utf8(output.stdout).expect("utf-8"),
        stderr: String::from_utf8(output.stderr).expect("utf-8"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_is_confirmed_once_an_instance_enforces_it_and_a_dry_run_is_refused() {
    let s = setup(true, true).await;
    let run = s.lock(&["cm/locked-a", "--reason", "snapshot"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert_eq!(
        run.stdout,
        format!(
            "locked configmaps \"locked-a\" in namespace \"{NS}\" with Lock {NS}/locked-a \
             (UPDATE, DELETE; held by user \"{USER}\"): snapshot (enforced by 1)\n"
        )
    );
    let dry_runs = s.dry_runs();
    assert!(
        dry_runs.iter().any(|r| r.starts_with(&format!(
            "DELETE /api/v1/namespaces/{NS}/configmaps/locked-a"
        ))),
        "{dry_runs:?}"
    );
    // An UPDATE-only lock is confirmed with a dry-run UPDATE.
    let run = s.lock(&["deploy/web", "--operations", "UPDATE"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.ends_with("(enforced by 1)\n"), "{run:?}");
    assert!(
        s.dry_runs().iter().any(|r| r.starts_with(&format!(
            "PATCH /apis/apps/v1/namespaces/{NS}/deployments/web?"
        )) && r.contains("dryRun=All")),
        "{:?}",
        s.dry_runs()
    );
    // The dry runs were refused, and left no event.
    assert!(s.api.events().is_empty(), "{:?}", s.api.events());
    // Warn mode refuses nothing: confirmed once an instance reports it.
    s.api.add_object(
        &format!("/api/v1/namespaces/{NS}/configmaps"),
        json!({"metadata": {"name": "soft"}}),
    );
    let run = s.lock(&["cm/soft", "--warn"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .ends_with("(seen by the webhook; mode Warn: changes are allowed with a warning)\n"),
        "{run:?}"
    );
    // Nothing to try on an object that does not exist.
    let run = s.lock(&["cm/later", "--allow-missing"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(
        run.stdout
            .ends_with("(enforced by 1; not tried: the object does not exist)\n"),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_webhook_the_lock_stays_and_the_error_says_why() {
    let s = setup(false, false).await;
    let run = s.lock(&["cm/locked-a", "--timeout", "1s"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");
    assert_eq!(
        run.stderr,
        format!(
            "error: Lock {NS}/locked-a was created but is not in force after 1s (it stays; kubectl \
             unlock removes it): no kube-object-lock instance has reported it as enforced \
             (status.enforcedBy is empty): is the webhook running, and may it patch locks/status?\n"
        )
    );
    assert!(
        s.api.lock(NS, "locked-a").is_some(),
        "the lock is left in place"
    );
    // --wait=false does not look.
    let run = s.lock(&["deploy/web", "--wait=false", "--no-holder"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    assert!(run.stdout.ends_with("(UPDATE, DELETE)\n"), "{run:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_that_is_not_sent_the_request_or_another_webhook_is_named() {
    // The instance runs and reports the lock, but the API server does not call it.
    let s = setup(true, false).await;
    let run = s.lock(&["cm/locked-a", "--timeout", "1s"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains("1 instance(s) enforce it, but a dry run of the guarded operation was allowed: the namespace or resource is not sent to the webhook"),
        "{run:?}"
    );
    // Another webhook refuses first.
    let s = setup(true, true).await;
    s.api.deny_first("all deletes need a ticket");
    let run = s.lock(&["cm/locked-a", "--timeout", "1s"]).await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains("another admission webhook refused the dry run first, so it cannot show this lock: admission webhook \"other.example.com\" denied the request: all deletes need a ticket"),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn list_shows_enforced_and_blocked() {
    let s = setup(true, true).await;
    let run = s.lock(&["cm/locked-a"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    // Two real refusals (not dry runs), as the API server sends them.
    let server = s.server.as_ref().expect("webhook");
    for _ in 0..2 {
        let reply = server
            .http1()
            .post_json(
                &server.url("/validate"),
                fixture("configmap-delete-locked.json"),
            )
            .await;
        assert_eq!(reply.json()["response"]["allowed"], false);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let count = |events: &[Value]| {
        events
            .iter()
            .map(|e| e["series"]["count"].as_i64().unwrap_or(1))
            .sum::<i64>()
    };
    // The second refusal waits for the next write (one per lock per 5 s).
    while count(&s.api.events()) < 2 {
        assert!(Instant::now() < deadline, "events: {:?}", s.api.events());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let run = s.lock(&["list"]).await;
    assert_eq!(run.code, 0, "{run:?}");
    let header: Vec<&str> = run
        .stdout
        .lines()
        .next()
        .expect("header")
        .split_whitespace()
        .collect();
    let row: Vec<&str> = run
        .stdout
        .lines()
        .find(|l| l.starts_with("locked-a "))
        .expect("row")
        .split_whitespace()
        .collect();
    let column = |name: &str| row[header.iter().position(|h| *h == name).expect(name)];
    assert_eq!(
        (column("ENFORCED"), column("BLOCKED")),
        ("1", "2"),
        "{}",
        run.stdout
    );
}
