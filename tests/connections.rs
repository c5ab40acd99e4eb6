//! Connections over their whole life: keep-alive between requests, HTTP/2 streams refused
//! early, the probes on the metrics listener, and how both listeners stop.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_object_lock::server::Drain;
use support::{TestServer, client_tls, fixture};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

/// Far above anything a healthy run needs; reaching it fails the test, it measures nothing.
const BOUND: Duration = Duration::from_secs(30);

async fn files_server(
    tune: impl FnOnce(&mut kube_object_lock::settings::Settings),
) -> (TestServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = kube_object_lock::settings::Settings::default();
    settings.locks.dir = Some(dir.path().to_owned());
    let source = kube_object_lock::app::lock_source(&settings, false, Default::default())
        .await
        .expect("files source");
    (TestServer::start(source, tune).await, dir)
}

/// A TLS connection speaking HTTP/1.1.
async fn tls_http1(server: &TestServer) -> TlsStream<TcpStream> {
    let connector = TlsConnector::from(Arc::new(client_tls(
        &server.certs.path("ca.crt"),
        &[b"http/1.1"],
    )));
    let tcp = TcpStream::connect(server.addr).await.expect("connect");
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
    connector.connect(name, tcp).await.expect("handshake")
}

/// Reads one HTTP/1.1 response with a Content-Length body; returns the status line and body.
async fn read_response(stream: &mut (impl AsyncReadExt + Unpin)) -> (String, Vec<u8>) {
    let work = async {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            let n = stream.read(&mut byte).await.expect("read head");
            assert!(n > 0, "connection closed before the response head: {buf:?}");
            buf.push(byte[0]);
        }
        let head = String::from_utf8(buf).expect("utf-8 head");
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse().expect("length"))
            })
            .expect("content-length");
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.expect("read body");
        (head.lines().next().unwrap_or_default().to_owned(), body)
    };
    tokio::time::timeout(BOUND, work)
        .await
        .expect("answered in time")
}

fn post_head(body_len: usize) -> String {
    format!(
        "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {body_len}\r\n\r\n"
    )
}

/// Waits until nothing accepts connections on `addr` any more; panics after [`BOUND`].
async fn until_refused(addr: SocketAddr) {
    let deadline = Instant::now() + BOUND;
    while TcpStream::connect(addr).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "{addr} still accepts connections {BOUND:?} after the shutdown signal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The webhook and metrics listeners drain together: while a request still holds the
/// webhook's drain open, the metrics listener has already stopped accepting. (One after the
/// other, the metrics listener would keep accepting until the webhook had drained.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_listeners_drain_at_once() {
    let (mut server, _dir) = files_server(|s| {
        s.server.shutdown_grace = Duration::from_secs(120);
        s.server.body_timeout = Duration::from_secs(120);
    })
    .await;
    let metrics = server.metrics_addr.expect("metrics listener");
    let body = fixture("configmap-create.json");
    let mut conn = tls_http1(&server).await;
    conn.write_all(post_head(body.len()).as_bytes())
        .await
        .expect("write head");
    conn.write_all(&body[..10]).await.expect("write some body");
    conn.flush().await.expect("flush");

    server.signal_stop();
    until_refused(server.addr).await;
    until_refused(metrics).await;
    assert!(
        !server.finished(),
        "the webhook drain is still waiting for the request in flight"
    );

    conn.write_all(&body[10..]).await.expect("write the rest");
    let (status, answer) = read_response(&mut conn).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let answer: serde_json::Value = serde_json::from_slice(&answer).expect("json");
    assert_eq!(answer["response"]["allowed"], true);
    let drain = tokio::time::timeout(BOUND, server.stop())
        .await
        .expect("stopped");
    assert_eq!(drain, Drain::Complete);
}

// ---------------------------------------------------------------------------------------------
// Keep-alive between requests.

/// Sends a review on `conn` and reads the answer; returns the status line, the response head
/// and whether the answer says `allowed`.
async fn review_on(conn: &mut TlsStream<TcpStream>) -> (String, bool) {
    let body = fixture("configmap-create.json");
    conn.write_all(post_head(body.len()).as_bytes())
        .await
        .expect("write head");
    conn.write_all(&body).await.expect("write body");
    conn.flush().await.expect("flush");
    let (status, answer) = read_response(conn).await;
    let answer: serde_json::Value = serde_json::from_slice(&answer).expect("json");
    (status, answer["response"]["allowed"] == true)
}

/// True when the server has neither closed `conn` nor sent anything on it.
fn still_open(conn: &mut TlsStream<TcpStream>) -> bool {
    use futures::FutureExt;
    let mut byte = [0u8; 1];
    conn.read(&mut byte).now_or_never().is_none()
}

