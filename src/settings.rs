//! The service's settings: defaults < TOML file < environment < command-line flags, every key
//! documented in `deploy/kube-object-lock.toml`. Invariant: unknown keys are refused (a misspelt
//! key would leave its default silently in force), and every error names the key and where its
//! value came from: the file, the environment variable, or the flag.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{Config, ConfigError, Environment, File, FileFormat, Map, Source, Value, ValueKind};
use serde::{Deserialize, Serialize};

/// Prefix of the environment variables: `KUBE_OBJECT_LOCK__SECTION__KEY`.
pub const ENV_PREFIX: &str = "KUBE_OBJECT_LOCK";

/// The defaults: the example file sets every key to its default.
const DEFAULTS: &str = include_str!("../deploy/kube-object-lock.toml");

/// All settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// What to answer when the locks cannot be read: `deny` or `allow`.
    pub on_lookup_error: OnLookupError,
    pub server: ServerSettings,
    pub tls: TlsSettings,
    pub webhook: WebhookSettings,
    pub kube: KubeSettings,
    pub cache: CacheSettings,
    pub locks: LocksSettings,
    pub log: LogSettings,
    pub metrics: MetricsSettings,
    pub instance: InstanceSettings,
    pub registration: RegistrationSettings,
}

/// This instance, as lock status and events name it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceSettings {
    /// Unique, stable name of this instance; empty = the host name.
    pub name: String,
}

/// The webhook configuration narrowed to the locked names (cluster source only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistrationSettings {
    /// Keep the configuration's matchConditions narrowed to the locked names.
    pub narrow: bool,
    /// Name of the ValidatingWebhookConfiguration to keep narrowed.
    pub name: String,
    /// More live locks than this: the namespaces with the most Locks are sent whole, largest
    /// first, until the keys fit; the broad registration (every UPDATE and DELETE is sent) only
    /// when the ClusterLocks alone exceed it.
    pub max_names: usize,
}

/// The Prometheus endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsSettings {
    /// Plain-HTTP address serving `GET /metrics`; empty = off.
    pub listen: String,
}

impl MetricsSettings {
    /// The address to serve metrics on, or `None` when off.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.listen.parse().ok()
    }
}

/// The HTTPS listener.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSettings {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Longest TLS handshake.
    #[serde(with = "humantime_serde")]
    pub handshake_timeout: Duration,
    /// Longest wait for a request's headers (HTTP/1.1), from its first byte (for a connection's
    /// first request, from the handshake).
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Longest time a keep-alive connection may stay idle between requests; above the API
    /// server's own 90 s, so it is always the API server that gives up an idle connection.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Most idle keep-alive connections kept at once; beyond, a connection is closed after its
    /// answer (with `Connection: close`), so idle connections cannot exhaust the server.
    pub max_idle_connections: usize,
    /// Longest wait for a request's body.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// Largest request body accepted.
    pub max_body_bytes: u64,
    /// How long in-flight requests may take to finish after SIGTERM.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
}

/// The serving certificate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM certificate chain, leaf first.
    pub cert: Option<PathBuf>,
    /// PEM private key.
    pub key: Option<PathBuf>,
    /// PEM CA of the API server's client certificate; set = client certificates required.
    pub client_ca: Option<PathBuf>,
    /// How often the certificate files are checked for new bytes.
    #[serde(with = "humantime_serde")]
    pub reload_interval: Duration,
    /// Failed reloads in a row before `/healthz` reports unhealthy.
    pub max_reload_failures: u32,
}

/// How the API server reaches the webhook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSettings {
    /// The URL registered in the webhook configuration; the certificate must cover its host.
    pub url: String,
}

