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

#[tokio::test]
async fn malformed_requests_get_clear_4xx() {
    let (server, _dir) = TestServer::with_lock_files("").await;
    let url = server.url("/validate");
    let review = |request: &str| {
        format!(
            r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{request}}}"#
        )
    };
    let pods = r#""resource":{"resource":"pods"}"#;
    let deep = format!(
        r#"{{"uid":"u","object":{{"spec":{}{}}}}}"#,
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    // Bodies POSTed as application/json, answered 400 with a message naming the problem.
    let bodies: Vec<(String, &str)> = vec![
        ("".into(), "empty body"),
        ("  \n".into(), "empty body"),
        ("{\"apiVersion\":".into(), "malformed AdmissionReview"),
        ("[1,2,3]".into(), "malformed AdmissionReview"),
        ("null".into(), "malformed"),
        (
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.into(),
            "has no request",
        ),
        (
            r#"{"apiVersion":"v1","kind":"AdmissionReview","request":{}}"#.into(),
            "request: missing field `uid`",
        ),
        (
            r#"{"apiVersion":"admission.k8s.io/v2","kind":"AdmissionReview"}"#.into(),
            "apiVersion is \"admission.k8s.io/v2\"",
        ),
        (
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"Pod"}"#.into(),
            "kind is \"Pod\"",
        ),
        (
            review(&format!(
                r#"{{"uid":"",{pods},"operation":"DELETE","userInfo":{{}}}}"#
            )),
            "request.uid is empty",
        ),
        (
            review(&format!(
                r#"{{"uid":"u",{pods},"operation":"PATCH","userInfo":{{}}}}"#
            )),
            "request.operation: unknown variant `PATCH`",
        ),
        (
            review(&format!(
                r#"{{"uid":7,{pods},"operation":"DELETE","userInfo":{{}}}}"#
            )),
            "request.uid: invalid type: integer `7`",
        ),
        (
            review(r#"{"uid":"u","operation":"DELETE","userInfo":{}}"#),
            "missing field `resource`",
        ),
        // 10,000 levels inside a skipped field: skipped without recursion, so the answer is
        // about the field that really is missing, and the stack survives.
        (review(&deep), "request: missing field `resource`"),
        (
            r#"{"kind":"AdmissionReview"} {}"#.into(),
            "trailing characters",
        ),
        (review("null"), "has no request"),
        (
            review(&format!(
                r#"{{"uid":"u",{pods},"operation":"DELETE","userInfo":"kubernetes-admin"}}"#
            )),
            "request.userInfo: invalid type: string \"kubernetes-admin\"",
        ),
        (
            review(&format!(
                r#"{{"uid":"u",{pods},"operation":"DELETE","userInfo":{{}},"object":"{{\"metadata\":{{}}}}"}}"#
            )),
            "request.object: invalid type: string",
        ),
        (
            review(&format!(
                r#"{{"uid":"u",{pods},"operation":"DELETE","userInfo":{{}},"dryRun":"true"}}"#
            )),
            "request.dryRun: invalid type: string",
        ),
        (
            review(
                r#"{"uid":"u","resource":{"group":"","version":"v1"},"operation":"DELETE","userInfo":{}}"#,
            ),
            "request.resource: missing field `resource`",
        ),
        (
            format!(
                r#"{{"apiVersion":"admission.k8s.io/v1","request":{{"uid":"u",{pods},"operation":"DELETE","userInfo":{{}}}}}}"#
            ),
            "kind is \"\"",
        ),
        // A byte-order mark is not JSON.
        (
            format!(
                "\u{feff}{}",
                String::from_utf8(fixture("configmap-create.json")).expect("utf-8")
            ),
            "malformed AdmissionReview: expected value at line 1 column 1",
        ),
        // A raw NUL inside a string (an escaped one, \u0000, would be a valid character).
        (
            review("{\"uid\":\"a\0b\"}"),
            "request.uid: control character",
        ),
        (
            review(r#"{"uid":"\ud800"}"#),
            "request.uid: unexpected end of hex escape",
        ),
        // Duplicate keys among the fields the webhook reads are refused rather than resolved
        // one way or the other (duplicates in fields it skips are not looked at).
        (
            review(r#"{"uid":"a","uid":"b"}"#),
            "request: duplicate field `uid`",
        ),
        (
            review(
                r#"{"uid":"u","resource":{"resource":"configmaps"},"namespace":"prod","operation":"DELETE","userInfo":{},"oldObject":{"metadata":{"name":"app-config","name":"other"}}}"#,
            ),
            "request.oldObject.metadata: duplicate field `name`",
        ),
    ];
    let json = Some("application/json");
    let mut cases: Vec<(http::Request<Full<Bytes>>, u16, &str)> = (bodies.into_iter())
        .map(|(body, needle)| (post(&url, json, body), 400, needle))
        .collect();
    // Request bodies are not decoded: a compressed review is not JSON.
    let mut gzip = post(
        &url,
        json,
        &b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x01\x00\x00\xff\xff\x00\x00\x00\x00\x00"[..],
    );
    gzip.headers_mut()
        .insert("content-encoding", http::HeaderValue::from_static("gzip"));
    let request = |method: http::Method| http::Request::builder().method(method).uri(&url);
    let empty = || Full::new(Bytes::new());
    let create = || fixture("configmap-create.json");
    cases.extend([
        (gzip, 400, "malformed AdmissionReview"),
        (
            post(&url, json, &b"{\"kind\":\"Admission\xffReview\"}"[..]),
            400,
            "malformed",
        ),
        (post(&url, None, create()), 400, "content type is \"\""),
        (
            post(&url, Some("text/plain"), create()),
            400,
            "expected \"application/json\"",
        ),
        (
            post(&url, Some("application/json-patch+json"), create()),
            400,
            "content type is \"application/json-patch+json\"",
        ),
        (
            post(&server.url("/validate?timeout=soon"), json, create()),
            400,
            "timeout=\"soon\"",
        ),
        (
            post(&url, json, vec![b' '; 9 * 1024 * 1024]),
            413,
            "larger than the limit of 8388608 bytes",
        ),
        (
            request(http::Method::GET).body(empty()).expect("request"),
            405,
            "method GET is not allowed",
        ),
        (
            request(http::Method::OPTIONS)
                .body(empty())
                .expect("request"),
            405,
            "method OPTIONS is not allowed",
        ),
        (
            request(http::Method::PUT)
                .header("content-type", "application/json")
                .body(Full::new(create().into()))
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
    ]);
    for (request, status, needle) in cases {
        expect_status(&server, request, status, needle).await;
    }
    // Still serving.
    let ok = server.http1().post_json(&url, create()).await;
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
        let source = kube_object_lock::app::lock_source(&settings, false, Default::default())
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

/// Sends raw bytes over TLS (HTTP/1.1), then with `close` ends the client's side; reads the
/// answer while still writing, as a server may answer before the body is complete.
async fn raw_exchange(server: &TestServer, request: Vec<u8>, close: bool) -> String {
    let (mut reader, mut writer) = tokio::io::split(tls_stream(server).await);
    let writing = tokio::spawn(async move {
        // The server may answer and close before everything is written.
        let _ = writer.write_all(&request).await;
        let _ = writer.flush().await;
        if close {
            let _ = writer.shutdown().await;
        }
        writer
    });
    let reply = read_all(&mut reader).await;
    drop(writing.await.expect("writer"));
    reply
}

/// Checks a raw answer: `status`, and a Status body whose message contains `needle`.
fn expect_raw_status(reply: &str, status: u16, needle: &str) {
    assert!(
        reply.starts_with(&format!("HTTP/1.1 {status} ")),
        "expected {status}: {reply}"
    );
    let (_, body) = reply.split_once("\r\n\r\n").expect("head and body");
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["code"], status, "{body}");
    let message = body["message"].as_str().expect("message");
    assert!(
        message.contains(needle),
        "{message:?} does not mention {needle:?}"
    );
}

fn raw_post(headers: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{headers}\r\n"
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

#[tokio::test]
async fn broken_body_framing_gets_clear_4xx() {
    let (server, _dir) = TestServer::with_lock_files("").await;
    let review = fixture("configmap-create.json");
    let limit = 8 * 1024 * 1024;
    let mut chunked = Vec::new();
    for _ in 0..9 {
        chunked.extend_from_slice(format!("{:x}\r\n", 1024 * 1024).as_bytes());
        chunked.extend(std::iter::repeat_n(b' ', 1024 * 1024));
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let too_large = format!("larger than the limit of {limit} bytes");
    let cases: Vec<(&str, Vec<u8>, bool, u16, &str)> = vec![
        (
            "chunked body over the limit, no content-length",
            raw_post("Transfer-Encoding: chunked\r\n", &chunked),
            false,
            413,
            &too_large,
        ),
        (
            "content-length larger than the body, then the client closes",
            raw_post("Content-Length: 5000\r\n", &review[..100]),
            true,
            400,
            "cannot read body",
        ),
        (
            "a chunk size that is not hexadecimal",
            raw_post("Transfer-Encoding: chunked\r\n", b"zz\r\n{}\r\n0\r\n\r\n"),
            false,
            400,
            "cannot read body",
        ),
        (
            // Both framings (the request-smuggling shape): chunked wins, the plain body is not
            // valid chunked encoding.
            "transfer-encoding chunked and content-length",
            raw_post(
                &format!(
                    "Transfer-Encoding: chunked\r\nContent-Length: {}\r\n",
                    review.len()
                ),
                &review,
            ),
            false,
            400,
            "cannot read body",
        ),
    ];
    for (what, request, close, status, needle) in cases {
        let reply = raw_exchange(&server, request, close).await;
        println!("{what}: {}", reply.lines().next().unwrap_or(""));
        expect_raw_status(&reply, status, needle);
    }
    let ok = server
        .http1()
        .post_json(&server.url("/validate"), review)
        .await;
    assert_eq!(ok.json()["response"]["allowed"], true);
}

/// Requests the HTTP parser refuses before any route sees them: a bare 400 (431 for huge
/// headers) and a closed connection; no Status body can be given at that stage.
#[tokio::test]
async fn unparseable_requests_get_a_bare_4xx_and_a_closed_connection() {
    let (server, _dir) = TestServer::with_lock_files("").await;
    let body = b"{}";
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "content-length not a number",
            raw_post("Content-Length: abc\r\n", body),
            400,
        ),
        (
            "negative content-length",
            raw_post("Content-Length: -1\r\n", body),
            400,
        ),
        (
            "two different content-lengths",
            raw_post("Content-Length: 2\r\nContent-Length: 3\r\n", body),
            400,
        ),
        (
            "a transfer coding other than chunked",
            raw_post("Transfer-Encoding: gzip\r\nContent-Length: 2\r\n", body),
            400,
        ),
        (
            "a megabyte of headers",
            raw_post(
                &format!(
                    "X-Padding: {}\r\nContent-Length: 2\r\n",
                    "a".repeat(1 << 20)
                ),
                body,
            ),
            431,
        ),
    ];
    for (what, request, status) in cases {
        let reply = raw_exchange(&server, request, false).await;
        assert!(
            reply.starts_with(&format!("HTTP/1.1 {status} ")),
            "{what}: {reply}"
        );
        assert!(
            reply.to_ascii_lowercase().contains("connection: close"),
            "{what}: {reply}"
        );
    }
    let ok = server
        .http1()
        .post_json(&server.url("/validate"), fixture("configmap-create.json"))
        .await;
    assert_eq!(ok.json()["response"]["allowed"], true);
}

#[tokio::test]
async fn head_is_refused_with_the_allowed_method() {
    let (server, _dir) = TestServer::with_lock_files("").await;
    let reply = server
        .http1()
        .send(
            http::Request::head(server.url("/validate"))
                .body(Full::new(Bytes::new()))
                .expect("request"),
        )
        .await;
    assert_eq!(reply.status, 405);
    assert_eq!(reply.headers["allow"], "POST");
    // A HEAD answer has no body; the length it announces is that of the Status a GET gets.
    assert!(reply.body.is_empty());
}

#[tokio::test]
async fn http2_requests_get_the_same_clear_4xx() {
    let (server, _dir) = TestServer::with_lock_files("").await;
    let client = server.http2();
    let url = server.url("/validate");
    let cases = [
        (
            post(&url, Some("text/plain"), fixture("configmap-create.json")),
            400,
            "content type is \"text/plain\"",
        ),
        (
            post(&url, Some("application/json"), "{\"kind\":"),
            400,
            "malformed AdmissionReview",
        ),
        (
            http::Request::get(&url)
                .body(Full::new(Bytes::new()))
                .expect("request"),
            405,
            "method GET is not allowed",
        ),
    ];
    for (request, status, needle) in cases {
        let reply = client.send(request).await;
        assert_eq!(reply.version, http::Version::HTTP_2);
        assert_eq!(reply.status, status);
        let body = reply.json();
        assert_eq!(body["kind"], "Status");
        let message = body["message"].as_str().expect("message");
        assert!(message.contains(needle), "{message:?}: {needle:?}");
    }
    let ok = client
        .post_json(&url, fixture("configmap-create.json"))
        .await;
    assert_eq!(ok.json()["response"]["allowed"], true);
}

/// A valid review of `size` bytes: a ConfigMap CREATE carrying a large value, padded with
/// trailing whitespace (which JSON allows) to the exact size.
fn review_of_size(size: usize) -> Vec<u8> {
    let mut review: serde_json::Value =
        serde_json::from_slice(&fixture("configmap-create.json")).expect("fixture");
    let small = serde_json::to_vec(&review).expect("json").len();
    review["request"]["object"]["data"]["big"] = json!("x".repeat(size - small - 64));
    let mut body = serde_json::to_vec(&review).expect("json");
    assert!(body.len() <= size);
    body.resize(size, b' ');
    body
}

#[tokio::test]
async fn the_body_limit_is_exact() {
    let (server, _dir) = TestServer::with_lock_files("").await;
    let client = server.http1();
    let url = server.url("/validate");
    let limit = 8 * 1024 * 1024;
    for size in [7 * 1024 * 1024, limit] {
        let reply = client.post_json(&url, review_of_size(size)).await;
        assert_eq!(reply.status, 200, "{size} bytes");
        assert_eq!(reply.json()["response"]["allowed"], true, "{size} bytes");
    }
    let reply = client.post_json(&url, review_of_size(limit + 1)).await;
    assert_eq!(reply.status, 413);
    assert!(
        reply.json()["message"]
            .as_str()
            .expect("message")
            .contains("larger than the limit of 8388608 bytes")
    );
}
