//! The webhook under test, set up as the README's install steps do it: certificates from
//! `certs`, an identity of its own (a ServiceAccount token), `serve` with that kubeconfig, and
//! the registration from `manifests cluster`.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::kubectl::{Kubectl, run};

/// Port of the webhook under test: not 8443, so it never meets an instance of the user's.
pub const PORT: u16 = 18443;
/// Its URL as registered.
pub const URL: &str = "https://127.0.0.1:18443/validate";
/// Port of its metrics listener (plain HTTP, `metrics.listen`).
pub const METRICS_PORT: u16 = 18444;
/// Ports a scenario may give a second, unregistered instance of its own (HTTPS, metrics).
pub const SPARE_PORTS: (u16, u16) = (18445, 18446);
/// The registration's name (fixed by `manifests cluster`).
pub const REGISTRATION: &str = "kube-object-lock";

/// Files of one run.
pub struct Files {
    pub dir: PathBuf,
}

impl Files {
    pub fn pki(&self, file: &str) -> PathBuf {
        self.dir.join("pki").join(file)
    }
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("webhook-kubeconfig.yaml")
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join("serve.log")
    }
    pub fn apiserver_dir(&self) -> PathBuf {
        self.dir.join("apiserver")
    }
}

/// Where an instance runs and what it talks to: the suite's own place, or another node's.
pub struct Place {
    /// The network namespace it runs in (`ip netns exec`); `None`: the suite's.
    pub netns: Option<String>,
    /// Its kubeconfig (its node's API server).
    pub kubeconfig: PathBuf,
    /// Its log.
    pub log: PathBuf,
}

impl Place {
    /// The suite's webhook: here, with the run's identity.
    pub fn suite(files: &Files) -> Place {
        Place {
            netns: None,
            kubeconfig: files.kubeconfig(),
            log: files.log(),
        }
    }

    /// `program` to run at this place.
    pub fn command(&self, program: &Path) -> Command {
        match &self.netns {
            None => Command::new(program),
            Some(netns) => {
                // `ip netns exec` execs the program: the child's pid is the program's.
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", netns]).arg(program);
                cmd
            }
        }
    }

    /// Something listens on `127.0.0.1:port` at this place.
    fn listening(&self, port: u16) -> bool {
        match &self.netns {
            None => std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
            Some(_) => self
                .command(Path::new("bash"))
                .args(["-c", &format!("exec 3<>/dev/tcp/127.0.0.1/{port}")])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
        }
    }
}

/// A running `kube-object-lock serve`.
pub struct Serve {
    child: Child,
    client_ca: bool,
}

impl Serve {
    /// Starts `serve` on [`PORT`]; with `client_ca`, client certificates are required (mTLS).
    pub fn start(bin: &Path, files: &Files, client_ca: bool) -> Result<Serve> {
        Serve::start_with(bin, files, client_ca, &[])
    }

    /// Like [`Serve::start`], with extra environment (settings) for `serve`.
    pub fn start_with(
        bin: &Path,
        files: &Files,
        client_ca: bool,
        env: &[(&str, &str)],
    ) -> Result<Serve> {
        Serve::start_at(bin, files, &Place::suite(files), client_ca, env)
    }