/// The Kubernetes lock source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeSettings {
    /// Kubeconfig file; unset = `KUBECONFIG`, `~/.kube/config`, or the in-cluster config.
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context; unset = the current context.
    pub context: Option<String>,
    /// Longest time a lock lookup may take before `on_lookup_error` decides.
    #[serde(with = "humantime_serde")]
    pub lookup_timeout: Duration,
    /// How long the lock index is trusted while its watch reconnects after a clean end; a watch
    /// error makes it stale at once. Stale: lookups LIST the API server.
    #[serde(with = "humantime_serde")]
    pub stale_after: Duration,
}

/// The cache of the fallback path (lookups while the lock index is stale).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheSettings {
    /// While the index is stale: how long after a namespace's LIST started a lookup may still
    /// reuse it. Zero (the default): only lookups that arrived before it started share it, so an
    /// acknowledged Lock is always seen.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How many namespaces are cached at most.
    pub max_namespaces: u64,
}

/// The files lock source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocksSettings {
    /// Directory of Lock / ClusterLock YAML files; set = use files instead of the API server.
    pub dir: Option<PathBuf>,
    /// How often the directory is checked for changes.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Where log events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogTarget {
    Auto,
    Journald,
    Stderr,
}

/// Logging.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogSettings {
    /// A tracing filter such as `info` or `kube_object_lock=debug,info`; `RUST_LOG` wins.
    pub level: String,
    /// `text` or `json` (stderr only: the journal keeps fields as fields).
    pub format: LogFormat,
    /// `auto`, `journald` or `stderr`.
    pub target: LogTarget,
}

/// A setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("cannot read settings file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("unknown setting `{key}` {origin}")]
    UnknownKey { key: String, origin: String },
    #[error("invalid setting `{key}` {origin}: {message}")]
    Invalid {
        key: String,
        origin: String,
        message: String,
    },
}

/// Where settings come from, besides the defaults.
#[derive(Debug, Default, Clone)]
pub struct Layers {
    /// The TOML file (`--config`).
    pub file: Option<PathBuf>,
    /// The environment; `None` reads the process environment.
    pub env: Option<Map<String, String>>,
    /// Values from flags, by dotted key.
    pub flags: Vec<(String, String)>,
}

impl Default for Settings {
    fn default() -> Self {
        (Config::builder()
            .add_source(File::from_str(DEFAULTS, FileFormat::Toml))
            .build())
        .and_then(Config::try_deserialize)
        .expect("the example settings file holds the defaults")
    }
}

impl Settings {
    /// Loads, merges and validates the layers.
    pub fn load(layers: &Layers) -> Result<Settings, SettingsError> {
        let mut builder = Config::builder().add_source(File::from_str(DEFAULTS, FileFormat::Toml));
        if let Some(path) = &layers.file {
            if !path.is_file() {
                return Err(SettingsError::File {
                    path: path.clone(),
                    message: "no such file".to_owned(),
                });
            }
            builder = builder.add_source(File::from(path.as_path()).format(FileFormat::Toml));
        }
        builder = builder.add_source(
            Environment::with_prefix(ENV_PREFIX)
                .prefix_separator("__")
                .separator("__")
                .try_parsing(true)
                .source(layers.env.clone()),
        );
        for (key, value) in &layers.flags {
            builder = builder
                .set_override(key.as_str(), value.as_str())
                .map_err(|e| invalid(key, &describe_origin(None, key, None), e.to_string()))?;
        }
        let config = builder
            .build()
            .map_err(|e| file_error(layers.file.as_deref(), e))?;
        let given = config
            .collect()
            .map_err(|e| file_error(layers.file.as_deref(), e))?;
        check_known_keys(&given, layers.file.as_deref())?;
        let settings: Settings = config.try_deserialize().map_err(|error| {
            let (key, message) = match error {
                ConfigError::Type {
                    key,
                    unexpected,
                    expected,
                    ..
                } => (
                    key,
                    format!("invalid type: {unexpected}, expected {expected}"),
                ),
                ConfigError::At { key, error, .. } => (key, error.to_string()),
                ConfigError::NotFound(key) => (Some(key), "is required".to_owned()),
                other => (None, other.to_string()),
            };
            let key = key.unwrap_or_default();
            let origin = origin_of(&given, &key, layers.file.as_deref());
            invalid(&key, &origin, explain(&key, &message))
        })?;
        settings.validate(&given, layers.file.as_deref())?;
        Ok(settings)
    }

