//! Why a certificate cannot be used, in words that name the file or field to fix (a version 1
//! certificate, which rustls refuses and kube's client reports as `invalid private key`).

use base64::Engine;
use kube::config::AuthInfo;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

/// What is wrong with the certificate `der` before any TLS library looks at it: `Some` for a
/// certificate older than X.509 version 3 (worded to follow "the certificate ..."), `None`
/// when it is a version 3 certificate or cannot be parsed (the TLS library then says why).
pub fn version_problem(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let version = cert.version().0;
    (version < 2).then(|| {
        format!(
            "is an X.509 version {} certificate (it has no extensions); only version 3 certificates are accepted: issue it again with extensions (the CertificateSigningRequest API and `kube-object-lock certs` do; with `openssl x509 -req`, add `-extfile` with e.g. `extendedKeyUsage = clientAuth`)",
            version + 1
        )
    })
}

/// A message naming the kubeconfig's client certificate or key when `error` is kube refusing
/// them; `None` for any other error.
pub fn explain_kube_error(auth: &AuthInfo, error: &kube::Error) -> Option<String> {
    let kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidPrivateKey(cause)) = error
    else {
        return None;
    };
    let cert = match (&auth.client_certificate_data, &auth.client_certificate) {
        (Some(_), _) => "client-certificate-data".to_owned(),
        (None, Some(path)) => format!("client-certificate {path}"),
        (None, None) => "client-certificate".to_owned(),
    };
    let key = match (&auth.client_key_data, &auth.client_key) {
        (Some(_), _) => "client-key-data".to_owned(),
        (None, Some(path)) => format!("client-key {path}"),
        (None, None) => "client-key".to_owned(),
    };
    Some(match cause {
        rustls::Error::InvalidCertificate(reason) => {
            match client_certificate(auth).and_then(|der| version_problem(&der)) {
                Some(problem) => format!("the client certificate ({cert}) {problem}"),
                None => format!("the client certificate ({cert}) cannot be used: {reason:?}"),
            }
        }
        rustls::Error::InconsistentKeys(_) => {
            format!("the client key ({key}) does not belong to the client certificate ({cert})")
        }
        other => format!("the client key ({key}) cannot be used: {other}"),
    })
}

/// The DER of the kubeconfig's client certificate (the first of its chain).
fn client_certificate(auth: &AuthInfo) -> Option<Vec<u8>> {
    let pem = match (&auth.client_certificate_data, &auth.client_certificate) {
        (Some(data), _) => {
            let data: String = data.split_whitespace().collect();
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .ok()?
        }
        (None, Some(path)) => std::fs::read(path).ok()?,
        (None, None) => return None,
    };
    let leaf = CertificateDer::pem_slice_iter(&pem).next()?.ok()?;
    Some(leaf.as_ref().to_vec())
}
