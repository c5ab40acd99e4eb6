//! Bad input over real HTTPS: every malformed request gets a clear 4xx with a Status body
//! naming what is wrong, and the server keeps serving afterwards.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use serde_json::json;
use support::{TestServer, client_tls, fixture};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

fn post(
    url: &str,
    content_type: Option<&str>,
    body: impl Into<Bytes>,
) -> http::Request<Full<Bytes>> {
    let mut builder = http::Request::post(url);
    if let Some(ct) = content_type {
        builder = builder.header("content-type", ct);
    }
    builder.body(Full::new(body.into())).expect("request")
}

/// Sends `request`, expects `status` and a Status body whose message contains `needle`.
async fn expect_status(
    server: &TestServer,
    request: http::Request<Full<Bytes>>,
    status: u16,
    needle: &str,
) {
    let reply = server.http1().send(request).await;
    assert_eq!(
        reply.status,
        status,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let body = reply.json();
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["code"], status);
    let message = body["message"].as_str().expect("message");
    assert!(
        message.contains(needle),
        "{message:?} does not mention {needle:?}"
    );
}

fn review(request: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request,
    }))
    .expect("json")
}

#[tokio::test]
async fn malformed_requests_get_clear_4xx() {
    let (server, _dir) = TestServer::with_lock_files("").await;
    let url = server.url("/validate");
    let json = Some("application/json");
    let cases: Vec<(http::Request<Full<Bytes>>, u16, &str)> = vec![
        (post(&url, json, ""), 400, "empty body"),
        (post(&url, json, "  \n"), 400, "empty body"),
        (
            post(&url, json, "{\"apiVersion\":"),
            400,
            "malformed AdmissionReview",
        ),
        (
            post(&url, json, "[1,2,3]"),
            400,
            "malformed AdmissionReview",
        ),
        (post(&url, json, "null"), 400, "malformed"),
        (
            post(&url, json, &b"{\"kind\":\"Admission\xffReview\"}"[..]),
            400,
            "malformed",
        ),
        (
            post(
                &url,
                json,
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
            ),
            400,
            "has no request",
        ),
        (
            post(
                &url,
                json,
                r#"{"apiVersion":"v1","kind":"AdmissionReview","request":{}}"#,
            ),
            400,
            "request: missing field `uid`",
        ),
        (
            post(
                &url,
                json,
                r#"{"apiVersion":"admission.k8s.io/v2","kind":"AdmissionReview"}"#,
            ),
            400,
            "apiVersion is \"admission.k8s.io/v2\"",
        ),
        (
            post(
                &url,
                json,
                r#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}"#,
            ),
            400,
            "kind is \"Pod\"",
        ),
        (
            post(
                &url,
                json,
                review(
                    json!({"uid": "", "resource": {"resource": "pods"}, "operation": "DELETE", "userInfo": {}}),
                ),
            ),
            400,
            "request.uid is empty",
        ),
        (
            post(
                &url,
                json,
                review(
                    json!({"uid": "u", "resource": {"resource": "pods"}, "operation": "PATCH", "userInfo": {}}),
                ),
            ),
            400,
            "request.operation: unknown variant `PATCH`",
        ),
        (
            post(
                &url,
                json,
                review(
                    json!({"uid": 7, "resource": {"resource": "pods"}, "operation": "DELETE", "userInfo": {}}),
                ),
            ),
            400,
            "request.uid: invalid type: integer `7`",
        ),
        (
            post(
                &url,
                json,
                review(json!({"uid": "u", "operation": "DELETE", "userInfo": {}})),
            ),
            400,
            "missing field `resource`",
        ),
        (
            post(
                &url,
                json,
                format!(
                    r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"u","object":{{"spec":{}{}}}}}}}"#,
                    "[".repeat(10_000),
                    "]".repeat(10_000)
                ),
            ),
            // 10,000 levels inside a skipped field: skipped without recursion, so the answer
            // is about the field that really is missing, and the stack survives.
            400,
            "request: missing field `resource`",
        ),
        (
            post(&url, json, r#"{"kind":"AdmissionReview"} {}"#),
            400,
            "trailing characters",
        ),
        (
            post(&url, None, fixture("configmap-create.json")),
            400,
            "content type is \"\"",
        ),
        (
            post(&url, Some("text/plain"), fixture("configmap-create.json")),
            400,
            "expected \"application/json\"",
        ),
        (
            post(
                &server.url("/validate?timeout=soon"),
                json,
                fixture("configmap-create.json"),
            ),
            400,
            "timeout=\"soon\"",
        ),
        (
            post(&url, json, vec![b' '; 9 * 1024 * 1024]),
            413,
            "larger than the limit of 8388608 bytes",
        ),
        (
            http::Request::get(&url)
                .body(Full::new(Bytes::new()))
                .expect("request"),
            405,
            "method GET is not allowed",
        ),
        (
            http::Request::put(&url)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(fixture("configmap-create.json"))))
                .expect("request"),
            405,
            "use POST",
        ),
        (
            post(&server.url("/healthz"), json, "{}"),
            405,
            "use GET, HEAD",
        ),
        (
            post(&server.url("/mutate"), json, "{}"),
            404,
            "no such path",
        ),
        (
            post(&server.url("/validate/extra"), json, "{}"),
            404,
            "no such path",
        ),
    ];
    for (request, status, needle) in cases {
        expect_status(&server, request, status, needle).await;
    }
    // Still serving.
    let ok = server
        .http1()
        .post_json(&url, fixture("configmap-create.json"))
        .await;
    assert_eq!(ok.json()["response"]["allowed"], true);
}

