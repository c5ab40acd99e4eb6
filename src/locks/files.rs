//! Locks from a directory of YAML files (`Lock` / `ClusterLock` documents as `kubectl apply`
//! takes them), polled; a file is parsed again only when its bytes change. Invariant: a file that
//! does not read is an error at start-up and keeps its last good locks on a reload; a removed
//! file takes its locks with it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::Deserialize;
use serde_saphyr::Spanned;
use tracing::{error, info, warn};

use super::{LockCounts, LockKind, LockRef, LockSet, LockSource, LookupError, parse};
use crate::api::{API_VERSION, LockSpec};

/// Why the directory itself cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FilesError {
    /// The directory cannot be listed.
    #[error("cannot read locks directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Lock files that do not read, at start-up: starting without their locks would unlock
    /// what they lock.
    #[error("{}", not_read(.0))]
    Files(Vec<FileProblem>),
}

fn not_read(problems: &[FileProblem]) -> String {
    let (what, them) = match problems.len() {
        1 => ("a lock file is", "it"),
        _ => ("lock files are", "them"),
    };
    let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
    let list = list.join("; ");
    format!("{what} not read (fix {them}, or move {them} out of the directory): {list}")
}

/// A file that could not be used, with where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProblem {
    pub path: PathBuf,
    /// 1-based line, when known.
    pub line: Option<u64>,
    pub message: String,
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.path.display(), self.message),
            None => write!(f, "{}: {}", self.path.display(), self.message),
        }
    }
}

/// What one scan of the directory found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanReport {
    /// True when the set of locks changed.
    pub changed: bool,
    /// Files that could not be used (their last good locks are kept).
    pub problems: Vec<FileProblem>,
    /// Number of locks in force after the scan.
    pub locks: usize,
}

#[derive(Debug)]
struct FileState {
    bytes: Vec<u8>,
    locks: Vec<LockRef>,
    problem: Option<FileProblem>,
}

/// The files lock source.
#[derive(Debug)]
pub struct FilesSource {
    dir: PathBuf,
    files: Mutex<BTreeMap<PathBuf, FileState>>,
    snapshot: RwLock<Arc<HashMap<String, Arc<LockSet>>>>,
    ready: AtomicBool,
}

impl FilesSource {
    /// Reads the directory once. Fails when the directory cannot be listed or a lock file in it
    /// does not read (naming each such file, its line and what is wrong).
    pub fn open(dir: impl Into<PathBuf>) -> Result<(FilesSource, ScanReport), FilesError> {
        let source = FilesSource {
            dir: dir.into(),
            files: Mutex::new(BTreeMap::new()),
            snapshot: RwLock::new(Arc::default()),
            ready: AtomicBool::new(false),
        };
        let report = source.scan(false)?;
        if !report.problems.is_empty() {
            return Err(FilesError::Files(report.problems));
        }
        source.ready.store(true, Ordering::SeqCst);
        Ok((source, report))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reads the directory again, parsing the files whose bytes changed; a file that no longer
    /// reads is logged once (per change) and keeps its last good locks.
    pub fn rescan(&self) -> Result<ScanReport, FilesError> {
        self.scan(true)
    }

    fn scan(&self, log: bool) -> Result<ScanReport, FilesError> {
        let dir_error = |source| FilesError::Dir {
            path: self.dir.clone(),
            source,
        };
        let mut paths = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(dir_error)? {
            let path = entry.map_err(dir_error)?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
            if yaml && !name.starts_with('.') && path.is_file() {
                paths.push(path);
            }
        }
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let mut changed = false;
        let before = files.len();
        files.retain(|path, _| paths.contains(path));
        changed |= files.len() != before;
        for path in paths {
            let bytes = match std::fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    // Vanished between listing and reading, or unreadable: keep what we had.
                    warn!(path = %path.display(), error = %e, "cannot read lock file");
                    continue;
                }
            };
            if files.get(&path).is_some_and(|f| f.bytes == bytes) {
                continue;
            }
            let state = match parse_file(&path, &bytes) {
                Ok(locks) => {
                    changed = true;
                    FileState {
                        bytes,
                        locks,
                        problem: None,
                    }
                }
                Err(problem) => {
                    if log {
                        error!(problem = %problem, "lock file not loaded; its previous locks stay in force");
                    }
                    let kept = files
                        .get(&path)
                        .map(|f| f.locks.clone())
                        .unwrap_or_default();
                    FileState {
                        bytes,
                        locks: kept,
                        problem: Some(problem),
                    }
                }
            };
            files.insert(path, state);
        }
        let problems: Vec<FileProblem> = files.values().filter_map(|f| f.problem.clone()).collect();
        let mut sets: HashMap<String, LockSet> = HashMap::new();
        let mut count = 0;
        for lock in files.values().flat_map(|f| f.locks.iter()) {
            let key = lock.namespace.clone().unwrap_or_default();
            let set = sets.entry(key).or_default();
            if set.get(&lock.name).is_some() {
                warn!(lock = %lock, "lock defined in more than one file; the last file wins");
            } else {
                count += 1;
            }
            set.insert(lock.clone());
        }
        if changed {
            let snapshot = sets.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
            *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(snapshot);
            info!(dir = %self.dir.display(), locks = count, "lock files loaded");
        }
        Ok(ScanReport {
            changed,
            problems,
            locks: count,
        })
    }

    /// Polls the directory every `interval` until dropped.
    pub async fn watch(self: Arc<Self>, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let this = self.clone();
            match tokio::task::spawn_blocking(move || this.rescan()).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    error!(error = %e, "locks directory unreadable; keeping the locks already loaded")
                }
                Err(e) => error!(error = %e, "locks directory scan failed"),
            }
        }
    }
}

