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

fn stop(mut child: Child) -> std::process::ExitStatus {
    signal(&child, "TERM");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        assert!(Instant::now() < deadline, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
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

fn status_line(message: &str) -> Option<&str> {
    message.lines().find_map(|l| l.strip_prefix("STATUS="))
}

#[test]
fn a_failed_certificate_reload_shows_in_the_status_line_until_a_good_reload() {
    let certs = Certs::new();
    let locks = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let (notify_dir, notify) = notify_socket();
    let notify_path = notify_dir.path().join("notify");
    let mut cmd = serve(Command::new(BIN), &certs, locks.path(), port);
    cmd.env("NOTIFY_SOCKET", &notify_path).stderr(Stdio::null());
    let child = cmd.spawn().expect("spawn");

    let ready = recv_until(&notify, "READY=1", |m| m.contains("READY=1"));
    let serving = status_line(&ready).expect("STATUS with READY").to_owned();
    assert!(serving.starts_with("serving on 127.0.0.1:"), "{serving}");

    // A broken certificate: still served the old one, and the status line says so.
    std::fs::write(certs.path("tls.crt"), "not a certificate").expect("write");
    signal(&child, "HUP");
    let failed = recv_until(&notify, "a STATUS naming the failed reload", |m| {
        status_line(m).is_some_and(|s| s.contains("certificate reload failed"))
    });
    let failed = status_line(&failed).expect("STATUS");
    assert!(failed.starts_with(&serving), "{failed}");
    assert!(
        failed.contains("still serving the previous certificate"),
        "{failed}"
    );
    assert!(failed.contains("tls.crt"), "names the file: {failed}");

    // A good pair again: the line is back to what is served.
    let out = Command::new(BIN)
        .args(["certs", "--force", "--out"])
        .arg(certs.dir.path())
        .output()
        .expect("certs");
    assert!(out.status.success(), "{out:?}");
    signal(&child, "HUP");
    recv_until(&notify, "the STATUS line restored", |m| {
        status_line(m) == Some(serving.as_str())
    });
    assert!(stop(child).success());
}

/// Fields of a journal native-protocol datagram: `NAME=value\n`, or `NAME\n` + 64-bit LE length
/// + bytes + `\n` for values that may hold newlines.
fn journal_fields(mut data: &[u8]) -> HashMap<String, String> {
    let mut fields = HashMap::new();
    while !data.is_empty() {
        let end = data
            .iter()
            .position(|&b| b == b'\n')
            .expect("a field ends in a newline");
        let head = &data[..end];
        if let Some(eq) = head.iter().position(|&b| b == b'=') {
            fields.insert(
                String::from_utf8_lossy(&head[..eq]).into_owned(),
                String::from_utf8_lossy(&head[eq + 1..]).into_owned(),
            );
            data = &data[end + 1..];
        } else {
            let rest = &data[end + 1..];
            let len = u64::from_le_bytes(rest[..8].try_into().expect("length")) as usize;
            fields.insert(
                String::from_utf8_lossy(head).into_owned(),
                String::from_utf8_lossy(&rest[8..8 + len]).into_owned(),
            );
            data = &rest[8 + len + 1..];
        }
    }
    fields
}

/// What the journal tests need of the machine, said when it is missing.
const NAMESPACE_NEEDS: &str = "the journal tests need `unshare` (util-linux) to be able to make \
    a user and mount namespace: `unshare --user --map-root-user --mount true` must succeed";

/// A command running its arguments in a mount namespace whose `/run` is `run`, or why none can be
/// made here.
fn with_private_run(run: &Path) -> Result<Command, String> {
    let probe = Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "true"])
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("unshare: {e}"))?;
    if !probe.status.success() {
        return Err(format!(
            "unshare --user --mount: {}",
            String::from_utf8_lossy(&probe.stderr).trim()
        ));
    }
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--map-root-user", "--mount", "sh", "-c"])
        .arg(r#"mount --bind "$0" /run && exec "$@""#)
        .arg(run)
        .arg(BIN);
    Ok(cmd)
}

/// A warning every start with these lock files logs: the same lock in two files.
const DUPLICATE: &str = "lock defined in more than one file; the last file wins";