    /// The settings the review path needs.
    pub fn review_policy(&self) -> ReviewPolicy {
        ReviewPolicy {
            on_lookup_error: self.on_lookup_error,
            lookup_timeout: self.kube.lookup_timeout,
        }
    }

    fn validate(
        &self,
        given: &Map<String, Value>,
        file: Option<&Path>,
    ) -> Result<(), SettingsError> {
        let fail = |key: &str, message: &str| {
            Err(invalid(
                key,
                &origin_of(given, key, file),
                message.to_owned(),
            ))
        };
        let between = |d: Duration, lo: Duration, hi: Duration| d >= lo && d <= hi;
        if !between(
            self.kube.lookup_timeout,
            Duration::from_millis(10),
            Duration::from_secs(29),
        ) {
            // The API server waits at most 30 s (timeoutSeconds); the answer must come first.
            return fail(
                "kube.lookup_timeout",
                "must be between 10ms and 29s, below the webhook's timeoutSeconds",
            );
        }
        if self.cache.ttl > Duration::from_secs(600) {
            return fail("cache.ttl", "must be at most 10m");
        }
        if !between(
            self.kube.stale_after,
            Duration::from_millis(100),
            Duration::from_secs(60),
        ) {
            return fail("kube.stale_after", "must be between 100ms and 60s");
        }
        if self.cache.max_namespaces == 0 {
            return fail("cache.max_namespaces", "must be at least 1");
        }
        if !(1024..=64 * 1024 * 1024).contains(&self.server.max_body_bytes) {
            return fail("server.max_body_bytes", "must be between 1024 and 67108864");
        }
        for (key, value) in [
            ("server.handshake_timeout", self.server.handshake_timeout),
            ("server.header_timeout", self.server.header_timeout),
            ("server.idle_timeout", self.server.idle_timeout),
            ("server.body_timeout", self.server.body_timeout),
            ("locks.poll_interval", self.locks.poll_interval),
            ("tls.reload_interval", self.tls.reload_interval),
        ] {
            if value.is_zero() {
                return fail(key, "must be more than 0s");
            }
        }
        if !self.metrics.listen.is_empty() && self.metrics.addr().is_none() {
            return fail(
                "metrics.listen",
                "must be an address like 127.0.0.1:9464, or empty to turn metrics off",
            );
        }
        if !self.instance.name.is_empty()
            && let Err(message) = check_instance_name(&self.instance.name)
        {
            return fail("instance.name", &message);
        }
        if !(1..=100_000).contains(&self.registration.max_names) {
            return fail("registration.max_names", "must be between 1 and 100000");
        }
        if self.registration.name.is_empty() {
            return fail(
                "registration.name",
                "must name the ValidatingWebhookConfiguration",
            );
        }
        if self.tls.max_reload_failures == 0 {
            return fail("tls.max_reload_failures", "must be at least 1");
        }
        match self.webhook.url.parse::<http::Uri>() {
            Ok(uri) if uri.scheme_str() == Some("https") && uri.host().is_some() => {}
            _ => {
                return fail(
                    "webhook.url",
                    "must be an https:// URL with a host, e.g. https://127.0.0.1:8443/validate",
                );
            }
        }
        if self.tls.cert.is_some() != self.tls.key.is_some() {
            let key = if self.tls.cert.is_some() {
                "tls.key"
            } else {
                "tls.cert"
            };
            return fail(key, "tls.cert and tls.key go together: set both");
        }
        if tracing_subscriber::EnvFilter::builder()
            .parse(&self.log.level)
            .is_err()
        {
            return fail(
                "log.level",
                "is not a log filter (try `info` or `kube_object_lock=debug,info`)",
            );
        }
        Ok(())
    }
}

