//! The servers under test, as subprocesses, and the fake API server the webhook reads locks
//! from; one scenario runs the baseline, then the webhook, under the same load.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kube_object_lock::cli::certs::{CertsRequest, generate};
use serde_json::json;

use crate::Servers;
use crate::client::{self, Outcome, Plan, Probe, Sample, Target};
use crate::fake_apiserver::FakeApiServer;
use crate::scenarios::Scenario;

/// The longest a server may take to become ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a server may take to stop after SIGTERM (its shutdown grace is 20 s).
const STOP_TIMEOUT: Duration = Duration::from_secs(25);

/// What every run shares: certificates, binaries, a scratch directory.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub server_bin: PathBuf,
    pub server_env: Vec<(String, String)>,
    /// A command both servers run under (a profiler), or empty.
    pub wrapper: Vec<String>,
    pub bench_bin: PathBuf,
    /// Clock ticks per second, for /proc/PID/stat.
    pub ticks_per_second: u64,
}

impl Env {
    pub fn new(
        server_bin: PathBuf,
        server_env: Vec<(String, String)>,
        wrapper: Vec<String>,
    ) -> anyhow::Result<Env> {
        let dir = tempfile::tempdir().context("scratch directory")?;
        generate(&CertsRequest {
            out: dir.path().to_owned(),
            sans: vec![],
            days: 1,
            ca_days: 2,
            force: false,
            client: false,
        })
        .context("certificates")?;
        let bench_bin = std::env::current_exe().context("the benchmark's own path")?;
        Ok(Env {
            dir,
            server_bin,
            server_env,
            wrapper,
            bench_bin,
            ticks_per_second: ticks_per_second(),
        })
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// A command running `program`, under the wrapper if there is one.
    fn command(&self, program: &Path) -> Command {
        match self.wrapper.split_first() {
            Some((wrapper, args)) => {
                let mut command = Command::new(wrapper);
                command.args(args).arg(program);
                command
            }
            None => Command::new(program),
        }
    }
}

/// `getconf CLK_TCK`; 100 on every Linux this runs on.
fn ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// One server's results in a scenario.
pub struct Run {
    pub server: &'static str,
    pub outcome: Outcome,
    /// `VmHWM` at the end of the run, in KiB.
    pub peak_rss_kib: Option<u64>,
    /// API server requests during the warm-up and during the measured window (webhook only).
    pub api: Option<ApiCalls>,
    pub ticks_per_second: u64,
}

/// The fake API server's requests, sorted out.
#[derive(Debug, Default, Clone)]
pub struct ApiCalls {
    /// Until the first warm-up (the watch's initial lists and watches).
    pub startup: Classified,
    /// During the warm-ups and the other server's turns.
    pub warmup: Classified,
    /// During the measured windows.
    pub window: Classified,
}

/// Requests by kind.
#[derive(Debug, Default, Clone, Copy)]
pub struct Classified {
    /// LIST of one namespace's Locks, or of the ClusterLocks, by a lookup.
    pub lookup_lists: usize,
    /// The watch's own LISTs (cluster-wide, paged).
    pub watch_lists: usize,
    /// WATCH requests.
    pub watches: usize,
    /// Anything else (GET, POST...).
    pub other: usize,
}

impl Classified {
    fn add(&mut self, other: Classified) {
        self.lookup_lists += other.lookup_lists;
        self.watch_lists += other.watch_lists;
        self.watches += other.watches;
        self.other += other.other;
    }

    fn subtract(&mut self, other: Classified) {
        self.lookup_lists = self.lookup_lists.saturating_sub(other.lookup_lists);
        self.watch_lists = self.watch_lists.saturating_sub(other.watch_lists);
        self.watches = self.watches.saturating_sub(other.watches);
        self.other = self.other.saturating_sub(other.other);
    }

    pub fn total(&self) -> usize {
        self.lookup_lists + self.watch_lists + self.watches + self.other
    }

