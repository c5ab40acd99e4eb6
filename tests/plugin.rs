//! `kubectl lock` / `kubectl unlock` end to end: the real binary as a subprocess, configured by a
//! kubeconfig file, against the fake API server answering the discovery documents below, a few
//! objects and the locks. The real discovery is the end-to-end scenarios' (`plugin`, ...).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use support::fake_apiserver::FakeApiServer;

/// Who every client of the fake is (`kubectl auth whoami`).
const USER: &str = "jane@example.com";

/// A served resource: plural, kind, namespaced, short names.
type Resource = (&'static str, &'static str, bool, &'static [&'static str]);

/// The resources the fake serves, by group version.
const DISCOVERY: [(&str, &[Resource]); 4] = [
    (
        "v1",
        &[
            ("configmaps", "ConfigMap", true, &["cm"]),
            ("namespaces", "Namespace", false, &["ns"]),
            ("pods", "Pod", true, &["po"]),
            ("services", "Service", true, &["svc"]),
        ],
    ),
    (
        "apps/v1",
        &[("deployments", "Deployment", true, &["deploy"])],
    ),
    (
        "rbac.authorization.k8s.io/v1",
        &[
            ("clusterroles", "ClusterRole", false, &[]),
            ("roles", "Role", true, &[]),
        ],
    ),
    (
        "objectlock.dev/v1alpha1",
        &[
            ("clusterlocks", "ClusterLock", false, &["clk"]),
            ("locks", "Lock", true, &["lk"]),
        ],
    ),
];

/// Seeds `api` with the discovery documents of [`DISCOVERY`] and `whoami`.
fn serve_discovery(api: &FakeApiServer) {
    let mut groups = Vec::new();
    for (group_version, resources) in DISCOVERY {
        let resources: Vec<Value> = (resources.iter())
            .map(|(name, kind, namespaced, short)| {
                json!({ "name": name, "singularName": kind.to_lowercase(), "namespaced": namespaced,
                    "kind": kind, "shortNames": short,
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"] })
            })
            .collect();
        let list = json!({ "kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": group_version, "resources": resources });
        match group_version.split_once('/') {
            None => api.answer("/api/v1", list),
            Some((group, version)) => {
                api.answer(&format!("/apis/{group_version}"), list);
                let version = json!({ "groupVersion": group_version, "version": version });
                groups.push(
                    json!({ "name": group, "versions": [version], "preferredVersion": version }),
                );
            }
        }
    }
    api.answer("/api", json!({ "kind": "APIVersions", "versions": ["v1"] }));
    api.answer(
        "/apis",
        json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": groups }),
    );
    let user = json!({ "username": USER, "groups": ["system:authenticated"] });
    api.answer(
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        json!({ "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
            "metadata": {}, "status": { "userInfo": user } }),
    );
}

const LOCK_BIN: &str = env!("CARGO_BIN_EXE_kubectl-lock");

/// A fake cluster with a few objects, a kubeconfig pointing at it (contexts `fake`, namespace
/// `prod`, the current one; `other`, namespace `staging`), and `kubectl-unlock` as a symlink.
struct Cluster {
    api: FakeApiServer,
    dir: tempfile::TempDir,
}

/// How a run ended.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "{self:?}");
        &self.stdout
    }

    /// The one `error: ...` line of a failure with exit code `code`, nothing on stdout.
    fn error(&self, code: i32) -> &str {
        assert_eq!(self.code, code, "{self:?}");
        assert!(self.stdout.is_empty(), "{self:?}");
        let line = self.stderr.strip_suffix('\n').expect("ends with a newline");
        assert!(
            line.starts_with("error: ") && !line.contains('\n'),
            "{self:?}"
        );
        line
    }

    /// The table row whose NAME (or NAMESPACE and NAME) is `key`, its cells one space apart.
    fn row(&self, key: &[&str]) -> String {
        let row = self.ok().lines().find_map(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            cells.starts_with(key).then(|| cells.join(" "))
        });
        row.unwrap_or_else(|| panic!("no row {key:?} in\n{}", self.stdout))
    }
}