fn invalid(key: &str, origin: &str, message: String) -> SettingsError {
    SettingsError::Invalid {
        key: key.to_owned(),
        origin: origin.to_owned(),
        message,
    }
}

/// A file that does not parse; the path is the one given, not the library's relative one.
fn file_error(file: Option<&Path>, error: ConfigError) -> SettingsError {
    let message = match error {
        ConfigError::FileParse { cause, .. } => cause.to_string(),
        other => other.to_string(),
    };
    SettingsError::File {
        path: file.map(Path::to_owned).unwrap_or_default(),
        message,
    }
}

/// Refuses keys that no setting has, naming where each came from.
fn check_known_keys(given: &Map<String, Value>, file: Option<&Path>) -> Result<(), SettingsError> {
    let defaults = serde_json::to_value(Settings::default()).expect("settings serialize");
    let mut known = BTreeSet::new();
    collect_json_keys("", &defaults, &mut known);
    let mut found = Vec::new();
    collect_config_keys("", given, &mut found);
    for (key, origin) in found {
        let is_known = known.contains(&key);
        // A section given as a whole (`server = 5`) is a type error, reported later.
        let is_section = known.iter().any(|k| k.starts_with(&format!("{key}.")));
        if !is_known && !is_section {
            return Err(SettingsError::UnknownKey {
                origin: describe_origin(origin.as_deref(), &key, file),
                key,
            });
        }
    }
    Ok(())
}

fn collect_json_keys(prefix: &str, value: &serde_json::Value, out: &mut BTreeSet<String>) {
    if let serde_json::Value::Object(map) = value {
        for (k, v) in map {
            let key = join(prefix, k);
            out.insert(key.clone());
            collect_json_keys(&key, v, out);
        }
    }
}

fn collect_config_keys(
    prefix: &str,
    map: &Map<String, Value>,
    out: &mut Vec<(String, Option<String>)>,
) {
    for (k, v) in map {
        let key = join(prefix, k);
        match &v.kind {
            ValueKind::Table(inner) => collect_config_keys(&key, inner, out),
            _ => out.push((key, v.origin().map(str::to_owned))),
        }
    }
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Where the value of `key` came from, worded for an error message.
fn origin_of(given: &Map<String, Value>, key: &str, file: Option<&Path>) -> String {
    let mut map = given;
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        let Some(value) = map.get(part) else { break };
        match (&value.kind, parts.peek()) {
            (ValueKind::Table(inner), Some(_)) => map = inner,
            _ => return describe_origin(value.origin(), key, file),
        }
    }
    "(default)".to_owned()
}

/// The flag that sets `key`, for messages about a value given on the command line.
pub fn flag_of(key: &str) -> Option<&'static str> {
    Some(match key {
        "server.listen" => "--listen",
        "metrics.listen" => "--metrics-listen",
        "tls.cert" => "--tls-cert",
        "tls.key" => "--tls-key",
        "kube.kubeconfig" => "--kubeconfig",
        "kube.context" => "--context",
        "locks.dir" => "--locks-dir",
        _ => return None,
    })
}

fn describe_origin(origin: Option<&str>, key: &str, file: Option<&Path>) -> String {
    match origin {
        Some("the environment") => format!(
            "from environment variable {ENV_PREFIX}__{}",
            key.replace('.', "__").to_uppercase()
        ),
        // The library names the file relative to the working directory; use the path as given.
        Some(origin) => format!(
            "in {}",
            file.map_or(origin.to_owned(), |f| f.display().to_string())
        ),
        None => match flag_of(key) {
            Some(flag) => format!("from the command line ({flag})"),
            None => "from the command line".to_owned(),
        },
    }
}

