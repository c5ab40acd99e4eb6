//! A lock held while a command runs (`kubectl lock RESOURCE/NAME -- COMMAND`): in force during
//! the command, removed when it ends (normally, with an error, on SIGTERM to kubectl lock), and
//! lapsing within its lease when kubectl lock is killed with SIGKILL.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use rustix::process::{Pid, Signal, kill_process};

use crate::suite::{Ctx, ENFORCE_WITHIN, locked};

/// The plugin binary holding `target` in `ns` while `script` runs under `sh -c`.
fn hold(ctx: &Ctx, ns: &str, target: &str, flags: &[&str], script: &str) -> Result<Child> {
    Command::new(&ctx.env.cfg.plugin_bin)
        .args([target, "-n", ns, "--kubeconfig"])
        .arg(&ctx.env.kubectl.kubeconfig)
        .args(flags)
        .args(["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting kubectl-lock")
}

/// Its exit code and stderr.
fn ended(child: Child) -> Result<(Option<i32>, String)> {
    let out = child.wait_with_output()?;
    Ok((
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// Waits until the command under the lock has written `path`.
fn appears(path: &Path) -> Result<()> {
    let start = Instant::now();
    while !path.exists() {
        if start.elapsed() > ENFORCE_WITHIN {
            bail!("{} never appeared", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn signal(pid: u32, signal: Signal) -> Result<()> {
    let pid = Pid::from_raw(i32::try_from(pid)?).context("a pid")?;
    kill_process(pid, signal).context("sending a signal")
}

pub fn run(ctx: &Ctx) -> Result<()> {
    let ns = ctx.namespace("")?;
    let n = ns.as_str();
    let rest = ctx.rest();
    ctx.configmap(&ns, "data", serde_json::json!({}))?;
    let data = format!("/api/v1/namespaces/{ns}/configmaps/data");
    let lock = format!("/apis/objectlock.dev/v1alpha1/namespaces/{ns}/locks/data");
    let dir = tempfile::tempdir()?;
    let file = |name: &str| -> PathBuf { dir.path().join(name) };
    let gone = |what: &str| -> Result<()> {
        let reply = rest.get(&lock)?;
        ensure!(
            reply.code == 404,
            "Lock {ns}/data still there {what}: {}",
            reply.body["metadata"]
        );
        Ok(())
    };

    // A write from inside the command is refused; its exit status is passed through.
    let kubectl = ctx.env.kubectl.bin.display();
    let kubeconfig = ctx.env.kubectl.kubeconfig.display();
    let refused = file("refused");
    let script = format!(
        "{kubectl} --kubeconfig {kubeconfig} label cm data -n {n} x=1 2> {} && exit 9; exit 5",
        refused.display()
    );
    let (code, stderr) = ended(hold(ctx, n, "cm/data", &[], &script)?)?;
    ensure!(
        code == Some(5),
        "exit {code:?}, not the command's 5: {stderr}"
    );
    let message = std::fs::read_to_string(&refused)?;
    ensure!(
        message.contains(&locked("configmaps", n, "data", None)),
        "the write inside the command was not refused by the lock: {message}"
    );
    ensure!(
        stderr.starts_with(&format!(
            "locked configmaps \"data\" in namespace \"{ns}\" with Lock {ns}/data (UPDATE, DELETE; held by user \"{}\"; lease 1m) (enforced by",
            ctx.env.user
        )),
        "{stderr}"
    );
    gone("after the command failed")?;
    ctx.k(&["label", "cm", "data", "-n", n, "x=1"]).allowed()?;

    // A normal end.
    let (code, stderr) = ended(hold(ctx, n, "cm/data", &[], "exit 0")?)?;
    ensure!(code == Some(0), "exit {code:?}: {stderr}");
    gone("after the command succeeded")?;

    // SIGTERM to kubectl lock: passed to the command, which it ends; the lock goes.
    let started = file("started");
    let script = format!("touch {}; exec sleep 60", started.display());
    let child = hold(ctx, n, "cm/data", &[], &script)?;
    appears(&started)?;
    signal(child.id(), Signal::TERM)?;
    let (code, stderr) = ended(child)?;
    ensure!(
        code == Some(143),
        "exit {code:?}, not 128+SIGTERM: {stderr}"
    );
    gone("after SIGTERM")?;

    // SIGKILL: nothing removes the lock, but its lease runs out.
    let (started, pid) = (file("started-2"), file("pid"));
    let script = format!(
        "echo $$ > {}; touch {}; exec sleep 60",
        pid.display(),
        started.display()
    );
    let child = hold(ctx, n, "cm/data", &["--lease", "6s"], &script)?;
    appears(&started)?;
    rest.probe_update(&data)?.refused(
        "update while the command runs",
        &locked("configmaps", n, "data", None),
    )?;
    let orphan: u32 = std::fs::read_to_string(&pid)?.trim().parse()?;
    signal(child.id(), Signal::KILL)?;
    let killed = Instant::now();
    // The command lives on, orphaned, holding the pipes: it is not the test's to keep.
    signal(orphan, Signal::KILL)?;
    let (code, _) = ended(child)?;
    ensure!(code.is_none(), "kubectl lock survived SIGKILL");
    ctx.released(
        "update after the lease ran out",
        Duration::from_secs(20),
        || rest.probe_update(&data),
    )?;
    ctx.figure(format!(
        "lock of a SIGKILLed kubectl lock (--lease 6s) lapsed {:.1}s after the kill",
        killed.elapsed().as_secs_f64()
    ));
    ensure!(
        rest.get(&lock)?.code == 200,
        "the lapsed Lock should still exist (only its expiresAt passed)"
    );
    Ok(())
}