    fn of(log: &[String]) -> Classified {
        let mut c = Classified::default();
        for line in log {
            let (method, target) = line.split_once(' ').unwrap_or(("", line));
            let (path, query) = target.split_once('?').unwrap_or((target, ""));
            let watching = query
                .split('&')
                .any(|kv| kv == "watch=true" || kv == "watch=1");
            let prefix = "/apis/objectlock.dev/v1alpha1/";
            let rest = path.strip_prefix(prefix).unwrap_or("");
            if method != "GET" {
                c.other += 1;
            } else if watching {
                c.watches += 1;
            } else if rest == "locks" {
                // Locks across all namespaces: only the watch lists them so.
                c.watch_lists += 1;
            } else if rest.starts_with("namespaces/") && rest.ends_with("/locks") {
                c.lookup_lists += 1;
            } else if rest == "clusterlocks" {
                // The watch pages its lists (`limit=`); a lookup sends no query at all.
                if query.contains("limit=") {
                    c.watch_lists += 1;
                } else {
                    c.lookup_lists += 1;
                }
            } else {
                c.other += 1;
            }
        }
        c
    }
}

/// A scenario's results.
pub struct ScenarioResult {
    pub name: crate::scenarios::Name,
    pub about: String,
    pub expected_denied: f64,
    pub baseline: Option<Run>,
    pub ours: Option<Run>,
}

/// A server up and ready, and what its run needs.
struct Running {
    name: &'static str,
    process: ServerProcess,
    target: Arc<Target>,
    /// The fake API server the webhook reads (none for the baseline).
    fake: Option<FakeApi>,
    outcome: Option<Outcome>,
}

/// Runs one scenario. Both servers are started and left idle between their turns; the measured
/// window is cut into `plan.rounds` slices, taken in turns (baseline, webhook, webhook,
/// baseline, ...) so that both see the same noise from whatever else the machine runs.
pub fn run_scenario(
    runtime: &tokio::runtime::Runtime,
    env: &Env,
    scenario: &Scenario,
    plan: &Plan,
    servers: Servers,
) -> anyhow::Result<ScenarioResult> {
    eprintln!("== {}: {}", scenario.name, scenario.about);
    let mut running = Vec::new();
    if servers != Servers::Ours {
        running.push(start_baseline(runtime, env).context("baseline")?);
    }
    if servers != Servers::Baseline {
        running.push(start_ours(runtime, env, scenario).context("webhook")?);
    }
    let rounds = plan.rounds.max(1);
    let slice = plan.duration / rounds as u32;
    for round in 0..rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..running.len()).collect()
        } else {
            (0..running.len()).rev().collect()
        };
        for i in order {
            let server = &mut running[i];
            let first = server.outcome.is_none();
            let plan = Plan {
                duration: slice,
                // Later turns only open their connections again.
                warmup: if first {
                    plan.warmup
                } else {
                    Duration::from_millis(200)
                },
                full_pass: first,
                new_connection: scenario.new_connection,
                ..plan.clone()
            };
            let probe = server
                .process
                .probe(server.fake.as_ref().map(|f| f.api.clone()));
            let outcome = runtime.block_on(client::run(
                server.target.clone(),
                scenario.bodies.clone(),
                &plan,
                probe,
            ));
            match &mut server.outcome {
                Some(total) => total.merge(outcome),
                None => server.outcome = Some(outcome),
            }
        }
    }
    let mut result = ScenarioResult {
        name: scenario.name,
        about: scenario.about.clone(),
        expected_denied: scenario.expected_denied,
        baseline: None,
        ours: None,
    };
    for server in running {
        let peak_rss_kib = server.process.peak_rss_kib();
        server.process.stop()?;
        let outcome = server.outcome.expect("every server ran at least once");
        let api = server.fake.map(|fake| {
            let log = fake.api.request_log();
            fake.stop();
            api_calls(&log, &outcome)
        });
        let run = Run {
            server: server.name,
            outcome,
            peak_rss_kib,
            api,
            ticks_per_second: env.ticks_per_second,
        };
        if server.name == "baseline" {
            result.baseline = Some(run);
        } else {
            result.ours = Some(run);
        }
    }
    Ok(result)
}

/// Lock-to-enforcement: how long from the API server acknowledging a Lock's creation to the
/// first refused admission of its object.
pub struct Enforcement {
    /// One per lock, in microseconds.
    pub latency: hdrhistogram::Histogram<u64>,
    /// Locks never enforced within [`ENFORCE_TIMEOUT`].
    pub missed: usize,
}