/// A deserialization error of setting `key` in words that say what to write instead: serde's
/// `enum OnLookupError does not have variant constructor maybe` names a Rust type, not the
/// values the setting takes.
fn explain(key: &str, message: &str) -> String {
    let expected = match key {
        "on_lookup_error" => "`deny` or `allow`",
        "log.format" => "`text` or `json`",
        "log.target" => "`auto`, `journald` or `stderr`",
        "server.listen" => {
            "an IP address and port such as 127.0.0.1:8443 or [::1]:8443 (a host name is not resolved)"
        }
        _ => return message.to_owned(),
    };
    match message.split_once("does not have variant constructor ") {
        Some((_, value)) => format!("`{value}` is not a value of it: expected {expected}"),
        None => format!("{message}: expected {expected}"),
    }
}

/// What to do when the locks cannot be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnLookupError {
    /// Refuse the change: a lock that cannot be seen is still a lock.
    Deny,
    /// Let the change through with a warning: availability over protection.
    Allow,
}

/// The settings the review path needs.
#[derive(Debug, Clone, Copy)]
pub struct ReviewPolicy {
    /// What to do when the locks cannot be read.
    pub on_lookup_error: OnLookupError,
    pub lookup_timeout: Duration,
}

/// Longest instance name: it is part of a field manager (at most 128 characters).
pub const MAX_INSTANCE_NAME: usize = 100;

/// This instance's name: `configured` if set, else the host name.
pub fn instance_name(configured: &str) -> Result<String, String> {
    let name = if configured.is_empty() {
        hostname::get()
            .map_err(|e| format!("cannot read the host name ({e}); set instance.name"))?
            .to_string_lossy()
            .into_owned()
    } else {
        configured.to_owned()
    };
    check_instance_name(&name)?;
    Ok(name)
}