    /// Starts `serve` on [`PORT`] at `place`, with extra environment (settings).
    pub fn start_at(
        bin: &Path,
        files: &Files,
        place: &Place,
        client_ca: bool,
        env: &[(&str, &str)],
    ) -> Result<Serve> {
        if place.netns.is_none() {
            // Else the readiness check below would take the other process for ours.
            ensure!(
                std::net::TcpStream::connect(("127.0.0.1", PORT)).is_err(),
                "127.0.0.1:{PORT} is in use by another process (an earlier run's webhook?)"
            );
            ensure!(
                std::net::TcpStream::connect(("127.0.0.1", METRICS_PORT)).is_err(),
                "127.0.0.1:{METRICS_PORT} (the webhook's metrics) is in use by another process"
            );
        }
        let mut cmd = place.command(bin);
        serve(
            &mut cmd,
            files,
            &place.kubeconfig,
            (PORT, METRICS_PORT),
            &place.log,
        )?;
        cmd.envs(env.iter().copied());
        if client_ca {
            cmd.env(
                "KUBE_OBJECT_LOCK__TLS__CLIENT_CA",
                files.pki("client-ca.crt"),
            );
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", bin.display()))?;
        // Listening is enough: it answers by listing until its watch has synced.
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("serve exited ({status}): {}", tail(&place.log, 20));
            }
            if place.listening(PORT) {
                return Ok(Serve { child, client_ca });
            }
            ensure!(
                Instant::now() < deadline,
                "serve does not listen on {PORT} after 15s: {}",
                tail(&place.log, 20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether it requires client certificates.
    pub fn client_ca(&self) -> bool {
        self.client_ca
    }

    /// The process id (for signals: SIGHUP reloads the certificate at once).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stopped (SIGTERM), `between` run, then started again with the same settings (also when
    /// the stop or `between` failed): the new instance, and what `between` returned.
    pub fn restart_after<T>(
        self,
        bin: &Path,
        files: &Files,
        between: impl FnOnce() -> Result<T>,
    ) -> (Result<Serve>, Result<T>) {
        let client_ca = self.client_ca;
        let result = self.stop().and_then(|()| between());
        (Serve::start(bin, files, client_ca), result)
    }

    /// SIGTERM, then up to 10 s for the drain; SIGKILL after.
    pub fn stop(mut self) -> Result<()> {
        match terminate(&mut self.child)? {
            Some(_) => Ok(()),
            None => bail!("serve ignored SIGTERM for 10s"),
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// SIGTERM, then up to 10 s for the exit; SIGKILL after (`None`: it had to be killed).
fn terminate(child: &mut Child) -> Result<Option<std::process::ExitStatus>> {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).context("the child has no pid")?;
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill()?;
    child.wait()?;
    Ok(None)
}

/// Kills a child still running (a test that failed half-way).
fn kill(child: &mut Child) {
    if matches!(child.try_wait(), Ok(None)) {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A `serve` besides the suite's, on other ports, registered nowhere (the registration has one
/// URL, the suite's): one that answers reviews posted to it, or one of another version that
/// keeps the registration beside the suite's.
pub struct Spare {
    child: Child,
    log: PathBuf,
}

/// `serve` on 127.0.0.1:`port` (its registered URL there too) with the suite's certificate and
/// `kubeconfig`, metrics on `metrics_port`, appending its output to `log`.
fn serve(
    cmd: &mut Command,
    files: &Files,
    kubeconfig: &Path,
    (port, metrics_port): (u16, u16),
    log: &Path,
) -> Result<()> {
    let out = File::options().create(true).append(true).open(log)?;
    cmd.arg("serve")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--tls-cert")
        .arg(files.pki("tls.crt"))
        .arg("--tls-key")
        .arg(files.pki("tls.key"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env(
            "KUBE_OBJECT_LOCK__WEBHOOK__URL",
            format!("https://127.0.0.1:{port}/validate"),
        )
        .env(
            "KUBE_OBJECT_LOCK__METRICS__LISTEN",
            format!("127.0.0.1:{metrics_port}"),
        )
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    Ok(())
}

impl Spare {
    /// `bin serve` with `kubeconfig` on `ports` (webhook, metrics), logging to `log`, with extra
    /// environment (settings).
    pub fn start(
        bin: &Path,
        files: &Files,
        kubeconfig: &Path,
        log: &Path,
        (port, metrics_port): (u16, u16),
        env: &[(&str, String)],
    ) -> Result<Spare> {
        let mut cmd = Command::new(bin);
        serve(&mut cmd, files, kubeconfig, (port, metrics_port), log)?;
        let child = cmd
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .spawn()
            .with_context(|| format!("cannot start a second serve ({})", bin.display()))?;
        let mut spare = Spare {
            child,
            log: log.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = spare.child.try_wait()? {
                bail!("serve exited ({status}): {}", tail(log, 20));
            }
            let up = |p| std::net::TcpStream::connect(("127.0.0.1", p)).is_ok();
            if up(port) && up(metrics_port) {
                return Ok(spare);
            }
            ensure!(
                Instant::now() < deadline,
                "the second serve does not listen after 30s: {}",
                tail(log, 20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM; it must exit 0 within 10 s.
    pub fn stop(mut self) -> Result<()> {
        match terminate(&mut self.child)? {
            Some(status) => ensure!(
                status.success(),
                "the second serve exited with {status}: {}",
                tail(&self.log, 20)
            ),
            None => bail!("the second serve ignored SIGTERM for 10s"),
        }
        Ok(())
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

/// The last `lines` lines of a file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `kube-object-lock certs --client` into `files.dir/pki`.
pub fn make_certs(bin: &Path, files: &Files) -> Result<()> {
    let out = files.dir.join("pki");
    let out = out.to_string_lossy();
    run(
        bin,
        &["certs", "--out", &out, "--san", "127.0.0.1", "--client"],
        None,
        None,
    )
    .check()?;
    Ok(())
}

/// The CRDs from `kube-object-lock crd`, applied and Established.
pub fn install_crds(bin: &Path, kubectl: &Kubectl) -> Result<()> {
    let crds = run(bin, &["crd"], None, None).check()?.stdout;
    kubectl.apply(&crds)?;
    kubectl
        .run(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/locks.objectlock.dev",
            "crd/clusterlocks.objectlock.dev",
        ])
        .check()?;
    Ok(())
}

/// A kubeconfig for ServiceAccount `namespace/name` in the webhook's kubeconfig file.
pub fn identity(kubectl: &Kubectl, namespace: &str, name: &str, files: &Files) -> Result<()> {
    identity_at(kubectl, namespace, name, &files.kubeconfig())
}

/// A kubeconfig for ServiceAccount `namespace/name` at `path`: the suite's cluster entry and a
/// token from the TokenRequest API (works without the token controller).
pub fn identity_at(kubectl: &Kubectl, namespace: &str, name: &str, path: &Path) -> Result<()> {
    kubectl
        .run(&["create", "serviceaccount", name, "-n", namespace])
        .check()?;
    let token = kubectl
        .run(&["create", "token", name, "-n", namespace, "--duration=2h"])
        .check()?
        .stdout
        .trim()
        .to_owned();
    kubeconfig_for(kubectl, name, serde_json::json!({"token": token}), path)
}

/// A kubeconfig at `path` for the suite's cluster as `name`, authenticated by `user` (a
/// kubeconfig `user` entry: a token, a client certificate).
pub fn kubeconfig_for(kubectl: &Kubectl, name: &str, user: Value, path: &Path) -> Result<()> {
    let view = kubectl.view()?;
    let cluster = view["clusters"][0]["cluster"].clone();
    ensure!(cluster.is_object(), "no cluster in the kubeconfig: {view}");
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": "cluster", "user": name}}],
        "current-context": name,
    });
    write_private(path, &serde_json::to_string_pretty(&kubeconfig)?)
}

/// Writes a file readable by its owner only (it holds a token).
pub fn write_private(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = File::options()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// `manifests cluster --url URL --ca-file ca.crt --service-account NS/NAME`, applied
/// server-side.
pub fn register(bin: &Path, kubectl: &Kubectl, files: &Files, sa: &str) -> Result<()> {
    kubectl.apply(&cluster_manifests(bin, files, &["--service-account", sa])?)?;
    Ok(())
}

/// What `manifests cluster --url URL --ca-file ca.crt FLAGS...` prints.
pub fn cluster_manifests(bin: &Path, files: &Files, flags: &[&str]) -> Result<String> {
    let ca = files.pki("ca.crt");
    let ca = ca.to_string_lossy();
    let mut args = vec!["manifests", "cluster", "--url", URL, "--ca-file", &ca];
    args.extend(flags);
    Ok(run(bin, &args, None, None).check()?.stdout)
}

/// The URL of the first webhook of the registration, or `None` when there is none.
pub fn registered_url(kubectl: &Kubectl) -> Result<Option<String>> {
    let out = kubectl.run(&[
        "get",
        "validatingwebhookconfiguration",
        REGISTRATION,
        "-o",
        "json",
        "--ignore-not-found",
    ]);
    let out = out.check()?;
    if out.stdout.trim().is_empty() {
        return Ok(None);
    }
    let vwc: Value = serde_json::from_str(&out.stdout)?;
    Ok(Some(
        vwc["webhooks"][0]["clientConfig"]["url"]
            .as_str()
            .unwrap_or("(no url)")
            .to_owned(),
    ))
}

/// `manifests apiserver` for [`URL`], into `files.apiserver_dir()`; returns the path of
/// `admission-config.yaml`.
pub fn apiserver_files(bin: &Path, files: &Files) -> Result<PathBuf> {
    let dir = files.apiserver_dir();
    run(
        bin,
        &[
            "manifests",
            "apiserver",
            "--client-cert",
            &files.pki("apiserver-client.crt").to_string_lossy(),
            "--client-key",
            &files.pki("apiserver-client.key").to_string_lossy(),
            "--url",
            URL,
            "--dir",
            &dir.to_string_lossy(),
        ],
        None,
        None,
    )
    .check()?;
    Ok(dir.join("admission-config.yaml"))
}

/// curl to the suite's webhook: the CA of the run, and the API server's client certificate (the
/// webhook asks for it only when it requires one).
pub fn curl(files: &Files, path: &str, body: Option<&str>) -> Result<(u16, String)> {
    let (ca, cert, key) = (
        files.pki("ca.crt"),
        files.pki("apiserver-client.crt"),
        files.pki("apiserver-client.key"),
    );
    let (ca, cert, key) = (
        ca.to_string_lossy(),
        cert.to_string_lossy(),
        key.to_string_lossy(),
    );
    let url = format!("https://127.0.0.1:{PORT}{path}");
    // Longer than kube.lookup_timeout (2 s): a refusal for a lookup error takes that long.
    let mut args = vec![
        "-sS",
        "--max-time",
        "5",
        "--cacert",
        &ca,
        "--cert",
        &cert,
        "--key",
        &key,
        "-w",
        "\n%{http_code}",
    ];
    if body.is_some() {
        args.extend([
            "-H",
            "content-type: application/json",
            "--data-binary",
            "@-",
        ]);
    }
    args.push(&url);
    let out = run(Path::new("curl"), &args, body, None).check()?;
    let (text, code) = out
        .stdout
        .rsplit_once('\n')
        .context("curl printed no status code")?;
    let code = code.trim().parse().context("curl's status code")?;
    Ok((code, text.to_owned()))
}