#[test]
fn under_the_journal_levels_become_priorities_and_fields_journal_fields() {
    let run = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(run.path().join("systemd/journal")).expect("mkdir");
    let journal = UnixDatagram::bind(run.path().join("systemd/journal/socket")).expect("bind");
    journal
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let wrapper = with_private_run(run.path()).unwrap_or_else(|why| {
        panic!("no private mount namespace for a fake journal ({why}); {NAMESPACE_NEEDS}")
    });
    let certs = Certs::new();
    let locks = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        locks.path().join("good.yaml"),
        lock_yaml(Some("prod"), "web", None),
    )
    .expect("write");
    // The same lock in a second file: a warning at start-up.
    std::fs::write(
        locks.path().join("twice.yaml"),
        lock_yaml(Some("prod"), "web", None),
    )
    .expect("write");
    // stderr is the stream systemd named in JOURNAL_STREAM: `auto` picks the journal.
    let stderr_path = run.path().join("stderr");
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let meta = stderr.metadata().expect("stat");
    let mut cmd = serve(wrapper, &certs, locks.path(), free_port());
    cmd.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stderr(stderr);
    let child = cmd.spawn().expect("spawn");

    let mut buf = vec![0u8; 65536];
    let mut entries = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !entries
        .iter()
        .any(|f: &HashMap<String, String>| f.get("MESSAGE").is_some_and(|m| m == "serving"))
    {
        assert!(
            Instant::now() < deadline,
            "no 'serving' entry: {entries:#?}"
        );
        let n = journal.recv(&mut buf).expect("a journal entry");
        if n > 0 {
            entries.push(journal_fields(&buf[..n]));
        }
    }
    let exit = stop(child);
    let text = std::fs::read_to_string(&stderr_path).expect("stderr");
    assert!(exit.success(), "{text}");

    let warning = entries
        .iter()
        .find(|f| f.get("MESSAGE").is_some_and(|m| m == DUPLICATE))
        .unwrap_or_else(|| panic!("no warning entry: {entries:#?}"));
    assert_eq!(warning["PRIORITY"], "4", "{warning:#?}");
    assert!(warning["F_LOCK"].contains("web"), "{warning:#?}");
    assert_eq!(warning["SYSLOG_IDENTIFIER"], "kube-object-lock");
    let serving = entries
        .iter()
        .find(|f| f["MESSAGE"] == "serving")
        .expect("serving");
    assert_eq!(
        serving["PRIORITY"], "6",
        "info is informational: {serving:#?}"
    );
    assert!(
        serving["F_LISTEN"].starts_with("127.0.0.1:"),
        "{serving:#?}"
    );
    assert!(
        !text.contains(DUPLICATE) && !text.contains("serving"),
        "events go to the journal only, not also as lines: {text}"
    );
}

#[test]
fn journald_as_the_target_without_a_journal_is_a_start_error() {
    let run = tempfile::tempdir().expect("tempdir");
    let wrapper = with_private_run(run.path()).unwrap_or_else(|why| {
        panic!("no private mount namespace for a missing journal ({why}); {NAMESPACE_NEEDS}")
    });
    let certs = Certs::new();
    let locks = tempfile::tempdir().expect("tempdir");
    let mut cmd = serve(wrapper, &certs, locks.path(), free_port());
    let out = cmd
        .env("KUBE_OBJECT_LOCK__LOG__TARGET", "journald")
        .stderr(Stdio::piped())
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("log.target"), "{text}");
}

#[test]
fn outside_the_journal_events_stay_lines_on_stderr() {
    let certs = Certs::new();
    let locks = tempfile::tempdir().expect("tempdir");
    for file in ["a.yaml", "b.yaml"] {
        std::fs::write(
            locks.path().join(file),
            lock_yaml(Some("prod"), "web", None),
        )
        .expect("write");
    }
    let port = free_port();
    let mut cmd = serve(Command::new(BIN), &certs, locks.path(), port);
    // Inherited from a unit, but stderr is a pipe of ours: not the journal.
    let child = cmd
        .env("JOURNAL_STREAM", "1:1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // The warning is logged before the listener binds.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "server did not start listening");
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&child, "TERM");
    let out = child.wait_with_output().expect("output");
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("WARN") && text.contains(DUPLICATE), "{text}");
}

