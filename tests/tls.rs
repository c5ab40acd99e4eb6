//! TLS as the API server sees it: certificate rotation without a restart, client certificates
//! (mTLS), ALPN and protocol versions.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_object_lock::cli::certs::{CertsRequest, generate};
use support::{Certs, TestServer, client_tls, client_tls_auth, fixture};
use tokio_rustls::TlsConnector;

async fn files_source() -> (kube_object_lock::app::Source, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut settings = kube_object_lock::settings::Settings::default();
    settings.locks.dir = Some(dir.path().to_owned());
    let source = kube_object_lock::app::lock_source(&settings, false, Default::default())
        .await
        .expect("files source");
    (source, dir)
}

/// Completes a TLS handshake with `config`; `Err` carries the handshake error.
async fn handshake(
    server: &TestServer,
    config: rustls::ClientConfig,
) -> Result<Option<Vec<u8>>, String> {
    let tcp = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").expect("name");
    let mut tls = TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    // With TLS 1.3 a refused client certificate shows only on the first read.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    tls.read_to_end(&mut out).await.map_err(|e| e.to_string())?;
    if !out.starts_with(b"HTTP/1.1 200") {
        return Err(String::from_utf8_lossy(&out).into_owned());
    }
    Ok(tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
}

fn regenerate(dir: &std::path::Path) {
    generate(&CertsRequest {
        out: dir.to_owned(),
        sans: vec![],
        days: 1,
        ca_days: 1,
        force: true,
        client: false,
    })
    .expect("new certificates");
}

#[tokio::test]
async fn alpn_offers_http1_for_the_api_server_and_h2() {
    let (source, _dir) = files_source().await;
    let server = TestServer::start(source, |_| {}).await;
    let ca = server.certs.path("ca.crt");
    for alpn in [&b"http/1.1"[..], &b"h2"[..]] {
        let got = handshake(&server, client_tls(&ca, &[alpn])).await;
        if alpn == b"h2" {
            // An h2 connection does not answer our HTTP/1.1 bytes; the ALPN result is what counts.
            continue;
        }
        assert_eq!(got, Ok(Some(alpn.to_vec())));
    }
    // The API server sends exactly ["http/1.1"]; no ALPN at all also works.
    assert_eq!(handshake(&server, client_tls(&ca, &[])).await, Ok(None));
    // TLS 1.2 only, as old clients.
    let mut roots = rustls::RootCertStore::empty();
    for cert in
        <rustls_pki_types::CertificateDer as rustls_pki_types::pem::PemObject>::pem_file_iter(&ca)
            .expect("ca")
    {
        roots.add(cert.expect("cert")).expect("add");
    }
    let tls12 = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS12])
    .expect("tls12")
    .with_root_certificates(roots)
    .with_no_client_auth();
    assert_eq!(handshake(&server, tls12).await, Ok(None));
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let (source, _dir) = files_source().await;
    let certs = Certs::new();
    let cert_dir = certs.dir.path().to_owned();
    let old_ca = tempfile::NamedTempFile::new().expect("temp");
    std::fs::copy(cert_dir.join("ca.crt"), old_ca.path()).expect("copy");
    let server = TestServer::start_with(certs, source, |s| {
        s.tls.reload_interval = Duration::from_secs(3600); // only SIGHUP reloads here
        s.tls.max_reload_failures = 2;
    })
    .await;
    let new_ca = cert_dir.join("ca.crt");
    assert!(
        handshake(&server, client_tls(old_ca.path(), &[b"http/1.1"]))
            .await
            .is_ok()
    );

    regenerate(&cert_dir);
    server.reload.send(()).await.expect("reload");
    let deadline = Instant::now() + Duration::from_secs(10);
    while handshake(&server, client_tls(&new_ca, &[b"http/1.1"]))
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let old = handshake(&server, client_tls(old_ca.path(), &[b"http/1.1"])).await;
    assert!(
        old.is_err(),
        "the old CA no longer verifies the served certificate"
    );

    // A broken rotation keeps the last good certificate and turns /healthz red.
    std::fs::write(cert_dir.join("tls.crt"), "not a certificate").expect("write");
    let client = support::HttpsClient::new(&new_ca, support::Protocol::Http1);
    for _ in 0..2 {
        server.reload.send(()).await.expect("reload");
    }
    // Each reload is answered in turn: /healthz turns red once both have failed.
    let health = support::until_async(
        "/healthz red after two failed reloads",
        || async {
            let reply = client.get(&server.url("/healthz")).await;
            (
                reply.status,
                String::from_utf8_lossy(&reply.body).into_owned(),
            )
        },
        |(status, _)| *status == 503,
    )
    .await;
    assert!(health.1.contains("the last 2 reloads of"), "{}", health.1);
    let review = client
        .post_json(&server.url("/validate"), fixture("configmap-create.json"))
        .await;
    assert_eq!(review.status, 200, "still serving with the last good pair");
}