impl Cluster {
    async fn start() -> Cluster {
        support::init();
        let api = FakeApiServer::start().await;
        serve_discovery(&api);
        let meta = |name: &str| json!({ "metadata": { "name": name } });
        api.add_object("/api/v1/namespaces/prod/configmaps", meta("app-config"));
        api.add_object("/apis/apps/v1/namespaces/prod/deployments", meta("web"));
        api.add_object("/api/v1/namespaces/prod/services", meta("web"));
        api.add_object("/api/v1/namespaces", meta("prod"));
        api.add_object(
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            meta("view"),
        );
        let dir = tempfile::tempdir().expect("tempdir");
        // No user: the fake needs no credentials, and kube (as client-go) needs none.
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    namespace: prod\n\
             - name: other\n  context:\n    cluster: fake\n    namespace: staging\n\
             current-context: fake\n",
            api.url()
        );
        std::fs::write(dir.path().join("kubeconfig"), kubeconfig).expect("write kubeconfig");
        std::os::unix::fs::symlink(LOCK_BIN, dir.path().join("kubectl-unlock")).expect("symlink");
        Cluster { api, dir }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// `kubectl lock ARGS`, not waiting for a webhook (there is none here; the end-to-end
    /// scenario `plugin-confirm` runs one) unless the arguments say how to wait.
    async fn lock(&self, args: &[&str]) -> Run {
        let mut args = args.to_vec();
        let says = |flag: &str| args.iter().any(|a| a.starts_with(flag));
        if args.first() != Some(&"list") && !says("--wait") && !says("--timeout") {
            args.push("--wait=false");
        }
        run(Path::new(LOCK_BIN), &args, &self.kubeconfig()).await
    }

    async fn unlock(&self, args: &[&str]) -> Run {
        let unlock = self.dir.path().join("kubectl-unlock");
        run(&unlock, args, &self.kubeconfig()).await
    }

    /// The requests whose `METHOD /path` starts with `prefix`.
    fn requests(&self, prefix: &str) -> Vec<String> {
        let log = self.api.request_log();
        log.into_iter().filter(|r| r.starts_with(prefix)).collect()
    }
}

/// Runs `binary` with `KUBECONFIG` set, as kubectl runs a plugin.
async fn run(binary: &Path, args: &[&str], kubeconfig: &Path) -> Run {
    finish(spawn(binary, args, kubeconfig)).await
}

/// `binary` started with `KUBECONFIG` set, not waited for.
fn spawn(binary: &Path, args: &[&str], kubeconfig: &Path) -> std::process::Child {
    Command::new(binary)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBE_RS_DEBUG_OVERRIDE_URL")
        .env_remove("KUBE_RS_DEBUG_IMPERSONATE_USER")
        .env_remove("KUBE_RS_DEBUG_IMPERSONATE_GROUP")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the plugin starts")
}

/// How `child` ended.
async fn finish(child: std::process::Child) -> Run {
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("the plugin ends");
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).expect("utf-8"),
        stderr: String::from_utf8(output.stderr).expect("utf-8"),
    }
}

fn seconds_from_now(at: &Value) -> i64 {
    let at: Timestamp = at.as_str().expect("a string").parse().expect("RFC 3339");
    at.duration_since(Timestamp::now()).as_secs()
}

#[tokio::test(flavor = "multi_thread")]
async fn lock_by_short_name_writes_the_spec() {
    let c = Cluster::start().await;
    let run = c
        .lock(&[
            "deploy/web",
            "--reason",
            "release freeze",
            "--for",
            "2h",
            "--operations",
            "DELETE",
            "--exempt-user",
            "alice",
            "--exempt-user=bob",
            "--warn",
        ])
        .await;
    let lock = c.api.lock("prod", "web").expect("Lock prod/web");
    let until = lock["spec"]["expiresAt"].as_str().expect("expiresAt");
    assert_eq!(
        run.ok(),
        format!(
            "locked deployments.apps \"web\" in namespace \"prod\" with Lock prod/web \
             (DELETE; warn only; exempt alice, bob; until {until}; held by user \"{USER}\"): \
             release freeze\n"
        )
    );
    assert!(run.stderr.is_empty(), "{run:?}");
    assert_eq!(lock["apiVersion"], "objectlock.dev/v1alpha1");
    assert_eq!(lock["kind"], "Lock");
    let left = seconds_from_now(&lock["spec"]["expiresAt"]);
    assert!((7190..=7200).contains(&left), "{left}s left");
    let mut spec = lock["spec"].clone();
    spec.as_object_mut().expect("object").remove("expiresAt");
    assert_eq!(
        spec,
        json!({
            "resources": [{ "apiGroups": ["apps"], "resources": ["deployments"] }],
            "reason": "release freeze",
            "operations": ["DELETE"],
            "exempt": { "users": ["alice", "bob"] },
            "mode": "Warn",
            "holder": { "user": USER },
        })
    );
    // It looked the Deployment up before locking it.
    assert_eq!(
        c.requests("GET /apis/apps/v1/namespaces/prod/deployments/web")
            .len(),
        1
    );
}