#[test]
fn a_start_error_on_the_journal_stream_carries_the_err_priority() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |journal_stream: Option<String>, path: &Path| {
        let file = std::fs::File::create(path).expect("stderr file");
        let meta = file.metadata().expect("stat");
        let mut cmd = Command::new(BIN);
        cmd.env_remove("JOURNAL_STREAM")
            .args(["serve", "--listen", "nowhere"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file);
        if let Some(value) = journal_stream {
            cmd.env(
                "JOURNAL_STREAM",
                value.replace("DEV:INO", &format!("{}:{}", meta.dev(), meta.ino())),
            );
        }
        let status = cmd.status().expect("run");
        assert_eq!(status.code(), Some(1));
        std::fs::read_to_string(path).expect("read")
    };
    let journal = run(Some("DEV:INO".to_owned()), &dir.path().join("journal"));
    assert!(
        journal.starts_with("<3>kube-object-lock: invalid settings"),
        "{journal}"
    );
    let terminal = run(None, &dir.path().join("terminal"));
    assert!(
        terminal.starts_with("kube-object-lock: invalid settings"),
        "{terminal}"
    );
}

#[test]
fn a_reload_and_a_stop_right_after_ready_are_handled_not_fatal() {
    let certs = Certs::new();
    let locks = tempfile::tempdir().expect("tempdir");
    let (notify_dir, notify) = notify_socket();
    let notify_path = notify_dir.path().join("notify");
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
        assert!(log.contains("all connections drained"), "{log}");
        // The STOPPING=1 of this run, so the next READY=1 is the next run's.
        recv_until(&notify, "STOPPING=1", |m| m.contains("STOPPING=1"));
    }
}

/// `serve` with `listener` as its fd 3 and LISTEN_FDS=1, as systemd starts it from
/// kube-object-lock.socket (the shell moves stdin to fd 3).
fn serve_passed(
    certs: &Certs,
    locks: &Path,
    listen_port: u16,
    listener: std::net::TcpListener,
) -> Command {
    let mut wrapper = Command::new("sh");
    wrapper
        .args(["-c", r#"exec 3<&0 0</dev/null; exec "$0" "$@""#])
        .arg(BIN);
    let mut cmd = serve(wrapper, certs, locks, listen_port);
    cmd.env("LISTEN_FDS", "1")
        .env_remove("LISTEN_PID")
        .stdin(Stdio::from(std::os::fd::OwnedFd::from(listener)));
    cmd
}

#[test]
fn the_socket_systemd_passes_is_served_and_must_be_the_configured_address() {
    let certs = Certs::new();
    let locks = tempfile::tempdir().expect("tempdir");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    // Held here too: the server could not bind the port itself, only serve the socket passed.
    let _held = listener.try_clone().expect("clone");
    let (notify_dir, notify) = notify_socket();
    let notify_path = notify_dir.path().join("notify");
    let mut cmd = serve_passed(&certs, locks.path(), port, listener);
    let child = cmd
        .env("NOTIFY_SOCKET", &notify_path)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let ready = recv_until(&notify, "READY=1", |m| m.contains("READY=1"));
    let serving = status_line(&ready).expect("STATUS with READY");
    assert!(
        serving.starts_with(&format!("serving on 127.0.0.1:{port},")),
        "{serving}"
    );
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    assert!(stop(child).success());

    // A socket on another address than server.listen: a start error naming both.
    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let got = elsewhere.local_addr().expect("addr");
    let want = free_port();
    let out = serve_passed(&certs, locks.path(), want, elsewhere)
        .stderr(Stdio::piped())
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("server.listen is 127.0.0.1:{want}"))
            && text.contains(&format!("listens on {got}"))
            && text.contains("ListenStream="),
        "{text}"
    );
}

/// A `NOTIFY_SOCKET` to pass to `serve`: its directory (the socket is `notify` in it) and the
/// receiving end, which waits at most 30 s for a message.
fn notify_socket() -> (tempfile::TempDir, UnixDatagram) {
    let dir = tempfile::tempdir().expect("tempdir");
    let notify = UnixDatagram::bind(dir.path().join("notify")).expect("notify socket");
    notify
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    (dir, notify)
}