/// The longest wait for one lock to be enforced.
const ENFORCE_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the webhook with the watch live, then creates `samples` Locks one at a time, each in
/// its own namespace, and after each sends the DELETE of its object on a kept connection until
/// it is refused. The time counted runs from the fake API server storing the Lock (when a real
/// one acknowledges the create) to the refusal.
pub fn measure_enforcement(
    runtime: &tokio::runtime::Runtime,
    env: &Env,
    samples: usize,
) -> anyhow::Result<Enforcement> {
    let bodies = crate::scenarios::enforcement_bodies(samples)?;
    let scenario = Scenario::plain(crate::scenarios::Name::OneNamespace);
    let server = start_ours(runtime, env, &scenario)?;
    let fake = server
        .fake
        .as_ref()
        .context("the webhook has a fake API server")?;
    let mut latency = hdrhistogram::Histogram::<u64>::new(3).context("histogram")?;
    let mut missed = 0;
    let measured: anyhow::Result<()> = runtime.block_on(async {
        let mut sender = server.target.connect().await?;
        for (i, body) in bodies.into_iter().enumerate() {
            let namespace = crate::scenarios::namespace_of(i);
            anyhow::ensure!(
                !server.target.denied(&mut sender, body.clone()).await?,
                "{namespace}: refused before its lock exists"
            );
            let name = crate::scenarios::enforced_object(i);
            fake.api.create_lock(
                &namespace,
                &name,
                json!({ "reason": "enforcement benchmark" }),
            );
            let created = Instant::now();
            loop {
                if server.target.denied(&mut sender, body.clone()).await? {
                    let us = u64::try_from(created.elapsed().as_micros()).unwrap_or(u64::MAX);
                    latency.record(us.max(1)).context("record")?;
                    break;
                }
                if created.elapsed() > ENFORCE_TIMEOUT {
                    missed += 1;
                    break;
                }
            }
        }
        Ok(())
    });
    let Running { process, fake, .. } = server;
    process.stop()?;
    if let Some(fake) = fake {
        fake.stop();
    }
    measured?;
    Ok(Enforcement { latency, missed })
}

/// Sorts the fake API server's log into start-up, warm-up and measured windows.
fn api_calls(log: &[String], outcome: &Outcome) -> ApiCalls {
    let at = |s: &Sample| s.api_requests.unwrap_or(log.len()).min(log.len());
    let before = at(&outcome.before);
    let mut window = Classified::default();
    for (start, end) in &outcome.windows {
        let (start, end) = (at(start), at(end).max(at(start)));
        window.add(Classified::of(&log[start..end]));
    }
    let last = outcome.windows.last().map_or(before, |(_, end)| at(end));
    let mut warmup = Classified::of(&log[before..last.max(before)]);
    warmup.subtract(window);
    ApiCalls {
        startup: Classified::of(&log[..before]),
        warmup,
        window,
    }
}

fn start_baseline(runtime: &tokio::runtime::Runtime, env: &Env) -> anyhow::Result<Running> {
    let addr = free_addr()?;
    let mut command = env.command(&env.bench_bin);
    command.arg("--serve-baseline").arg(addr.to_string());
    command.arg(env.path("tls.crt")).arg(env.path("tls.key"));
    let process = ServerProcess::spawn(command, "baseline", &env.path("baseline.log"))?;
    let target = Arc::new(Target::new(addr, &env.path("ca.crt"))?);
    runtime.block_on(process.wait_ready(&target, "/"))?;
    eprintln!("   baseline (pid {}) ready on {addr}", process.pid());
    Ok(Running {
        name: "baseline",
        process,
        target,
        fake: None,
        outcome: None,
    })
}

fn start_ours(
    runtime: &tokio::runtime::Runtime,
    env: &Env,
    scenario: &Scenario,
) -> anyhow::Result<Running> {
    let fake = FakeApi::start()?;
    for (namespace, name) in &scenario.locks {
        fake.api
            .create_lock(namespace, name, scenario.lock_spec.clone());
    }
    for (collection, object) in &scenario.objects {
        fake.api.add_object(collection, object.clone());
    }
    let kubeconfig = env.path("kubeconfig.yaml");
    std::fs::write(&kubeconfig, kubeconfig_yaml(&fake.api.url()))
        .with_context(|| format!("write {}", kubeconfig.display()))?;
    let addr = free_addr()?;
    let mut command = env.command(&env.server_bin);
    command.arg("serve").arg("--listen").arg(addr.to_string());
    command.arg("--tls-cert").arg(env.path("tls.crt"));
    command.arg("--tls-key").arg(env.path("tls.key"));
    command.arg("--kubeconfig").arg(&kubeconfig);
    // Denials log at info; one line each would measure the terminal.
    command.env("KUBE_OBJECT_LOCK__LOG__LEVEL", "warn");
    // Any free port: a fixed one may be taken by another process on the machine.
    command.env("KUBE_OBJECT_LOCK__METRICS__LISTEN", "127.0.0.1:0");
    command.env_remove("RUST_LOG");
    for (key, value) in &env.server_env {
        command.env(key, value);
    }
    let process = ServerProcess::spawn(command, "kube-object-lock", &env.path("webhook.log"))?;
    let target = Arc::new(Target::new(addr, &env.path("ca.crt"))?);
    // Ready once the certificate is loaded and the watch has synced.
    runtime.block_on(process.wait_ready(&target, "/readyz"))?;
    eprintln!("   webhook (pid {}) ready on {addr}", process.pid());
    settle(&fake.api);
    Ok(Running {
        name: "ours",
        process,
        target,
        fake: Some(fake),
        outcome: None,
    })
}

