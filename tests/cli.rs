//! The binary as an operator runs it: exit codes, messages, files written.

mod support;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use support::{Certs, fixture, lock_yaml};

fn bin() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kube-object-lock"));
    // No cluster reachable from tests: no kubeconfig, no in-cluster account.
    cmd.env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", "/nonexistent")
        .env_remove("RUST_LOG");
    cmd
}

fn run(cmd: &mut Command) -> Output {
    cmd.stdin(Stdio::null()).output().expect("binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `cmd`, expects exit `code` and each of `needles` in stderr; returns stderr.
fn fails(cmd: &mut Command, code: i32, needles: &[&str]) -> String {
    let out = run(cmd);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(code), "{err}");
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    err
}

/// `check --locks-dir LOCKS REVIEW`, REVIEW a file of tests/fixtures/ or a path.
fn check(locks: impl AsRef<Path>, review: &str) -> Command {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut cmd = bin();
    cmd.args(["check", "--locks-dir"])
        .arg(locks.as_ref())
        .arg(fixtures.join(review));
    cmd
}

fn locks_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("locks.yaml"),
        lock_yaml(
            Some("demo-015226"),
            "locked-a",
            Some("VM snapshot in progress"),
        ),
    )
    .expect("write");
    dir
}

#[test]
fn help_describes_every_subcommand() {
    for (sub, needle) in [
        ("serve", "--locks-dir"),
        ("certs", "--san"),
        ("crd", "CustomResourceDefinitions"),
        ("check", "Exit status: 0 allowed, 1 denied, 2 bad input"),
        ("check", "3 could not decide"),
    ] {
        let out = run(bin().args([sub, "--help"]));
        assert!(out.status.success(), "{sub} --help");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(needle),
            "{sub} --help lacks {needle:?}:\n{text}"
        );
    }
}

#[test]
fn crd_prints_the_generated_definitions() {
    let out = run(bin().arg("crd"));
    assert!(out.status.success(), "{}", stderr(&out));
    let yaml = String::from_utf8(out.stdout).expect("utf-8");
    let docs: Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        serde_saphyr::from_multiple(&yaml).expect("valid YAML of CRDs");
    assert_eq!(docs, kube_object_lock::api::crds().to_vec());
}

#[test]
fn certs_writes_four_files_and_never_overwrites() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out_dir = dir.path().join("pki");
    let out = run(bin().args(["certs", "--out"]).arg(&out_dir).args([
        "--san",
        "10.0.0.1",
        "--san",
        "webhook.local",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    for file in ["ca.crt", "ca.key", "tls.crt", "tls.key"] {
        assert!(out_dir.join(file).is_file(), "{file}");
    }
    fails(
        bin().args(["certs", "--out"]).arg(&out_dir),
        1,
        &["pass --force"],
    );
    fails(
        bin()
            .args(["certs", "--san", "bad name", "--out"])
            .arg(dir.path().join("x")),
        1,
        &["--san \"bad name\""],
    );
}

#[test]
fn check_exits_by_verdict() {
    let locks = locks_dir();
    let denied = run(&mut check(&locks, "configmap-delete-locked.json"));
    assert_eq!(denied.status.code(), Some(1), "{}", stderr(&denied));
    let response: serde_json::Value = serde_json::from_slice(&denied.stdout).expect("JSON");
    assert_eq!(response["response"]["allowed"], false);
    assert_eq!(response["response"]["status"]["code"], 403);

    let allowed = run(&mut check(&locks, "configmap-delete-unlocked.json"));
    assert_eq!(allowed.status.code(), Some(0), "{}", stderr(&allowed));

    // From stdin.
    let mut child = bin()
        .args(["check", "--locks-dir"])
        .arg(locks.path())
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(&fixture("configmap-update-put.json"))
            .expect("write");
    }
    let piped = child.wait_with_output().expect("wait");
    assert_eq!(piped.status.code(), Some(1));

    let bad = tempfile::NamedTempFile::new().expect("temp");
    std::fs::write(bad.path(), "{\"kind\": \"AdmissionReview\"").expect("write");
    let bad = bad.path().to_str().expect("utf-8");
    let err = fails(&mut check(&locks, bad), 2, &[]);
    assert_eq!(
        err.matches("malformed AdmissionReview").count(),
        1,
        "said once: {err}"
    );
    fails(
        &mut check(&locks, "/nonexistent.json"),
        2,
        &["/nonexistent.json"],
    );
}

/// A lock file that does not read is no lock at all only if `check` says so: it cannot decide
/// (exit 3), names the file, the line and the field, and prints no answer.
#[test]
fn check_cannot_decide_with_a_lock_file_that_does_not_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("web.yaml");
    for (spec, field) in [
        (
            "  operations: [DELTE]\n",
            "7: spec.operations[0]: unknown variant `DELTE`",
        ),
        ("  expiresAt: \"tomorrow\"\n", "7: spec.expiresAt: "),
    ] {
        std::fs::write(
            &file,
            format!("apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata:\n  name: locked-a\n  namespace: demo-015226\nspec:\n{spec}"),
        )
        .expect("write");
        let out = run(&mut check(&dir, "configmap-delete-locked.json"));
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        assert!(out.stdout.is_empty(), "no answer is given");
        let err = stderr(&out);
        assert!(
            err.contains(&format!("{}:{field}", file.display())),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "said once: {err}");
    }
    let missing = run(&mut check(
        "/nonexistent/locks",
        "configmap-delete-locked.json",
    ));
    assert_eq!(missing.status.code(), Some(3), "{}", stderr(&missing));
    assert_eq!(
        stderr(&missing)
            .matches("No such file or directory")
            .count(),
        1,
        "the cause said once: {}",
        stderr(&missing)
    );
}

