//! `kube-object-lock certs`: a CA and a serving certificate signed by it, covering
//! `127.0.0.1`, `[::1]` and `localhost` by default (the API server checks SANs, never the CN).
//! Invariant: keys are written mode 0600, existing files never overwritten without `--force`.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

pub const DEFAULT_SANS: [&str; 3] = ["127.0.0.1", "::1", "localhost"];

pub use super::CertsArgs as CertsRequest;

#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("--san {san:?} is neither an IP address nor a DNS name: {message}")]
    BadSan { san: String, message: String },
    #[error("{0}")]
    Validity(String),
    #[error("{0} exists; pass --force to overwrite it")]
    Exists(PathBuf),
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot generate certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

pub const FILES: [&str; 4] = ["ca.crt", "ca.key", "tls.crt", "tls.key"];
pub const CLIENT_FILES: [&str; 4] = [
    "client-ca.crt",
    "client-ca.key",
    "apiserver-client.crt",
    "apiserver-client.key",
];
/// The common name of the API server's client certificate.
pub const CLIENT_CN: &str = "kube-apiserver";

/// Generates the CAs and certificates and writes their files.
pub fn generate(req: &CertsRequest) -> Result<Vec<PathBuf>, CertsError> {
    if req.days == 0 || req.ca_days == 0 {
        return Err(CertsError::Validity(
            "--days and --ca-days must be at least 1".into(),
        ));
    }
    if req.days > req.ca_days {
        return Err(CertsError::Validity(format!(
            "--days {} is longer than the CA's --ca-days {}",
            req.days, req.ca_days
        )));
    }
    let sans = if req.sans.is_empty() {
        DEFAULT_SANS.iter().map(|s| (*s).to_owned()).collect()
    } else {
        req.sans.clone()
    };
    for san in &sans {
        check_san(san).map_err(|message| CertsError::BadSan {
            san: san.clone(),
            message: message.to_owned(),
        })?;
    }
    let names = FILES
        .iter()
        .chain(if req.client { &CLIENT_FILES[..] } else { &[] });
    let paths: Vec<PathBuf> = names.clone().map(|f| req.out.join(f)).collect();
    if !req.force
        && let Some(existing) = paths.iter().find(|p| p.exists())
    {
        return Err(CertsError::Exists(existing.clone()));
    }
    let server = ExtendedKeyUsagePurpose::ServerAuth;
    let mut pems = ca_and_leaf("kube-object-lock CA", "kube-object-lock", sans, server, req)?;
    if req.client {
        // A CA of its own: trusting the cluster CA would admit every client it ever signed.
        let usage = ExtendedKeyUsagePurpose::ClientAuth;
        pems.extend(ca_and_leaf(
            "kube-object-lock client CA",
            CLIENT_CN,
            vec![],
            usage,
            req,
        )?);
    }
    let files = names.zip(pems).map(|(name, (pem, mode))| (name, pem, mode));
    write_files(&req.out, files, req.force)
        .map_err(|(path, source)| CertsError::Io { path, source })
}

/// An IP address, or a DNS name as RFC 1123 allows it (a leading `*.` wildcard included).
fn check_san(san: &str) -> Result<(), &'static str> {
    if san.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let host = san.strip_prefix("*.").unwrap_or(san);
    if host.is_empty() || host.len() > 253 {
        return Err("a DNS name has 1 to 253 characters");
    }
    for label in host.split('.') {
        let valid = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !valid {
            return Err("DNS labels are 1 to 63 letters, digits or inner hyphens");
        }
    }
    Ok(())
}

/// The PEM files (text, mode) of a CA that may sign leaf certificates only, its key, a leaf
/// certificate it signs for `usage` and the leaf's key.
fn ca_and_leaf(
    ca_name: &str,
    leaf_name: &str,
    sans: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
    req: &CertsRequest,
) -> Result<Vec<(String, u32)>, CertsError> {
    let now = OffsetDateTime::now_utc();
    let params = |sans: Vec<String>, common_name: &str, days: u32| {
        let mut params = CertificateParams::new(sans)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        // Backdate a little so a peer with a slightly slow clock accepts the certificate at once.
        params.not_before = now - Duration::minutes(5);
        params.not_after = now + Duration::days(i64::from(days));
        Ok::<_, CertsError>(params)
    };
    let (ca_key, leaf_key) = (KeyPair::generate()?, KeyPair::generate()?);
    let mut ca = params(Vec::new(), ca_name, req.ca_days)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_pem = ca.self_signed(&ca_key)?.pem();
    let mut leaf = params(sans, leaf_name, req.days)?;
    leaf.is_ca = IsCa::ExplicitNoCa;
    leaf.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    leaf.extended_key_usages = vec![usage];
    let leaf_pem = leaf.signed_by(&leaf_key, &Issuer::from_params(&ca, &ca_key))?;
    Ok(vec![
        (ca_pem, 0o644),
        (ca_key.serialize_pem(), 0o600),
        (leaf_pem.pem(), 0o644),
        (leaf_key.serialize_pem(), 0o600),
    ])
}