/// Waits until the webhook's start-up writes (the status of every Lock, once) are done: no
/// write for a second, at most [`SETTLE_TIMEOUT`]. The steady state is what is measured; the
/// start-up cost is printed and counted apart (in "start-up").
fn settle(api: &FakeApiServer) {
    let writes = || {
        api.request_log()
            .iter()
            .filter(|line| !line.starts_with("GET "))
            .count()
    };
    let started = Instant::now();
    let (mut seen, mut since) = (writes(), Instant::now());
    while since.elapsed() < Duration::from_secs(1) && started.elapsed() < SETTLE_TIMEOUT {
        std::thread::sleep(Duration::from_millis(100));
        let now = writes();
        if now != seen {
            (seen, since) = (now, Instant::now());
        }
    }
    eprintln!(
        "   webhook settled {:.1}s after ready: {seen} writes to the API server (lock status){}",
        started.elapsed().as_secs_f64(),
        if started.elapsed() >= SETTLE_TIMEOUT {
            " - still writing, measured anyway"
        } else {
            ""
        }
    );
}

/// Longest wait for the start-up writes.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);

fn kubeconfig_yaml(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: fake
  cluster:
    server: {url}
users:
- name: bench
  user: {{}}
contexts:
- name: fake
  context:
    cluster: fake
    user: bench
current-context: fake
"
    )
}

/// A free port on 127.0.0.1 (bound and released; nothing else on the machine races for it).
fn free_addr() -> anyhow::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// The fake API server, on a runtime of its own so that the load generator's busy threads do
/// not delay its answers (a real API server is another process).
struct FakeApi {
    runtime: tokio::runtime::Runtime,
    api: FakeApiServer,
}

impl FakeApi {
    fn start() -> anyhow::Result<FakeApi> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fake-apiserver")
            .enable_all()
            .build()
            .context("fake API server runtime")?;
        let api = runtime.block_on(FakeApiServer::start());
        Ok(FakeApi { runtime, api })
    }

    fn stop(self) {
        self.runtime.block_on(self.api.stop());
    }
}

/// A server subprocess; killed if dropped while running.
struct ServerProcess {
    child: Child,
    name: &'static str,
    log: PathBuf,
}

impl ServerProcess {
    fn spawn(mut command: Command, name: &'static str, log: &Path) -> anyhow::Result<Self> {
        let file = File::create(log).with_context(|| format!("create {}", log.display()))?;
        command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {name} ({:?})", command.get_program()))?;
        Ok(ServerProcess {
            child,
            name,
            log: log.to_owned(),
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until `GET path` answers 200, failing early if the process exits.
    async fn wait_ready(&self, target: &Target, path: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::from("no attempt");
        while Instant::now() < deadline {
            if !alive(self.pid()) {
                bail!(
                    "{} exited before becoming ready; its output:\n{}",
                    self.name,
                    self.output()
                );
            }
            match target.get(path).await {
                Ok(200) => return Ok(()),
                Ok(status) => last = format!("HTTP {status}"),
                Err(e) => last = format!("{e:#}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "{} not ready on {} within {START_TIMEOUT:?} (last: {last}); its output:\n{}",
            self.name,
            target.addr,
            self.output()
        )
    }

    fn output(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(4000);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        text[start..].to_owned()
    }

    /// Samples this process's CPU time and, if given, the fake API server's request count.
    fn probe(&self, api: Option<FakeApiServer>) -> Probe {
        let pid = self.pid();
        Arc::new(move || Sample {
            cpu_ticks: cpu_ticks(&format!("/proc/{pid}/stat")),
            own_cpu_ticks: cpu_ticks("/proc/self/stat"),
            machine_ticks: machine_ticks(),
            api_requests: api.as_ref().map(|a| a.request_log().len()),
        })
    }

    fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// SIGTERM, then waits for the drain; SIGKILL if it does not end in time.
    fn stop(mut self) -> anyhow::Result<()> {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    eprintln!(
                        "   warning: {} exited with {status}; its output:\n{}",
                        self.name,
                        self.output()
                    );
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "   warning: {} did not stop within {STOP_TIMEOUT:?}; killing it",
            self.name
        );
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped) has state Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_owned())
        })
        .is_some_and(|rest| !rest.starts_with('Z'))
}

/// utime + stime of a process (`/proc/PID/stat`), in clock ticks.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(stat).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // Fields after the command: state is field 3; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// (busy, total) clock ticks of all CPUs together, from the first line of /proc/stat.
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    // user nice system idle iowait irq softirq steal (guest time is counted in user already).
    let ticks: Vec<u64> = line
        .split_whitespace()
        .take(8)
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    let total: u64 = ticks.iter().sum();
    let idle = ticks.get(3)? + ticks.get(4)?;
    Some((total - idle, total))
}