/// Reads until the server closes `conn`; panics after [`BOUND`].
async fn closed_by_server(conn: &mut TlsStream<TcpStream>) {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(BOUND, conn.read_to_end(&mut rest))
        .await
        .expect("the server closed the connection");
    // A TLS close_notify or a plain close; either way nothing more was sent.
    assert!(read.is_err() || rest.is_empty(), "{rest:?}");
}

/// The API server reuses an idle connection for up to 90 s: with the default settings, a
/// client idle for 15 s (more than `server.header_timeout`) between two requests gets both
/// answered on the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_idle_for_15s_is_still_served() {
    let (server, _dir) = files_server(|_| {}).await;
    let mut conn = tls_http1(&server).await;
    let local = conn.get_ref().0.local_addr().expect("local address");
    let (status, allowed) = review_on(&mut conn).await;
    assert!(status.starts_with("HTTP/1.1 200") && allowed, "{status}");

    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(
        still_open(&mut conn),
        "the server closed the idle connection"
    );
    let (status, allowed) = review_on(&mut conn).await;
    assert!(status.starts_with("HTTP/1.1 200") && allowed, "{status}");
    assert_eq!(
        conn.get_ref().0.local_addr().expect("local address"),
        local,
        "answered on the same connection"
    );
}

/// A request that has started must still complete its headers within `server.header_timeout`,
/// however long the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_request_keeps_the_header_timeout() {
    let (server, _dir) = files_server(|s| {
        s.server.header_timeout = Duration::from_millis(300);
        s.server.idle_timeout = Duration::from_secs(600);
    })
    .await;
    let mut conn = tls_http1(&server).await;
    let (status, _) = review_on(&mut conn).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    // Idle for longer than the header timeout: kept.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        still_open(&mut conn),
        "an idle connection is kept for server.idle_timeout"
    );
    // Half a request line, then nothing: cut off.
    conn.write_all(b"POST /validate HT").await.expect("write");
    conn.flush().await.expect("flush");
    closed_by_server(&mut conn).await;
}

/// An idle connection is closed after `server.idle_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_after_the_idle_timeout() {
    let (server, _dir) = files_server(|s| {
        s.server.header_timeout = Duration::from_secs(600);
        s.server.idle_timeout = Duration::from_millis(300);
    })
    .await;
    let mut conn = tls_http1(&server).await;
    let (status, _) = review_on(&mut conn).await;
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    closed_by_server(&mut conn).await;
}