/// An instance name is a list key and part of a field manager: printable, at most 100 characters.
pub fn check_instance_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.chars().count() > MAX_INSTANCE_NAME {
        return Err(format!(
            "must be 1 to {MAX_INSTANCE_NAME} characters (got {:?})",
            name
        ));
    }
    if name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "must not contain spaces or control characters (got {name:?})"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Option<Map<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("settings.toml");
        std::fs::write(&path, text).expect("write");
        (dir, path)
    }

    #[test]
    fn defaults_when_nothing_is_given() {
        let settings = Settings::load(&Layers {
            env: env(&[]),
            ..Layers::default()
        })
        .expect("defaults load");
        assert_eq!(settings, Settings::default());
        assert_eq!(settings.kube.lookup_timeout, Duration::from_secs(2));
        assert_eq!(settings.cache.ttl, Duration::ZERO);
        assert_eq!(settings.kube.stale_after, Duration::from_secs(3));
        assert_eq!(settings.on_lookup_error, OnLookupError::Deny);
    }

    #[test]
    fn layers_override_in_order() {
        let (_dir, path) = file(
            "on_lookup_error = \"allow\"\n[cache]\nttl = \"10s\"\nmax_namespaces = 5\n[kube]\nlookup_timeout = \"1s\"\n",
        );
        let settings = Settings::load(&Layers {
            file: Some(path),
            env: env(&[
                ("KUBE_OBJECT_LOCK__CACHE__TTL", "20s"),
                ("KUBE_OBJECT_LOCK__KUBE__LOOKUP_TIMEOUT", "3s"),
                ("UNRELATED", "x"),
            ]),
            flags: vec![("kube.lookup_timeout".into(), "4s".into())],
        })
        .expect("loads");
        assert_eq!(settings.on_lookup_error, OnLookupError::Allow);
        assert_eq!(settings.cache.max_namespaces, 5, "file");
        assert_eq!(settings.cache.ttl, Duration::from_secs(20), "env over file");
        assert_eq!(
            settings.kube.lookup_timeout,
            Duration::from_secs(4),
            "flag over env"
        );
    }

    #[test]
    fn unknown_keys_name_the_key_and_where_it_came_from() {
        let (_dir, path) = file("[kube]\nlookup_timout = \"1s\"\n");
        let err = Settings::load(&Layers {
            file: Some(path.clone()),
            env: env(&[]),
            ..Layers::default()
        })
        .expect_err("unknown key");
        let text = err.to_string();
        assert!(text.contains("`kube.lookup_timout`"), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");

        let err = Settings::load(&Layers {
            env: env(&[("KUBE_OBJECT_LOCK__SERVR__LISTEN", "0.0.0.0:1")]),
            ..Layers::default()
        })
        .expect_err("unknown env key");
        assert_eq!(
            err.to_string(),
            "unknown setting `servr.listen` from environment variable KUBE_OBJECT_LOCK__SERVR__LISTEN"
        );
    }

    #[test]
    fn bad_values_name_the_key_and_origin() {
        let (_dir, path) = file("[cache]\nttl = \"soon\"\n");
        let err = Settings::load(&Layers {
            file: Some(path.clone()),
            env: env(&[]),
            ..Layers::default()
        })
        .expect_err("bad duration");
        let text = err.to_string();
        assert!(text.contains("cache.ttl"), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");

        let err = Settings::load(&Layers {
            env: env(&[("KUBE_OBJECT_LOCK__KUBE__LOOKUP_TIMEOUT", "45s")]),
            ..Layers::default()
        })
        .expect_err("too long");
        assert!(
            err.to_string().starts_with(
                "invalid setting `kube.lookup_timeout` from environment variable KUBE_OBJECT_LOCK__KUBE__LOOKUP_TIMEOUT: must be between"
            ),
            "{err}"
        );

        let err = Settings::load(&Layers {
            env: env(&[]),
            flags: vec![("tls.cert".into(), "/x.crt".into())],
            ..Layers::default()
        })
        .expect_err("cert without key");
        assert!(err.to_string().contains("`tls.key`"), "{err}");

        let err = Settings::load(&Layers {
            env: env(&[("KUBE_OBJECT_LOCK__ON_LOOKUP_ERROR", "maybe")]),
            ..Layers::default()
        })
        .expect_err("bad enum");
        assert!(err.to_string().contains("on_lookup_error"), "{err}");
    }

    #[test]
    fn a_missing_or_broken_file_is_named() {
        let err = Settings::load(&Layers {
            file: Some("/nonexistent/settings.toml".into()),
            env: env(&[]),
            ..Layers::default()
        })
        .expect_err("missing");
        assert!(
            err.to_string().contains("/nonexistent/settings.toml"),
            "{err}"
        );
        let (_dir, path) = file("[server\nlisten = 1\n");
        let err = Settings::load(&Layers {
            file: Some(path.clone()),
            env: env(&[]),
            ..Layers::default()
        })
        .expect_err("broken toml");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn the_example_file_is_complete_and_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kube-object-lock.toml");
        let text = std::fs::read_to_string(&path).expect("example settings file exists");
        let defaults = serde_json::to_value(Settings::default()).expect("serialize");
        let mut known = BTreeSet::new();
        collect_json_keys("", &defaults, &mut known);
        for key in known {
            let leaf = key.rsplit('.').next().expect("non-empty");
            assert!(
                text.contains(leaf),
                "example file does not document `{key}`"
            );
        }
        Settings::load(&Layers {
            file: Some(path),
            env: env(&[]),
            ..Layers::default()
        })
        .expect("example file loads");
    }

    #[test]
    fn instance_names_are_checked() {
        assert!(check_instance_name("cp-1.example.com").is_ok());
        assert!(check_instance_name("").is_err());
        assert!(check_instance_name("two words").is_err());
        assert!(check_instance_name(&"x".repeat(101)).is_err());
        assert_eq!(instance_name("cp-1").as_deref(), Ok("cp-1"));
        let host = instance_name("").expect("the host name");
        assert!(!host.is_empty());
    }
}