/// An API server that cannot be reached: `check` says it could not decide (exit 3, not the
/// 1 of a denial), naming where it read from.
#[test]
fn check_cannot_decide_when_the_api_server_does_not_answer() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind")
        .port();
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'http://127.0.0.1:{port}'}}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\nusers:\n- name: u\n  user: {{token: t}}\n"),
    )
    .expect("write");
    let out = run(bin()
        .args(["check", "--kubeconfig"])
        .arg(&kubeconfig)
        .arg(fixtures.join("configmap-delete-locked.json")));
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("could not decide"), "{err}");
    assert!(err.contains(&kubeconfig.display().to_string()), "{err}");
}

/// `check` answers a real CREATE review: allowed by the default lock, refused with the lock's
/// message once the lock asks for CREATE.
#[test]
fn check_explains_a_lock_reserving_the_name() {
    let locks = locks_dir();
    let allowed = run(&mut check(&locks, "configmap-create.json"));
    assert_eq!(allowed.status.code(), Some(0), "{}", stderr(&allowed));

    let reserving = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        reserving.path().join("locks.yaml"),
        "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata:\n  name: locked-a\n  namespace: demo-015226\nspec:\n  operations: [CREATE]\n  reason: name reserved\n",
    )
    .expect("write");
    let denied = run(&mut check(&reserving, "configmap-create.json"));
    assert_eq!(denied.status.code(), Some(1), "{}", stderr(&denied));
    let response: serde_json::Value = serde_json::from_slice(&denied.stdout).expect("JSON");
    let message = response["response"]["status"]["message"]
        .as_str()
        .expect("message");
    assert!(
        message.starts_with("cannot create: configmaps \"locked-a\" in namespace \"demo-015226\" is locked by Lock demo-015226/locked-a: name reserved"),
        "{message}"
    );
}

/// `serve` refuses a bad configuration before serving, naming the flag, key, file or variable
/// to fix and, for a value it does not take, the values it does.
#[test]
fn serve_refuses_bad_configuration_clearly() {
    let certs = Certs::new();
    let locks = locks_dir();
    let dir = tempfile::tempdir().expect("tempdir");
    let (maybe, unknown) = (
        dir.path().join("maybe.toml"),
        dir.path().join("unknown.toml"),
    );
    std::fs::write(&maybe, "on_lookup_error = \"maybe\"\n").expect("write");
    std::fs::write(
        &unknown,
        "[server]\nlisten = \"127.0.0.1:0\"\nlisten_port = 1\n",
    )
    .expect("write");
    // A port in use, asked for by the flag while the environment says otherwise.
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = held.local_addr().expect("addr").to_string();
    let tls = format!(
        "--tls-cert {} --tls-key {}",
        certs.path("tls.crt").display(),
        certs.path("tls.key").display()
    );
    let served = format!("--locks-dir {} {tls}", locks.path().display());
    // `[VARIABLE=VALUE] ARGUMENTS => WHAT STDERR NAMES|...`
    let cases = [
        "{served} --listen localhost:18001 => `server.listen` from the command line (--listen)|an IP address and port such as 127.0.0.1:8443",
        "{served} --metrics-listen localhost:1 => (--metrics-listen)",
        "KUBE_OBJECT_LOCK__METRICS__LISTEN=not-an-address {served} --listen 127.0.0.1:0 --metrics-listen {addr} => cannot listen on {addr} (set by metrics.listen or --metrics-listen)",
        "--config {maybe} => `on_lookup_error` in {maybe}: `maybe` is not a value of it: expected `deny` or `allow`",
        "--config {unknown} => unknown setting `server.listen_port`|{unknown}",
        "--locks-dir /tmp => --tls-cert",
        "KUBE_OBJECT_LOCK__CACHE__TTL=11m --locks-dir /tmp => KUBE_OBJECT_LOCK__CACHE__TTL",
        "--listen nowhere => server.listen",
        "--listen 127.0.0.1:0 {tls} => no lock source|--locks-dir DIR",
        "--locks-dir /tmp --tls-cert {cert} --tls-key {ca.key} => do not make a usable pair",
    ];
    let fill = |text: &str| {
        (text
            .replace("{served}", &served)
            .replace("{tls}", &tls)
            .replace("{addr}", &addr))
        .replace("{maybe}", &maybe.display().to_string())
        .replace("{unknown}", &unknown.display().to_string())
        .replace("{ca.key}", &certs.path("ca.key").display().to_string())
        .replace("{cert}", &certs.path("tls.crt").display().to_string())
    };
    for case in cases {
        let (args, needles) = case.split_once(" => ").expect("a case");
        let (env, args) = match args.split_once(' ') {
            Some((env, args)) if env.contains('=') => (env.split_once('='), args),
            _ => (None, args),
        };
        let mut cmd = bin();
        cmd.arg("serve").args(fill(args).split_whitespace());
        if let Some((var, value)) = env {
            cmd.env(var, value);
        }
        let needles = fill(needles);
        let err = fails(&mut cmd, 1, &needles.split('|').collect::<Vec<_>>());
        if err.contains("cannot listen") {
            assert_eq!(
                err.matches("in use").count(),
                1,
                "the cause said once: {err}"
            );
        }
    }
}