/// `--owner` writes an ownerReference with the owner's uid, so that the garbage collector
/// deletes the lock with it; a ClusterLock takes cluster-scoped owners only.
#[tokio::test(flavor = "multi_thread")]
async fn owners_are_referenced_by_uid() {
    let c = Cluster::start().await;
    let run = c.lock(&["cm/app-config", "--owner", "deploy/web"]).await;
    assert_eq!(
        run.ok(),
        format!(
            "locked configmaps \"app-config\" in namespace \"prod\" with Lock prod/app-config \
             (UPDATE, DELETE; held by user \"{USER}\"; owned by Deployment/web)\n"
        )
    );
    let lock = c
        .api
        .lock("prod", "app-config")
        .expect("Lock prod/app-config");
    let uid = (c
        .requests("GET /apis/apps/v1/namespaces/prod/deployments/web")
        .len()
        == 1)
        .then(|| lock["metadata"]["ownerReferences"][0]["uid"].clone())
        .expect("the owner was looked up once");
    assert!(
        uid.as_str().is_some_and(|u| u.starts_with("00000000-")),
        "{lock}"
    );
    assert_eq!(
        lock["metadata"]["ownerReferences"],
        json!([{ "apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": uid }]),
        "no controller, no blockOwnerDeletion"
    );

    // A cluster-scoped owner for a Lock, and for a ClusterLock.
    c.lock(&[
        "svc/web",
        "--owner",
        "namespace/prod",
        "--operations",
        "UPDATE",
    ])
    .await
    .ok();
    let lock = c.api.lock("prod", "web").expect("Lock prod/web");
    assert_eq!(lock["metadata"]["ownerReferences"][0]["kind"], "Namespace");
    c.lock(&["clusterrole/view", "--owner", "ns/prod"])
        .await
        .ok();
    let owner =
        &c.api.lock("", "view").expect("ClusterLock view")["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["apiVersion"].as_str(), owner["name"].as_str()),
        (Some("v1"), Some("prod"))
    );

    // Refused before anything is created, naming the flag.
    let before = c.requests("POST").len();
    let run = c.lock(&["ns/prod", "--owner", "deploy/web"]).await;
    assert_eq!(
        run.error(1),
        "error: --owner deploy/web: deployments.apps are namespaced, and the lock of a \
         cluster-scoped object is a ClusterLock, which only a cluster-scoped object can own \
         (Kubernetes' rule for owners)"
    );
    let run = c.lock(&["deploy/web", "--owner", "cm/nothing"]).await;
    assert_eq!(
        run.error(1),
        "error: --owner cm/nothing: configmaps \"nothing\" in namespace \"prod\" does not exist"
    );
    let run = c.lock(&["deploy/web", "--owner", "gizmo/x"]).await;
    assert_eq!(
        run.error(1),
        "error: --owner gizmo/x: the server doesn't have a resource type \"gizmo\""
    );
    let run = c.lock(&["deploy/web", "--owner", "deploy/web"]).await;
    assert!(
        run.error(1)
            .starts_with("error: --owner deploy/web: that is the locked object itself"),
        "{run:?}"
    );
    assert_eq!(c.requests("POST").len(), before, "nothing created");
    let run = c.lock(&["deploy/web", "--owner", "web"]).await;
    assert_eq!(
        run.error(1),
        "error: --owner web: expected KIND/NAME (such as job/backup)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn lock_by_kind_and_by_group_qualified_name() {
    let c = Cluster::start().await;
    // --no-holder: a lock anyone allowed to delete Locks may lift, without asking who we are.
    let run = c.lock(&["ConfigMap/app-config", "--no-holder"]).await;
    assert!(c.requests("POST /apis/authentication.k8s.io").is_empty());
    assert_eq!(
        run.ok(),
        "locked configmaps \"app-config\" in namespace \"prod\" with Lock prod/app-config \
         (UPDATE, DELETE)\n"
    );
    let lock = c
        .api
        .lock("prod", "app-config")
        .expect("Lock prod/app-config");
    assert_eq!(
        lock["spec"],
        json!({ "resources": [{ "apiGroups": [""], "resources": ["configmaps"] }] })
    );

    // --kubeconfig and --context instead of KUBECONFIG; -n over the context's namespace.
    let kubeconfig = c.kubeconfig();
    let flags = [
        "--kubeconfig",
        kubeconfig.to_str().expect("utf-8"),
        "--context",
        "other",
    ];
    let mut args = vec!["Deployment.apps", "web", "-n", "prod", "--wait=false"];
    args.extend(flags);
    let run = run_without_env(&args).await;
    assert!(
        run.ok()
            .starts_with("locked deployments.apps \"web\" in namespace \"prod\"")
    );
    let lock = c.api.lock("prod", "web").expect("Lock prod/web");
    assert_eq!(
        lock["spec"]["resources"],
        json!([{ "apiGroups": ["apps"], "resources": ["deployments"] }])
    );

    // The context's namespace is the default: there is no Service web in staging.
    let mut args = vec!["svc/web"];
    args.extend(flags);
    let run = run_without_env(&args).await;
    assert_eq!(
        run.error(1),
        "error: services \"web\" in namespace \"staging\" does not exist \
         (lock it anyway with --allow-missing)"
    );
    // The name of a Lock is the name of its target: Service web cannot get its own.
    let run = c.lock(&["service/web"]).await;
    assert_eq!(
        run.error(1),
        "error: Lock prod/web already exists (see kubectl lock list -n prod; kubectl unlock \
         removes it)"
    );
    assert_eq!(c.api.lock("prod", "web").expect("still there"), lock);
}

/// Runs the plugin with only the flags saying where the cluster is.
async fn run_without_env(args: &[&str]) -> Run {
    run(
        Path::new(LOCK_BIN),
        args,
        Path::new("/nonexistent/kubeconfig"),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_scoped_targets_get_a_cluster_lock() {
    let c = Cluster::start().await;
    let run = c.lock(&["ns/prod", "--reason", "production"]).await;
    assert_eq!(
        run.ok(),
        format!(
            "locked namespaces \"prod\" with ClusterLock prod (UPDATE, DELETE; held by user \
             \"{USER}\"): production\n"
        )
    );
    let lock = c.api.lock("", "prod").expect("ClusterLock prod");
    assert_eq!(lock["kind"], "ClusterLock");
    assert_eq!(
        lock["spec"],
        json!({ "resources": [{ "apiGroups": [""], "resources": ["namespaces"] }],
                "reason": "production", "holder": { "user": USER } })
    );
    assert!(c.api.lock("prod", "prod").is_none());

    let run = c
        .lock(&["clusterroles.rbac.authorization.k8s.io/view", "-n", "prod"])
        .await;
    assert_eq!(
        run.ok(),
        format!(
            "locked clusterroles.rbac.authorization.k8s.io \"view\" with ClusterLock view \
             (UPDATE, DELETE; held by user \"{USER}\")\n"
        )
    );
    assert_eq!(
        run.stderr,
        "note: clusterroles.rbac.authorization.k8s.io are cluster-scoped: --namespace prod is \
         ignored\n"
    );
    let lock = c.api.lock("", "view").expect("ClusterLock view");
    assert_eq!(
        lock["spec"]["resources"],
        json!([{ "apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"] }])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn expiry_flags_are_checked() {
    let c = Cluster::start().await;
    let run = c.lock(&["cm/app-config", "--for", "30m"]).await;
    run.ok();
    let lock = c
        .api
        .lock("prod", "app-config")
        .expect("Lock prod/app-config");
    let left = seconds_from_now(&lock["spec"]["expiresAt"]);
    assert!((1790..=1800).contains(&left), "{left}s left");

    let requests = c.api.request_log().len();
    let run = c
        .lock(&["deploy/web", "--until", "2020-01-01T00:00:00Z"])
        .await;
    assert!(
        run.error(1)
            .starts_with("error: --until 2020-01-01T00:00:00Z is in the past (now is "),
        "{run:?}"
    );
    // Refused before any request.
    assert_eq!(c.api.request_log().len(), requests);
    let run = c
        .lock(&[
            "deploy/web",
            "--for",
            "1h",
            "--until",
            "2099-01-01T00:00:00Z",
        ])
        .await;
    assert!(run.error(2).contains("--until"), "{run:?}");
    let run = c.lock(&["deploy/web", "--until", "tomorrow"]).await;
    assert!(run.error(2).contains("--until"), "{run:?}");
    assert!(c.api.lock("prod", "web").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn list_shows_coverage_targets_and_time_left() {
    let c = Cluster::start().await;
    let run = c.lock(&["list"]).await;
    assert_eq!(run.ok(), "");
    assert_eq!(
        run.stderr,
        "note: no Locks in namespace \"prod\" and no ClusterLocks\n"
    );

    c.lock(&[
        "deploy/web",
        "--for",
        "2h",
        "--reason",
        "release freeze",
        "--owner",
        "cm/app-config",
    ])
    .await
    .ok();
    // A lock reserving the name needs no --allow-missing.
    c.lock(&["cm/gone", "--operations", "CREATE,DELETE"])
        .await
        .ok();
    c.lock(&["ns/prod"]).await.ok();
    c.api.create_lock("prod", "app-config", json!({}));
    let configmaps = json!([{ "apiGroups": [""], "resources": ["configmaps"] }]);
    c.api.create_lock(
        "prod",
        "old",
        json!({ "resources": configmaps, "expiresAt": "2020-01-01T00:00:00Z" }),
    );
    c.api.create_lock(
        "prod",
        "by-label",
        json!({ "selector": { "matchLabels": { "app": "web" } }, "mode": "Warn" }),
    );
    c.api
        .create_lock("staging", "db", json!({ "reason": "migration" }));

    let run = c.lock(&["list"]).await;
    let lines: Vec<&str> = run.ok().lines().collect();
    assert_eq!(lines.len(), 7, "{}", run.stdout);
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header.join(" "),
        "NAME KIND COVERS OPERATIONS TARGET OWNER MODE ENFORCED BLOCKED EXPIRES HOLDER REASON"
    );
    assert_eq!(
        run.row(&["web"]),
        format!(
            "web Lock deployments.apps UPDATE,DELETE exists ConfigMap/app-config Enforce - 0 1h59m {USER} release freeze"
        )
    );
    assert_eq!(
        run.row(&["gone"]),
        format!("gone Lock configmaps DELETE,CREATE missing - Enforce - 0 never {USER}")
    );
    assert_eq!(
        run.row(&["app-config"]),
        "app-config Lock any resource named app-config UPDATE,DELETE - - Enforce - 0 never -"
    );
    assert_eq!(
        run.row(&["old"]),
        "old Lock configmaps UPDATE,DELETE missing - Enforce - 0 expired -"
    );
    assert_eq!(
        run.row(&["by-label"]),
        "by-label Lock selector app=web UPDATE,DELETE - - Warn - 0 never -"
    );
    assert_eq!(
        run.row(&["prod"]),
        format!("prod ClusterLock namespaces UPDATE,DELETE exists - Enforce - 0 never {USER}")
    );
    assert!(!run.stdout.contains("db"), "{}", run.stdout);

    let run = c.lock(&["list", "-A"]).await;
    assert_eq!(run.ok().lines().count(), 8, "{}", run.stdout);
    assert!(run.stdout.starts_with("NAMESPACE   NAME"), "{}", run.stdout);
    assert_eq!(
        run.row(&["staging"]),
        "staging db Lock any resource named db UPDATE,DELETE - - Enforce - 0 never - migration"
    );
    assert!(run.row(&["prod", "web"]).contains(" exists "));
    assert_eq!(
        run.row(&["-", "prod"]),
        format!("- prod ClusterLock namespaces UPDATE,DELETE exists - Enforce - 0 never {USER}")
    );

    let run = c.lock(&["list", "-n", "staging"]).await;
    assert_eq!(run.ok().lines().count(), 3, "{}", run.stdout);
    run.row(&["db"]);
    run.row(&["prod"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_one_line() {
    let c = Cluster::start().await;
    assert_eq!(
        c.lock(&["widgets/x"]).await.error(1),
        "error: the server doesn't have a resource type \"widgets\""
    );
    assert_eq!(
        c.unlock(&["widgets.example.com/x"]).await.error(1),
        "error: the server doesn't have a resource type \"widgets.example.com\""
    );
    assert_eq!(
        c.lock(&["lk/x"]).await.error(1),
        "error: locks.objectlock.dev cannot be locked: locks are never locked, so unlocking \
         never waits on the webhook"
    );
    // A malformed RESOURCE/NAME is a bad command line (2), found before the cluster is read.
    for target in [&["web"][..], &["deploy/"], &["a/b/c"], &["deploy/web", "x"]] {
        let run = run_without_env(target).await;
        assert!(
            run.error(2).starts_with("error: expected RESOURCE/NAME"),
            "{target:?}: {run:?}"
        );
    }
    let run = c.unlock(&["deploy/"]).await;
    assert!(
        run.error(2).starts_with("error: expected RESOURCE/NAME"),
        "{run:?}"
    );
    // `unlock` is its own command, under its own name.
    let run = run_without_env(&["unlock", "deploy/web"]).await;
    assert!(
        run.error(2)
            .starts_with("error: to unlock, run `kubectl unlock deploy/web`"),
        "{run:?}"
    );
    for (args, flag) in [
        (&["deploy/web", "--operations", "PATCH"][..], "--operations"),
        (&["deploy/web", "--for", "soon"][..], "--for"),
        (&["deploy/web", "--bogus"][..], "--bogus"),
        (&["list", "--reason", "x"][..], "--reason"),
        (&[][..], "RESOURCE/NAME"),
    ] {
        let run = c.lock(args).await;
        assert!(run.error(2).contains(flag), "{args:?}: {run:?}");
    }
    let run = c.unlock(&["deploy/web", "--warn"]).await;
    assert!(run.error(2).contains("--warn"), "{run:?}");
    assert!(c.requests("POST").is_empty() && c.requests("DELETE").is_empty());

    let run = run_without_env(&["deploy/web", "--kubeconfig", "/nonexistent/kubeconfig"]).await;
    assert!(
        run.error(1)
            .starts_with("error: cannot load the kubeconfig /nonexistent/kubeconfig: "),
        "{run:?}"
    );
    let kubeconfig = c.kubeconfig();
    let kubeconfig = kubeconfig.to_str().expect("utf-8");
    let run = run_without_env(&["list", "--kubeconfig", kubeconfig, "--context", "nope"]).await;
    assert!(run.error(1).contains("nope"), "{run:?}");
}

/// `help` and `--help` print the help, without any cluster configured.
#[tokio::test(flavor = "multi_thread")]
async fn help_needs_no_cluster() {
    for (args, texts) in [
        (&["help"][..], &["Usage:"][..]),
        (&["help", "list"], &["Usage:", "--all-namespaces"]),
        (
            &["--help"],
            &[
                "kubectl lock",
                "--allow-missing",
                "--exempt-user",
                "Examples:",
                "ClusterLock",
            ],
        ),
    ] {
        let run = run_without_env(args).await;
        assert_eq!(run.code, 0, "{args:?}: {run:?}");
        assert!(
            texts.iter().all(|t| run.stdout.contains(t)),
            "{args:?}: {run:?}"
        );
    }
    let c = Cluster::start().await;
    let help = c.unlock(&["--help"]).await;
    assert!(help.ok().contains("kubectl unlock"), "{help:?}");
    assert!(c.api.request_log().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_api_server_is_one_line() {
    let c = Cluster::start().await;
    c.api.stop().await;
    let expected = format!("error: cannot reach the API server at {}: ", c.api.url());
    for run in [
        c.lock(&["deploy/web"]).await,
        c.lock(&["list", "-A"]).await,
        c.unlock(&["deploy/web"]).await,
    ] {
        assert!(run.error(1).starts_with(&expected), "{run:?}");
    }
}

/// A runtime that cannot start (no descriptor left for its driver, or for the pipe of its signal
/// driver, where tokio panics) is one error line and exit status 1.
#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_that_cannot_start_is_one_line() {
    for limit in [5, 6] {
        let script = format!("ulimit -n {limit}; exec {LOCK_BIN} deploy/web");
        let run = run(
            Path::new("/bin/sh"),
            &["-c", &script],
            Path::new("/nonexistent"),
        )
        .await;
        let line = run.error(1);
        assert!(
            line.starts_with("error: cannot start the async runtime: "),
            "{run:?}"
        );
        assert!(line.contains("Too many open files"), "{run:?}");
    }
}

/// `kubectl-lock ARGS` started in the background, as a shell starts a command.
fn start(c: &Cluster, args: &[&str]) -> std::process::Child {
    spawn(Path::new(LOCK_BIN), args, &c.kubeconfig())
}

/// Waits until `path` exists (the command under the lock has started).
async fn appears(path: &Path) {
    for _ in 0..1500 {
        if path.exists() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{} never appeared", path.display());
}

fn signal(child: &std::process::Child, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("a pid");
    rustix::process::kill_process(pid, signal).expect("signal sent");
}

/// `kubectl lock cm/app-config` on a 3 s lease, running `script` with sh.
fn leased(script: &str) -> [&str; 8] {
    [
        "cm/app-config",
        "--wait=false",
        "--lease",
        "3s",
        "--",
        "sh",
        "-c",
        script,
    ]
}

/// A script that creates the file `started`, waits for the file `go`, then runs `then`.
fn gated(c: &Cluster, then: &str) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let (started, go) = (c.dir.path().join("started"), c.dir.path().join("go"));
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.02; done{then}",
        started.display(),
        go.display()
    );
    (started, go, script)
}

/// A lock held while a command runs: created with a lease, renewed (failed renewals retried and
/// told), the command's stdout and exit status passed through, the lock removed at the end.
#[tokio::test(flavor = "multi_thread")]
async fn a_command_runs_while_its_lock_is_held() {
    let c = Cluster::start().await;
    let (started, go, script) = gated(&c, "; echo from-the-command; exit 3");
    let child = start(&c, &leased(&script));
    appears(&started).await;
    let lock = c
        .api
        .lock("prod", "app-config")
        .expect("held while the command runs");
    let first = lock["spec"]["expiresAt"].clone();
    assert!((0..=3).contains(&seconds_from_now(&first)), "{lock}");

    // Six renewals fail, one every 250 ms from a second on: the last ones with under a third
    // of the lease left, so they are told; then one succeeds.
    c.api.fail_patches(6, 500);
    let patches = "PATCH /apis/objectlock.dev/v1alpha1/namespaces/prod/locks/app-config";
    while c.requests(patches).len() < 7 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let renewed = c.api.lock("prod", "app-config").expect("still held");
    assert!(
        seconds_from_now(&renewed["spec"]["expiresAt"]) >= seconds_from_now(&first),
        "{renewed}"
    );
    assert_ne!(renewed["spec"]["expiresAt"], first);
    std::fs::write(&go, "").expect("go");

    let run = finish(child).await;
    assert_eq!(
        (run.code, run.stdout.as_str()),
        (3, "from-the-command\n"),
        "{run:?}"
    );
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some(
            format!(
                "locked configmaps \"app-config\" in namespace \"prod\" with Lock prod/app-config \
                 (UPDATE, DELETE; held by user \"{USER}\"; lease 3s)"
            )
            .as_str()
        ),
        "{run:?}"
    );
    let warning = "warning: cannot renew the lease of Lock prod/app-config (Internal error \
                   occurred: fault injected by FakeApiServer): it lapses in ";
    assert!(lines.iter().any(|l| l.starts_with(warning)), "{run:?}");
    assert_eq!(
        lines.last().copied(),
        Some("note: the lease of Lock prod/app-config is renewed again"),
        "{run:?}"
    );
    assert!(c.api.lock("prod", "app-config").is_none(), "removed");
}

/// A lock deleted and created again by someone else while the command runs is neither renewed
/// nor removed: the new one is not this process's.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_replaced_while_the_command_runs_is_left_to_its_owner() {
    let c = Cluster::start().await;
    let (started, go, script) = gated(&c, "");
    let child = start(&c, &leased(&script));
    appears(&started).await;
    assert!(c.api.delete_lock("prod", "app-config"));
    c.api
        .create_lock("prod", "app-config", json!({"reason": "someone else's"}));
    let patches = "PATCH /apis/objectlock.dev/v1alpha1/namespaces/prod/locks/app-config";
    let before = c.requests(patches).len();
    while c.requests(patches).len() == before {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    std::fs::write(&go, "").expect("go");
    let run = finish(child).await;
    let replaced = "warning: Lock prod/app-config was replaced by another lock of that name: \
                    the object is no longer locked while the command runs (lease 3s)";
    assert!(run.stderr.lines().any(|l| l == replaced), "{run:?}");
    assert_eq!(c.requests(patches).len(), before + 1, "one renewal tried");
    let kept = c
        .api
        .lock("prod", "app-config")
        .expect("the other lock stays");
    assert_eq!(kept["spec"], json!({"reason": "someone else's"}));
}

/// SIGTERM and SIGINT sent to kubectl lock reach the command; the lock goes when it ends.
#[tokio::test(flavor = "multi_thread")]
async fn signals_are_passed_to_the_command_and_the_lock_removed() {
    let c = Cluster::start().await;
    let started = c.dir.path().join("started");
    let trapping = format!(
        "trap 'exit 7' TERM; touch {}; while :; do sleep 0.02; done",
        started.display()
    );
    let child = start(
        &c,
        &["cm/app-config", "--wait=false", "--", "sh", "-c", &trapping],
    );
    appears(&started).await;
    assert!(c.api.lock("prod", "app-config").is_some());
    signal(&child, rustix::process::Signal::TERM);
    let run = finish(child).await;
    assert_eq!(run.code, 7, "the command's trap ran: {run:?}");
    assert!(c.api.lock("prod", "app-config").is_none(), "removed");

    std::fs::remove_file(&started).expect("rm");
    let sleeping = format!("touch {}; exec sleep 60", started.display());
    let child = start(
        &c,
        &["deploy/web", "--wait=false", "--", "sh", "-c", &sleeping],
    );
    appears(&started).await;
    signal(&child, rustix::process::Signal::INT);
    let run = finish(child).await;
    assert_eq!(run.code, 130, "killed by SIGINT: 128+2: {run:?}");
    assert!(c.api.lock("prod", "web").is_none(), "removed");
}

/// When the lock cannot be taken the command is not run, and the exit status says why.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_not_taken_runs_nothing() {
    let c = Cluster::start().await;
    let ran = c.dir.path().join("ran");
    let touch = format!("touch {}", ran.display());
    let kubeconfig = c.kubeconfig();
    let held = |args: &[&str]| {
        let mut full = args.to_vec();
        full.extend(["--", "sh", "-c", &touch]);
        full.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let try_ = |args: Vec<String>| {
        let kubeconfig = kubeconfig.clone();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run(Path::new(LOCK_BIN), &args, &kubeconfig).await
        }
    };

    c.api.create_lock("prod", "web", json!({}));
    let out = try_(held(&["deploy/web", "--wait=false"])).await;
    assert_eq!(
        out.error(123),
        "error: Lock prod/web already exists (see kubectl lock list -n prod; kubectl unlock \
         removes it); the command was not run"
    );
    assert!(
        c.api.lock("prod", "web").is_some(),
        "someone else's lock stays"
    );

    let out = try_(held(&["cm/nothing", "--wait=false"])).await;
    assert!(out.error(125).contains("does not exist"), "{out:?}");

    // No webhook here: never in force, so removed again.
    let out = try_(held(&["cm/app-config", "--timeout", "1s"])).await;
    assert!(
        out.error(124)
            .starts_with("error: Lock prod/app-config was created but is not in force after 1s"),
        "{out:?}"
    );
    assert!(c.api.lock("prod", "app-config").is_none(), "removed");
    assert!(!ran.exists(), "the command never ran");

    let missing = c.dir.path().join("no-such-command");
    let args = ["cm/app-config", "--wait=false", "--"];
    let out = run(
        Path::new(LOCK_BIN),
        &[&args[..], &[missing.to_str().expect("utf-8")]].concat(),
        &kubeconfig,
    )
    .await;
    assert!(out.stderr.contains("error: cannot run '"), "{out:?}");
    assert_eq!(out.code, 127, "{out:?}");
    let plain = c.kubeconfig();
    let out = run(
        Path::new(LOCK_BIN),
        &[&args[..], &[plain.to_str().expect("utf-8")]].concat(),
        &kubeconfig,
    )
    .await;
    assert_eq!(out.code, 126, "not executable: {out:?}");
    assert!(c.api.lock("prod", "app-config").is_none(), "removed");

    let out = try_(held(&["cm/app-config", "--for", "1h"])).await;
    assert!(out.error(2).contains("--for"), "{out:?}");
}

/// A lock that cannot be removed at the end: said how to remove it by hand, non-zero exit.
#[tokio::test(flavor = "multi_thread")]
async fn a_lock_left_behind_is_reported() {
    let c = Cluster::start().await;
    let (started, go, script) = gated(&c, "");
    let child = start(
        &c,
        &["cm/app-config", "--wait=false", "--", "sh", "-c", &script],
    );
    appears(&started).await;
    c.api.stop().await;
    std::fs::write(&go, "").expect("go");
    let run = finish(child).await;
    assert_eq!(run.code, 122, "{run:?}");
    let last = run.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: cannot remove Lock prod/app-config: ")
            && last.ends_with("; remove it with: kubectl delete lock app-config -n prod"),
        "{run:?}"
    );
}