/// Beyond `server.max_idle_connections`, a connection is told to close with its answer and
/// closed; the idle ones within the bound stay and keep being served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_bounded_in_number() {
    let (server, _dir) = files_server(|s| s.server.max_idle_connections = 2).await;
    let mut kept = Vec::new();
    for _ in 0..2 {
        let mut conn = tls_http1(&server).await;
        let (status, _) = review_on(&mut conn).await;
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        kept.push(conn);
    }
    let mut third = tls_http1(&server).await;
    let body = fixture("configmap-create.json");
    third
        .write_all(post_head(body.len()).as_bytes())
        .await
        .expect("write");
    third.write_all(&body).await.expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(third.read(&mut byte).await.expect("read"), 1, "{head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(BOUND, third.read_to_end(&mut rest))
        .await
        .expect("the connection over the bound is closed");

    for conn in &mut kept {
        assert!(
            still_open(conn),
            "an idle connection within the bound was closed"
        );
        let (status, allowed) = review_on(conn).await;
        assert!(status.starts_with("HTTP/1.1 200") && allowed, "{status}");
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/2 streams refused before their body is read.

/// A request body of `size` bytes that is a valid review but for its size and content type.
fn big_body(size: usize) -> Vec<u8> {
    let mut body = fixture("configmap-create.json");
    body.resize(size, b' ');
    body
}

/// Every early 4xx reaches an HTTP/2 client whole: the status and its Status JSON, 50 times
/// in a row, for a wrong content type (400) and a declared length above the limit (413).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_refusals_reach_http2_clients_intact() {
    let (server, _dir) = files_server(|s| s.server.max_body_bytes = 64 * 1024).await;
    let url = server.url("/validate");
    let client = server.http2();
    for i in 0..50 {
        for (content_type, size, status) in [
            ("text/plain", 256 * 1024, 400),
            ("application/json", 512 * 1024, 413),
        ] {
            let request = http::Request::post(&url)
                .header("content-type", content_type)
                .body(http_body_util::Full::new(bytes::Bytes::from(big_body(
                    size,
                ))))
                .expect("request");
            let reply = client.send(request).await;
            assert_eq!(reply.version, http::Version::HTTP_2);
            assert_eq!(reply.status, status, "try {i}");
            assert_eq!(reply.json()["code"], status, "try {i}");
        }
    }
}

/// The same with curl, which reported the reset as `(92) Stream error in the HTTP/2 framing
/// layer` (HTTP code 000) in about two tries of three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_refusals_reach_curl_over_http2_intact() {
    let curl_has_http2 = std::process::Command::new("curl")
        .arg("--version")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("HTTP2"));
    assert!(
        curl_has_http2,
        "this test needs curl with HTTP/2 (Debian's curl package has it)"
    );
    let (server, _dir) = files_server(|s| s.server.max_body_bytes = 64 * 1024).await;
    let url = server.url("/validate");
    let ca = server.certs.path("ca.crt");
    let files = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            "text/plain",
            256 * 1024,
            400,
            "content type is \"text/plain\"",
        ),
        (
            "application/json",
            512 * 1024,
            413,
            "larger than the limit of 65536 bytes",
        ),
    ];
    for (i, (_, size, _, _)) in cases.iter().enumerate() {
        std::fs::write(files.path().join(i.to_string()), big_body(*size)).expect("write");
    }
    for round in 0..50 {
        for (i, (content_type, _, status, needle)) in cases.iter().enumerate() {
            let out = std::process::Command::new("curl")
                .args(["-sS", "--http2", "--cacert"])
                .arg(&ca)
                .args([
                    "-H",
                    &format!("content-type: {content_type}"),
                    "-H",
                    "Expect:",
                ])
                .arg("--data-binary")
                .arg(format!("@{}", files.path().join(i.to_string()).display()))
                .args(["-w", "\n%{http_code} %{http_version}", &url])
                .output()
                .expect("curl runs");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "round {round}: curl failed: {stderr}");
            let (body, codes) = stdout.rsplit_once('\n').expect("status line");
            assert_eq!(codes, format!("{status} 2"), "round {round}: {stdout}");
            let json: serde_json::Value = serde_json::from_str(body).expect("JSON body");
            assert!(
                json["message"].as_str().is_some_and(|m| m.contains(needle)),
                "round {round}: {body}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The probes on the metrics listener.

/// Sends a plain HTTP/1.1 GET to `addr` and returns the raw response.
async fn plain_get(addr: SocketAddr, path: &str) -> String {
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("write");
    let mut out = String::new();
    tokio::time::timeout(BOUND, tcp.read_to_string(&mut out))
        .await
        .expect("answered in time")
        .expect("read");
    out
}

/// With client certificates required on the webhook port, a plain health check reaches the
/// probes on the metrics listener (plain HTTP), and only there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_are_served_on_the_metrics_listener_without_a_client_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = kube_object_lock::settings::Settings::default();
    settings.locks.dir = Some(dir.path().to_owned());
    let source = kube_object_lock::app::lock_source(&settings, false, Default::default())
        .await
        .expect("files source");
    let certs = support::Certs::with_client();
    let client_ca = certs.path("client-ca.crt");
    let server = TestServer::start_with(certs, source, |s| s.tls.client_ca = Some(client_ca)).await;

    // The webhook port refuses a client without a certificate.
    let connector = TlsConnector::from(Arc::new(client_tls(
        &server.certs.path("ca.crt"),
        &[b"http/1.1"],
    )));
    let tcp = TcpStream::connect(server.addr).await.expect("connect");
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let refused = async {
        let mut tls = connector.connect(name, tcp).await?;
        tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await?;
        let mut out = Vec::new();
        tls.read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    }
    .await;
    assert!(
        !matches!(&refused, Ok(out) if out.starts_with(b"HTTP/1.1 200")),
        "the webhook port answered without a client certificate"
    );

    let metrics = server.metrics_addr.expect("metrics listener");
    for path in ["/healthz", "/readyz"] {
        let reply = plain_get(metrics, path).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{path}: {reply}");
        assert!(reply.ends_with("\r\n\r\nok\n"), "{path}: {reply}");
    }
    let reply = plain_get(metrics, "/metrics").await;
    assert!(reply.contains("kube_object_lock_build_info"), "{reply}");
    let reply = plain_get(metrics, "/validate").await;
    assert!(reply.starts_with("HTTP/1.1 404"), "{reply}");
}

/// Over HTTP/1.1, a request refused before its body is read (a wrong content type, here with a
/// body of 300 KB) has the rest of its body read before the answer, so the connection stays
/// usable: the next request on it is answered. (Over HTTP/2 the server drains such bodies on
/// its own; HTTP/1.1 cannot be drained once the service has let go of the body.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_connection_is_reused_after_an_early_refusal() {
    let (server, _dir) = files_server(|_| {}).await;
    let mut conn = tls_http1(&server).await;
    let body = vec![b'a'; 300 * 1024];
    let head = format!(
        "POST /validate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.expect("write head");
    conn.write_all(&body).await.expect("write body");
    conn.flush().await.expect("flush");
    let (status, answer) = read_response(&mut conn).await;
    assert!(status.contains(" 400 "), "{status}");
    assert!(
        String::from_utf8_lossy(&answer).contains("text/plain"),
        "{answer:?}"
    );
    let (status, allowed) = review_on(&mut conn).await;
    assert!(status.contains(" 200 "), "{status}");
    assert!(
        allowed,
        "the next review on the same connection is answered"
    );
}