#[test]
fn manifests_print_registration_and_write_the_api_server_side() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = run(bin()
        .args(["manifests", "cluster", "--ca-file"])
        .arg(root.join("deploy/examples/example-ca.crt")));
    assert!(out.status.success(), "{}", stderr(&out));
    let committed = std::fs::read(root.join("deploy/cluster.example.yaml")).expect("committed");
    assert_eq!(
        out.stdout, committed,
        "the committed example is what the command prints"
    );

    let out = run(bin()
        .args([
            "manifests",
            "static",
            "--failure-policy",
            "Ignore",
            "--ca-file",
        ])
        .arg(root.join("deploy/examples/example-ca.crt")));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("name: kube-object-lock.static.k8s.io"),
        "{text}"
    );
    assert!(text.contains("failurePolicy: Ignore"), "{text}");

    let certs = Certs::with_client();
    let dir = tempfile::tempdir().expect("tempdir");
    let out = run(bin()
        .args(["manifests", "apiserver", "--client-cert"])
        .arg(certs.path("apiserver-client.crt"))
        .arg("--client-key")
        .arg(certs.path("apiserver-client.key"))
        .arg("--dir")
        .arg(dir.path())
        .args(["--apiserver-dir", "/etc/kubernetes/kube-object-lock"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let config =
        std::fs::read_to_string(dir.path().join("admission-config.yaml")).expect("written");
    assert!(
        config.contains("kubeConfigFile: /etc/kubernetes/kube-object-lock/webhook-kubeconfig.yaml"),
        "{config}"
    );
    let kubeconfig =
        std::fs::read_to_string(dir.path().join("webhook-kubeconfig.yaml")).expect("written");
    assert!(
        kubeconfig.contains("name: 127.0.0.1:8443")
            || kubeconfig.contains("name: \"127.0.0.1:8443\""),
        "{kubeconfig}"
    );

    // `ARGUMENTS => EXIT-CODE WHAT-STDERR-NAMES`
    for case in [
        "cluster --ca-file /nonexistent.crt => 1 --ca-file /nonexistent.crt",
        "cluster --ca-file x --timeout-seconds 0 => 1 --timeout-seconds",
        "cluster --ca-file x --failure-policy Maybe => 2 --failure-policy",
        "cluster --ca-file x --user u --service-account a/b => 2 --service-account",
        "cluster --namespace-selector lockable=(true --ca-file CA => 1 --namespace-selector \"lockable=(true\"",
        // The static variant is always broad: the flag is not one of its flags.
        "static --broad --ca-file CA => 2 --broad",
    ] {
        let ca = root.join("deploy/examples/example-ca.crt");
        let (args, expected) = case.split_once(" => ").expect("a case");
        let (code, needle) = expected.split_once(' ').expect("code and message");
        let args = args.replace("CA", &ca.display().to_string());
        let mut cmd = bin();
        cmd.arg("manifests").args(args.split_whitespace());
        fails(&mut cmd, code.parse().expect("code"), &[needle]);
    }
}

/// Broad: the webhook neither narrows nor may write its configuration.
#[test]
fn manifests_cluster_broad_is_not_narrowed() {
    let ca = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/examples/example-ca.crt");
    let broad = run(bin()
        .args(["manifests", "cluster", "--broad", "--ca-file"])
        .arg(&ca));
    assert!(broad.status.success(), "{}", stderr(&broad));
    let text = String::from_utf8_lossy(&broad.stdout);
    assert!(!text.contains("may-be-locked"), "{text}");
    assert!(!text.contains("validatingwebhookconfigurations"), "{text}");
}

#[test]
fn a_runtime_that_cannot_start_is_one_line() {
    // 5: the runtime's own error; 6: tokio's panic in its signal driver, taken as the error.
    for limit in [5, 6] {
        let script = format!("ulimit -n {limit}; exec \"$0\" crd");
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", &script, env!("CARGO_BIN_EXE_kube-object-lock")]);
        let err = fails(
            &mut cmd,
            2,
            &["cannot start the async runtime: ", "Too many open files"],
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
