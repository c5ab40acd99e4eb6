//! The local control plane (`~/.cache/control-plane`): only there can the suite restart the API
//! server, with or without extra flags, through the control plane's own scripts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::env::{canonical, harness_dir};

/// A running local control plane.
#[derive(Debug, Clone)]
pub struct Harness {
    pub dir: PathBuf,
    /// kube-controller-manager runs too (kept across restarts).
    pub kcm: bool,
}

/// True when the PID in `run/NAME.pid` runs `bin/NAME` of this control plane.
fn alive(dir: &Path, name: &str) -> bool {
    let Ok(pid) = std::fs::read_to_string(dir.join("run").join(format!("{name}.pid"))) else {
        return false;
    };
    let exe = std::fs::read_link(format!("/proc/{}/exe", pid.trim()));
    exe.is_ok_and(|exe| exe == dir.join("bin").join(name))
}

/// utime + stime of a `/proc/PID/stat` line, in clock ticks.
fn cpu_ticks(stat: &str) -> Option<u64> {
    // After the command, which may hold spaces and parentheses: state is field 3, utime and
    // stime are fields 14 and 15.
    let (_, fields) = stat.rsplit_once(')')?;
    let mut fields = fields.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`), asked once.
fn ticks_per_second() -> Result<f64> {
    static TICKS: OnceLock<Option<f64>> = OnceLock::new();
    let ticks = TICKS.get_or_init(|| {
        let out = Command::new("getconf").arg("CLK_TCK").output().ok()?;
        let ticks: f64 = String::from_utf8(out.stdout).ok()?.trim().parse().ok()?;
        (ticks > 0.0).then_some(ticks)
    });
    ticks.context("`getconf CLK_TCK` gave no number of clock ticks per second")
}

impl Harness {
    /// The control plane, if `kubeconfig` is its kubeconfig and its API server runs.
    pub fn detect(kubeconfig: &Path) -> Option<Harness> {
        let dir = canonical(&harness_dir()?);
        let ours = canonical(kubeconfig) == canonical(&dir.join("kubeconfig"));
        (ours && dir.join("up.sh").is_file() && alive(&dir, "kube-apiserver")).then(|| Harness {
            kcm: alive(&dir, "kube-controller-manager"),
            dir,
        })
    }

    /// The PID of this control plane's running kube-apiserver (`run/kube-apiserver.pid`, checked
    /// to be `bin/kube-apiserver`, so that a stale file never names another process).
    pub fn apiserver_pid(&self) -> Result<i32> {
        let file = self.dir.join("run").join("kube-apiserver.pid");
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let pid: i32 = text
            .trim()
            .parse()
            .with_context(|| format!("{}: not a pid: {text:?}", file.display()))?;
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
        let ours = self.dir.join("bin").join("kube-apiserver");
        ensure!(
            exe.as_ref().is_ok_and(|exe| *exe == ours),
            "pid {pid} from {} is not {} ({exe:?})",
            file.display(),
            ours.display()
        );
        Ok(pid)
    }

    /// The CPU time (user and system, every thread) this control plane's API server has used
    /// since it started, from `/proc/PID/stat`: what requests cost it, a figure that a busy
    /// machine delays but does not move the way it moves throughput.
    pub fn apiserver_cpu(&self) -> Result<Duration> {
        let pid = self.apiserver_pid()?;
        let file = format!("/proc/{pid}/stat");
        let stat = std::fs::read_to_string(&file).with_context(|| format!("cannot read {file}"))?;
        let ticks = cpu_ticks(&stat).with_context(|| format!("{file}: no utime, stime: {stat}"))?;
        Ok(Duration::from_secs_f64(ticks as f64 / ticks_per_second()?))
    }

    /// Stops the control plane (etcd's data is kept) and starts it again, the API server with
    /// `apiserver_args`, after `KOL_E2E_OUTAGE_SECONDS` (default 0) down; returns when
    /// `/readyz` is ok, with the time the start took.
    pub fn restart(&self, apiserver_args: &str) -> Result<Duration> {
        let down = Command::new(self.dir.join("down.sh")).output()?;
        ensure!(
            down.status.success(),
            "down.sh failed: {}",
            String::from_utf8_lossy(&down.stderr)
        );
        let outage = std::env::var("KOL_E2E_OUTAGE_SECONDS").unwrap_or_default();
        if !outage.is_empty() {
            let seconds: u64 = outage
                .parse()
                .with_context(|| format!("KOL_E2E_OUTAGE_SECONDS={outage}: not a whole number"))?;
            std::thread::sleep(Duration::from_secs(seconds));
        }
        let start = Instant::now();
        let up = Command::new(self.dir.join("up.sh"))
            .env("KCM", if self.kcm { "1" } else { "0" })
            .env("APISERVER_ARGS", apiserver_args)
            .env_remove("RESET")
            .output()?;
        ensure!(
            up.status.success(),
            "up.sh failed: {}",
            String::from_utf8_lossy(&up.stderr)
        );
        Ok(start.elapsed())
    }
}