/// Creates `dir` and writes the files (name, text, mode) into it, replacing one only with
/// `force`; on error, the path that failed.
pub(super) fn write_files(
    dir: &Path,
    files: impl IntoIterator<Item = (impl AsRef<Path>, impl AsRef<[u8]>, u32)>,
    force: bool,
) -> Result<Vec<PathBuf>, (PathBuf, std::io::Error)> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::create_dir_all(dir).map_err(|e| (dir.to_owned(), e))?;
    let mut written = Vec::new();
    for (name, text, mode) in files {
        let path = dir.join(name);
        let write = || {
            let mut options = OpenOptions::new();
            let options = options.write(true).mode(mode).create_new(!force);
            let mut file = options.create(force).truncate(force).open(&path)?;
            // The mode above only applies to new files; an overwritten key must be private too.
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
            file.write_all(text.as_ref())?;
            file.sync_all()
        };
        write().map_err(|e| (path.clone(), e))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn request(out: &Path) -> CertsRequest {
        CertsRequest {
            out: out.to_owned(),
            sans: vec![],
            days: 30,
            ca_days: 60,
            force: false,
            client: false,
        }
    }

    #[test]
    fn writes_a_usable_pair_with_private_keys() {
        let dir = tempfile::tempdir().expect("tempdir");
        let paths = generate(&request(dir.path())).expect("generates");
        assert_eq!(paths.len(), 4);
        for (file, mode) in [("ca.key", 0o600), ("tls.key", 0o600), ("tls.crt", 0o644)] {
            let meta = std::fs::metadata(dir.path().join(file)).expect("written");
            assert_eq!(meta.permissions().mode() & 0o777, mode, "{file}");
        }
        crate::tls::load_pair(&dir.path().join("tls.crt"), &dir.path().join("tls.key"))
            .expect("the serving pair loads");
        // The CA's key and certificate are a pair too.
        crate::tls::load_pair(&dir.path().join("ca.crt"), &dir.path().join("ca.key"))
            .expect("the CA pair loads");
    }

    #[test]
    fn client_certificates_come_from_their_own_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        let req = CertsRequest {
            client: true,
            ..request(dir.path())
        };
        let paths = generate(&req).expect("generates");
        assert_eq!(paths.len(), 8);
        let meta = std::fs::metadata(dir.path().join("apiserver-client.key")).expect("key");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let pair = crate::tls::load_pair(
            &dir.path().join("apiserver-client.crt"),
            &dir.path().join("apiserver-client.key"),
        )
        .expect("client pair loads");
        assert_ne!(
            std::fs::read(dir.path().join("client-ca.crt")).expect("read"),
            std::fs::read(dir.path().join("ca.crt")).expect("read")
        );
        let info = crate::tls::CertInfo::of(&pair).expect("parses");
        assert!(
            info.ips.is_empty() && info.dns.is_empty(),
            "a client certificate names no host"
        );
    }

    #[test]
    fn refuses_to_overwrite_without_force() {
        let dir = tempfile::tempdir().expect("tempdir");
        generate(&request(dir.path())).expect("first");
        let before = std::fs::read(dir.path().join("ca.key")).expect("read");
        let err = generate(&request(dir.path())).expect_err("second");
        assert!(err.to_string().contains("pass --force"), "{err}");
        assert_eq!(
            std::fs::read(dir.path().join("ca.key")).expect("read"),
            before
        );
        let forced = CertsRequest {
            force: true,
            ..request(dir.path())
        };
        generate(&forced).expect("forced");
        assert_ne!(
            std::fs::read(dir.path().join("ca.key")).expect("read"),
            before
        );
    }

    #[test]
    fn bad_input_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bad_san = CertsRequest {
            sans: vec!["not a name!".into()],
            ..request(dir.path())
        };
        assert!(
            generate(&bad_san)
                .expect_err("bad san")
                .to_string()
                .contains("--san")
        );
        let outlives = CertsRequest {
            days: 90,
            ..request(dir.path())
        };
        assert!(
            generate(&outlives)
                .expect_err("too long")
                .to_string()
                .contains("--ca-days")
        );
        assert!(
            !dir.path().join("ca.crt").exists(),
            "nothing written on error"
        );
    }
}