#[tokio::test]
async fn client_certificates_are_required_when_a_client_ca_is_set() {
    let (source, _dir) = files_source().await;
    let certs = Certs::with_client();
    let client_ca = certs.path("client-ca.crt");
    let ca = certs.path("ca.crt");
    let identity = (
        certs.path("apiserver-client.crt"),
        certs.path("apiserver-client.key"),
    );
    let other = Certs::with_client();
    let server = TestServer::start_with(certs, source, |s| s.tls.client_ca = Some(client_ca)).await;

    let with_cert = client_tls_auth(&ca, &[b"http/1.1"], Some((&identity.0, &identity.1)));
    assert_eq!(
        handshake(&server, with_cert).await,
        Ok(Some(b"http/1.1".to_vec()))
    );

    let without = handshake(&server, client_tls(&ca, &[b"http/1.1"])).await;
    assert!(without.is_err(), "no client certificate: refused");

    // A client certificate from another CA: refused.
    let foreign = client_tls_auth(
        &ca,
        &[b"http/1.1"],
        Some((
            &other.path("apiserver-client.crt"),
            &other.path("apiserver-client.key"),
        )),
    );
    let refused = handshake(&server, foreign).await;
    assert!(refused.is_err(), "foreign client certificate: refused");
}

// ---------------------------------------------------------------------------------------------
// Version 1 certificates (no extensions), as `openssl x509 -req` makes without `-extfile`.

/// One DER element at the start of `der`: (tag, header length, total length).
fn der_element(der: &[u8]) -> (u8, usize, usize) {
    let (length, header) = if der[1] < 0x80 {
        (usize::from(der[1]), 2)
    } else {
        let n = usize::from(der[1] & 0x7f);
        let length = der[2..2 + n]
            .iter()
            .fold(0usize, |acc, b| acc << 8 | usize::from(*b));
        (length, 2 + n)
    };
    (der[0], header, header + length)
}

fn der_wrap(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let length = content.len();
    if length < 0x80 {
        out.push(length as u8);
    } else {
        let bytes: Vec<u8> = length
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// Writes a self-signed X.509 version 1 certificate and its key as PEM files in `dir`.
fn write_v1_certificate(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    use base64::Engine;
    use rcgen::SigningKey;
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-object-lock");
    let v3 = params.self_signed(&key).expect("certificate");
    let der = v3.der().as_ref();
    // Certificate ::= SEQUENCE { tbsCertificate, signatureAlgorithm, signature }
    let (_, header, _) = der_element(der);
    let certificate = &der[header..];
    let (_, tbs_header, tbs_end) = der_element(certificate);
    let (_, _, algorithm_end) = der_element(&certificate[tbs_end..]);
    let algorithm = &certificate[tbs_end..tbs_end + algorithm_end];
    // Drop [0] version and [3] extensions: what is left is a version 1 TBSCertificate.
    let mut fields = Vec::new();
    let mut rest = &certificate[tbs_header..tbs_end];
    while !rest.is_empty() {
        let (tag, _, end) = der_element(rest);
        if tag != 0xa0 && tag != 0xa3 {
            fields.extend_from_slice(&rest[..end]);
        }
        rest = &rest[end..];
    }
    let tbs = der_wrap(0x30, &fields);
    let mut signature = vec![0];
    signature.extend(key.sign(&tbs).expect("sign"));
    let v1 = der_wrap(
        0x30,
        &[tbs, algorithm.to_vec(), der_wrap(0x03, &signature)].concat(),
    );
    let (_, parsed) = x509_parser::parse_x509_certificate(&v1).expect("a certificate");
    assert_eq!(parsed.version().0, 0, "version 1");
    let b64 = base64::engine::general_purpose::STANDARD.encode(&v1);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("ascii"))
        .collect();
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        lines.join("\n")
    );
    let (cert, key_file) = (dir.join("v1.crt"), dir.join("v1.key"));
    std::fs::write(&cert, pem).expect("write certificate");
    std::fs::write(&key_file, key.serialize_pem()).expect("write key");
    (cert, key_file)
}

/// A kubeconfig whose client certificate is version 1: the error names the certificate and
/// what to do, not "invalid private key: invalid peer certificate: UnsupportedCertVersion".
#[tokio::test]
async fn a_version_1_client_certificate_in_the_kubeconfig_is_named() {
    support::init();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = write_v1_certificate(dir.path());
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    client-certificate: {}\n    client-key: {}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n",
            cert.display(),
            key.display()
        ),
    )
    .expect("write kubeconfig");
    let mut settings = kube_object_lock::settings::Settings::default();
    settings.kube.kubeconfig = Some(kubeconfig.clone());
    let error = match kube_object_lock::app::lock_source(&settings, false, Default::default()).await
    {
        Ok(_) => panic!("a version 1 client certificate was accepted"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.starts_with(&format!(
            "cannot use kubeconfig {}: the client certificate (client-certificate {}) is an X.509 version 1 certificate",
            kubeconfig.display(),
            cert.display()
        )),
        "{error}"
    );
    assert!(!error.contains("private key"), "{error}");
}

/// The same for the serving certificate: the file is named, the pair is not blamed.
#[test]
fn a_version_1_serving_certificate_is_named() {
    support::init();
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key) = write_v1_certificate(dir.path());
    let error = kube_object_lock::tls::load_pair(&cert, &key)
        .expect_err("a version 1 certificate")
        .to_string();
    assert!(
        error.starts_with(&format!(
            "certificate {} is an X.509 version 1 certificate",
            cert.display()
        )),
        "{error}"
    );
    assert!(!error.contains("peer"), "{error}");
}
