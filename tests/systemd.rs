//! The binary as systemd runs it: the notify socket's STATUS line, and the journal's native
//! protocol (in a private mount namespace whose /run holds a socket of the test's own).

mod support;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{Certs, lock_yaml};

const BIN: &str = env!("CARGO_BIN_EXE_kube-object-lock");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port()
}

/// `serve` on a free port with a files source, as `cmd` (the binary or a wrapper) runs it.
fn serve(mut cmd: Command, certs: &Certs, locks: &Path, port: u16) -> Command {
    cmd.env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .env_remove("NOTIFY_SOCKET")
        .env_remove("JOURNAL_STREAM")
        .env("HOME", "/nonexistent")
        .env("KUBE_OBJECT_LOCK__METRICS__LISTEN", "")
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--tls-cert")
        .arg(certs.path("tls.crt"))
        .arg("--tls-key")
        .arg(certs.path("tls.key"))
        .arg("--locks-dir")
        .arg(locks)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{name}");
}

/// Receives datagrams until one satisfies `want`; returns it.
fn recv_until(socket: &UnixDatagram, what: &str, want: impl Fn(&str) -> bool) -> String {
    let mut buf = vec![0u8; 65536];
    let mut seen = Vec::new();
    loop {
        let n = match socket.recv(&mut buf) {
            Ok(n) => n,
            Err(e) => panic!("no {what} ({e}); received: {seen:#?}"),
        };
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        if want(&text) {
            return text;
        }
        seen.push(text);
    }
}

#[test]
fn a_reload_and_a_stop_right_after_ready_are_handled_not_fatal() {
    let certs = Certs::new();
    let locks = tempfile::tempdir().expect("tempdir");
    let notify_dir = tempfile::tempdir().expect("tempdir");
    let notify_path = notify_dir.path().join("notify");
    let notify = UnixDatagram::bind(&notify_path).expect("notify socket");
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    // The window is short: a few starts make a default-action SIGTERM all but certain to show.
    for _ in 0..10 {
        let mut cmd = serve(Command::new(BIN), &certs, locks.path(), free_port());
        let child = cmd
            .env("NOTIFY_SOCKET", &notify_path)
            .env("KUBE_OBJECT_LOCK__SERVER__SHUTDOWN_GRACE", "1s")
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        recv_until(&notify, "READY=1", |m| m.contains("READY=1"));
        signal(&child, "HUP");
        signal(&child, "TERM");
        let out = child.wait_with_output().expect("wait");
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{:?}: {log}", out.status);
        assert!(log.contains("SIGTERM received"), "{log}");
        // The STOPPING=1 of this run, so the next READY=1 is the next run's.
        recv_until(&notify, "STOPPING=1", |m| m.contains("STOPPING=1"));
    }
}