impl LockSource for FilesSource {
    fn locks(&self, namespace: &str) -> BoxFuture<'_, Result<Arc<LockSet>, LookupError>> {
        let set = self.locks_at_hand(namespace);
        Box::pin(async move { Ok(set.unwrap_or_else(LockSet::empty)) })
    }

    fn locks_at_hand(&self, namespace: &str) -> Option<Arc<LockSet>> {
        let snapshot = self
            .snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Some(
            snapshot
                .get(namespace)
                .cloned()
                .unwrap_or_else(LockSet::empty),
        )
    }

    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    fn describe(&self) -> String {
        format!("files in {}", self.dir.display())
    }

    fn all_at_hand(&self) -> Option<Vec<Arc<LockSet>>> {
        let snapshot = self.snapshot.read().unwrap_or_else(|e| e.into_inner());
        Some(snapshot.values().cloned().collect())
    }

    fn lock_counts(&self) -> LockCounts {
        LockCounts::of(
            self.snapshot
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .iter(),
        )
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Document {
    api_version: Spanned<String>,
    kind: Spanned<String>,
    metadata: Spanned<Metadata>,
    #[serde(default)]
    spec: Option<Spanned<serde_json::Value>>,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: Option<String>,
}

/// The line of the field a spec problem names (`spec.expiresAt: ...`): the first line from the
/// spec's own on that holds its key, else the spec's line.
fn field_line(text: &str, spec_line: u64, message: &str) -> u64 {
    let key = message
        .strip_prefix("spec.")
        .and_then(|rest| rest.split(':').next())
        .and_then(|path| path.rsplit('.').next())
        .map(|last| last.split('[').next().unwrap_or(last))
        .filter(|key| !key.is_empty());
    let Some(key) = key else {
        return spec_line;
    };
    let skip = usize::try_from(spec_line.saturating_sub(1)).unwrap_or(0);
    text.lines()
        .enumerate()
        .skip(skip)
        .find(|(_, line)| {
            let line = line.trim_start().trim_start_matches("- ");
            line.strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
        .map_or(spec_line, |(at, _)| at as u64 + 1)
}

/// Parses one file's documents; any bad document makes the whole file a problem.
pub fn parse_file(path: &Path, bytes: &[u8]) -> Result<Vec<LockRef>, FileProblem> {
    let problem = |line: Option<u64>, message: String| FileProblem {
        path: path.to_owned(),
        line,
        message,
    };
    let text =
        std::str::from_utf8(bytes).map_err(|e| problem(None, format!("not UTF-8 text: {e}")))?;
    let documents: Vec<Option<Document>> = serde_saphyr::from_multiple(text).map_err(|e| {
        let line = e.location().map(|l| l.line());
        let message = e.to_string();
        // The library's message may carry its own position; keep the first line only.
        let message = message.lines().next().unwrap_or("invalid YAML").to_owned();
        problem(line, message)
    })?;
    let mut locks = Vec::new();
    for doc in documents.into_iter().flatten() {
        let line = Some(doc.kind.referenced.line());
        if doc.api_version.value != API_VERSION {
            return Err(problem(
                Some(doc.api_version.referenced.line()),
                format!(
                    "apiVersion is {:?}, expected {API_VERSION:?}",
                    doc.api_version.value
                ),
            ));
        }
        let kind = match doc.kind.value.as_str() {
            "Lock" => LockKind::Lock,
            "ClusterLock" => LockKind::ClusterLock,
            other => {
                return Err(problem(
                    line,
                    format!("kind is {other:?}, expected \"Lock\" or \"ClusterLock\""),
                ));
            }
        };
        let meta_line = Some(doc.metadata.referenced.line());
        let meta = doc.metadata.value;
        if meta.name.is_empty() {
            return Err(problem(meta_line, "metadata.name is missing".into()));
        }
        let spec = match doc.spec {
            Some(spec) => parse::file_spec(spec.value).map_err(|message| {
                let line = field_line(text, spec.referenced.line(), &message);
                problem(Some(line), message)
            })?,
            None => LockSpec::default(),
        };
        let lock = match (kind, meta.namespace.filter(|ns| !ns.is_empty())) {
            (LockKind::Lock, Some(ns)) => LockRef::lock(&ns, &meta.name, spec),
            (LockKind::Lock, None) => {
                return Err(problem(
                    meta_line,
                    format!("Lock {:?} has no metadata.namespace", meta.name),
                ));
            }
            (LockKind::ClusterLock, None) => LockRef::cluster_lock(&meta.name, spec),
            (LockKind::ClusterLock, Some(ns)) => {
                return Err(problem(
                    meta_line,
                    format!(
                        "ClusterLock {:?} is cluster-scoped but has metadata.namespace {ns:?}",
                        meta.name
                    ),
                ));
            }
        };
        locks.push(lock);
    }
    Ok(locks)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<LockRef>, FileProblem> {
        parse_file(Path::new("locks.yaml"), text.as_bytes())
    }

    #[test]
    fn reads_several_documents_and_every_spec_field() {
        let locks = parse(
            "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: freeze, namespace: prod}\nspec:\n  reason: release\n  operations: [DELETE]\n  resources: [{apiGroups: [apps], resources: [deployments]}]\n  selector: {matchLabels: {app: web}}\n  exempt: {users: [alice], groups: [ops], serviceAccounts: [velero/velero]}\n  expiresAt: 2026-11-22T18:00:00Z\n  mode: Warn\n---\napiVersion: objectlock.dev/v1alpha1\nkind: ClusterLock\nmetadata:\n  name: kube-system\n---\n",
        )
        .expect("valid");
        assert_eq!(locks[0].key(), crate::api::LockKey::lock("prod", "freeze"));
        assert_eq!(
            serde_json::to_value(&locks[0].spec).expect("json"),
            serde_json::json!({
                "reason": "release",
                "operations": ["DELETE"],
                "resources": [{"apiGroups": ["apps"], "resources": ["deployments"]}],
                "selector": {"matchLabels": {"app": "web"}},
                "exempt": {"users": ["alice"], "groups": ["ops"], "serviceAccounts": ["velero/velero"]},
                "expiresAt": "2026-11-22T18:00:00Z",
                "mode": "Warn",
            })
        );
        assert_eq!(
            locks[1..],
            [LockRef::cluster_lock("kube-system", LockSpec::default())]
        );
    }

    #[test]
    fn problems_name_the_line() {
        let cases = [
            (
                "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata:\n  name: a\n",
                4,
                "has no metadata.namespace",
            ),
            (
                "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata:\n  name: a\n  namespace: p\n---\napiVersion: v1\nkind: Lock\nmetadata: {name: b, namespace: p}\n",
                7,
                "apiVersion is \"v1\"",
            ),
            (
                "apiVersion: objectlock.dev/v1alpha1\nkind: Lok\nmetadata: {name: b, namespace: p}\n",
                2,
                "kind is \"Lok\"",
            ),
            (
                "apiVersion: objectlock.dev/v1alpha1\nkind: ClusterLock\nmetadata: {name: b, namespace: p}\n",
                3,
                "is cluster-scoped",
            ),
            (
                "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: b, namespace: p}\nspec:\n  reasn: typo\n",
                5,
                "spec.reasn is not a field",
            ),
            (
                "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: b, namespace: p}\nspec: [1]\n",
                4,
                "spec must be a mapping",
            ),
            (
                "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: b, namespace: p}\nspec:\n  exempt: {userz: [a]}\n",
                5,
                "spec.exempt.userz is not a field",
            ),
            (
                "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: b, namespace: p}\nspec:\n  mode: Audit\n",
                5,
                "unknown variant `Audit`",
            ),
            (
                "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: b, namespace: p}\nspec:\n  selector: {}\n",
                5,
                "spec.selector: an empty selector",
            ),
            (
                "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: b, namespace: p}\nspec:\n  reason: r\n  expiresAt: tomorrow\n",
                6,
                "spec.expiresAt: ",
            ),
            (
                "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: b, namespace: p}\nspec:\n  reason: r\n  operations:\n  - UPDATE\n  - DELTE\n",
                6,
                "spec.operations[1]: unknown variant `DELTE`",
            ),
            (
                "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata:\n  name: [unclosed\n",
                4,
                "",
            ),
        ];
        for (text, line, needle) in cases {
            let problem = parse(text).expect_err(text);
            assert_eq!(problem.line, Some(line), "{problem}");
            assert!(problem.message.contains(needle), "{problem}");
            assert!(
                problem
                    .to_string()
                    .starts_with(&format!("locks.yaml:{line}: "))
            );
        }
    }

    #[tokio::test]
    async fn a_bad_file_keeps_its_last_good_locks_and_spares_the_others() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("good.yaml");
        let edited = dir.path().join("edited.yml");
        std::fs::write(
            &good,
            "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: a, namespace: p}\n",
        )
        .expect("write");
        std::fs::write(
            &edited,
            "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: b, namespace: p}\n---\napiVersion: objectlock.dev/v1alpha1\nkind: ClusterLock\nmetadata: {name: n}\n",
        )
        .expect("write");
        std::fs::write(dir.path().join("notes.txt"), "not a lock").expect("write");
        let (source, report) = FilesSource::open(dir.path()).expect("opens");
        assert_eq!(report.locks, 3);
        assert!(report.problems.is_empty());
        assert!(source.is_ready());
        assert!(source.locks("p").await.expect("lookup").get("b").is_some());
        assert!(source.locks("").await.expect("lookup").get("n").is_some());
        assert!(source.locks("q").await.expect("lookup").is_empty());

        std::fs::write(&edited, "kind: [\n").expect("write");
        let report = source.rescan().expect("rescans");
        assert_eq!(report.problems.len(), 1);
        assert_eq!(report.problems[0].path, edited);
        assert_eq!(report.locks, 3, "the bad file keeps its previous locks");

        std::fs::remove_file(&edited).expect("remove");
        let report = source.rescan().expect("rescans");
        assert!(report.changed);
        assert_eq!(report.locks, 1);
        assert!(source.locks("p").await.expect("lookup").get("b").is_none());
        assert!(report.problems.is_empty());

        let unchanged = source.rescan().expect("rescans");
        assert!(!unchanged.changed);
    }

    /// At start-up there are no last good locks to keep: a file that does not read must not
    /// start the source without its locks (a typo would unlock what it names).
    #[test]
    fn a_file_that_does_not_read_at_start_up_is_an_error_naming_file_line_and_field() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("web.yaml");
        std::fs::write(
            &path,
            "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: web, namespace: prod}\nspec:\n  operations: [DELTE]\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("good.yaml"),
            "apiVersion: objectlock.dev/v1alpha1\nkind: Lock\nmetadata: {name: db, namespace: prod}\n",
        )
        .expect("write");
        let err = FilesSource::open(dir.path()).expect_err("a bad file fails the start");
        let message = err.to_string();
        assert!(
            message.contains(&format!(
                "{}:5: spec.operations[0]: unknown variant `DELTE`",
                path.display()
            )),
            "{message}"
        );
    }

    #[test]
    fn a_missing_directory_is_an_error_naming_it() {
        let err = FilesSource::open("/nonexistent/locks").expect_err("missing");
        assert!(err.to_string().contains("/nonexistent/locks"), "{err}");
    }
}