#[tokio::test]
async fn a_review_with_charset_content_type_is_accepted() {
    let (server, _dir) = TestServer::with_lock_files("").await;
    let request = post(
        &server.url("/validate"),
        Some("application/json; charset=utf-8"),
        fixture("configmap-create.json"),
    );
    assert_eq!(server.http1().send(request).await.status, 200);
}

async fn tls_stream(server: &TestServer) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let connector = TlsConnector::from(Arc::new(client_tls(
        &server.certs.path("ca.crt"),
        &[b"http/1.1"],
    )));
    let tcp = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
    connector.connect(name, tcp).await.expect("handshake")
}

async fn read_all(stream: &mut (impl AsyncReadExt + Unpin)) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn http_1_0_is_answered_and_closed() {
    let (server, _dir) = TestServer::with_lock_files("").await;
    let mut tls = tls_stream(&server).await;
    let body = fixture("configmap-create.json");
    let head = format!(
        "POST /validate HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.expect("write");
    tls.write_all(&body).await.expect("write");
    let reply = read_all(&mut tls).await;
    assert!(
        reply.starts_with("HTTP/1.0 200") || reply.starts_with("HTTP/1.1 200"),
        "{reply}"
    );
    assert!(reply.contains("\"allowed\":true"), "{reply}");
}

#[tokio::test]
async fn garbage_instead_of_tls_closes_the_connection() {
    let (server, _dir) = TestServer::with_lock_files("").await;
    let mut tcp = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let reply = read_all(&mut tcp).await;
    assert!(!reply.contains("HTTP/1.1 200"), "{reply}");
    // A real client still gets through.
    assert_eq!(
        server.http1().get(&server.url("/healthz")).await.status,
        200
    );
}

#[tokio::test]
async fn slow_headers_and_bodies_are_cut_off() {
    let (server, _dir) = {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut settings = kube_object_lock::settings::Settings::default();
        settings.locks.dir = Some(dir.path().to_owned());
        let source = kube_object_lock::app::lock_source(&settings, false)
            .await
            .expect("source");
        let server = TestServer::start(source, |s| {
            s.server.header_timeout = Duration::from_millis(300);
            s.server.body_timeout = Duration::from_millis(300);
        })
        .await;
        (server, dir)
    };
    // Headers that never finish: the connection is closed (408 or nothing), not held.
    let mut tls = tls_stream(&server).await;
    tls.write_all(b"POST /validate HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    let started = std::time::Instant::now();
    let reply = read_all(&mut tls).await;
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "cut off, not held: {reply}"
    );
    assert!(
        reply.is_empty() || reply.starts_with("HTTP/1.1 408"),
        "{reply}"
    );

    // A body that never finishes: 408 with a Status body.
    let mut tls = tls_stream(&server).await;
    tls.write_all(
        b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
    )
    .await
    .expect("write");
    let reply = read_all(&mut tls).await;
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("body not received within"), "{reply}");
}
