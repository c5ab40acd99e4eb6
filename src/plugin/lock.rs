//! `kubectl lock RESOURCE/NAME` and `kubectl unlock RESOURCE/NAME`.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams, Preconditions};
use tokio::sync::watch;

use super::cli::{ConnectionArgs, LockArgs};
use super::confirm::{self, Probe};
use super::error::{detail, status_code};
use super::owner;
use super::spec;
use super::{Cluster, PluginError, Report, Target, collector};
use crate::admission::decide;
use crate::api::{Holder, LockKey, LockOperation, LockSpec};

/// A lock held while a command runs: `created` is told the lock as soon as it exists.
pub(super) struct Held<'a> {
    pub lease: Duration,
    pub expires_at: Timestamp,
    pub created: &'a watch::Sender<Option<Created>>,
}

/// A lock this process created; its uid is a precondition of every later write.
#[derive(Clone)]
pub(super) struct Created {
    pub api: Api<DynamicObject>,
    pub key: LockKey,
    pub uid: String,
}

/// Creates the lock of `args.target` and waits until it is in force (unless `--wait=false`).
pub(super) async fn take(
    connection: &ConnectionArgs,
    args: &LockArgs,
    held: Option<Held<'_>>,
) -> Result<Report, PluginError> {
    let expires_at = match &held {
        Some(held) => Some(held.expires_at),
        None => expiry(args, Timestamp::now())?,
    };
    let mut operations = args.operations.clone();
    operations.sort();
    operations.dedup();

    let cluster = Cluster::connect(connection).await?;
    let mut notes = vec![];
    let target = Target::resolve(&cluster, connection, &args.target, &mut notes).await?;
    if let Some(why) = target.unenforced() {
        let lock = target.lock().to_string();
        if !args.force_unenforced {
            return Err(PluginError::Message(format!(
                "{lock} would never be enforced: {why} (pass --force-unenforced to create it anyway)"
            )));
        }
        notes.push(format!("{lock} is not enforced: {why}"));
    }
    // A lock reserving the name is mostly taken before the object exists.
    if !args.allow_missing && !operations.contains(&LockOperation::Create) {
        let api = cluster.api(&target.resource.api_resource(), target.namespace.as_deref());
        let object = api
            .get(&target.name)
            .await
            .map_err(|e| match status_code(&e) {
                Some(404) => PluginError::Message(format!(
                    "{target} does not exist (lock it anyway with --allow-missing)"
                )),
                _ => cluster.failed(&e, format!("cannot read {target}")),
            })?;
        if let Some(waiting) = collector::waiting(&cluster, &target, &object).await {
            notes.push(format!(
                "{target} is waiting for the garbage collector ({waiting}): the lock keeps it \
                 until the lock is lifted"
            ));
        }
    }

    let owner = match &args.owner {
        Some(text) => Some(owner::resolve(&cluster, text, &target, &operations).await?),
        None => None,
    };
    let holder = match args.no_holder {
        true => None,
        false => Some(caller(&cluster).await?),
    };

    let resource = (
        target.resource.group.as_str(),
        target.resource.plural.as_str(),
    );
    let new = spec::new(args, resource, &operations, expires_at, holder);
    let lock = target.lock();
    let spec = serde_json::to_value(&new).expect("a LockSpec has string keys only");
    let mut object = DynamicObject::new(&lock.name, &lock.api_resource())
        .data(serde_json::json!({ "spec": spec }));
    object.metadata.namespace = lock.namespace.clone();
    object.metadata.owner_references = owner.clone().map(|owner| vec![owner]);
    let api = lock.api(cluster.client.clone());
    let created =
        (api.create(&PostParams::default(), &object).await).map_err(|e| match status_code(&e) {
            Some(409) => {
                let scope = (lock.namespace.as_ref()).map(|ns| format!(" -n {ns}"));
                PluginError::AlreadyLocked(format!(
                    "{lock} already exists (see kubectl lock list{}; kubectl unlock removes it)",
                    scope.unwrap_or_default()
                ))
            }
            _ => cluster.failed(&e, format!("cannot create {lock}")),
        })?;
    if let Some(held) = &held {
        held.created.send_replace(Some(Created {
            api,
            key: lock.clone(),
            uid: created.metadata.uid.unwrap_or_default(),
        }));
    }
    let reason = (args.reason.as_ref()).map_or(String::new(), |r| format!(": {r}"));
    // An unenforced lock (--force-unenforced) can never be confirmed: do not wait for it.
    let confirmed = match args.wait && target.unenforced().is_none() {
        false => String::new(),
        true => {
            let probe = Probe::for_spec(&new);
            confirm::confirm(&cluster, &target, &lock, probe, args.timeout).await?
        }
    };
    let owned = (owner.as_ref())
        .map(|o| format!("; owned by {}", owner::short(o)))
        .unwrap_or_default();
    let summary = match &held {
        None => spec::summary(&new),
        Some(held) => format!(
            "{}; lease {}",
            spec::summary(&LockSpec {
                expires_at: None,
                ..new
            }),
            humantime::format_duration(held.lease)
        ),
    };
    let stdout = format!("locked {target} with {lock} ({summary}{owned}){reason}{confirmed}\n");
    Report::ok(stdout, notes)
}

/// The caller as the API server says (`kubectl auth whoami`), as the lock policy compares it.
async fn caller(cluster: &Cluster) -> Result<Holder, PluginError> {
    let review = Api::<SelfSubjectReview>::all(cluster.client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .map_err(|e| {
            cluster.failed(
                &e,
                "cannot tell who you are to hold the lock (kubectl auth whoami; --no-holder skips it)",
            )
        })?;
    match review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
    {
        Some(username) if !username.is_empty() => Ok(Holder::for_user(&username)),
        _ => Err(PluginError::Message(
            "the API server did not say who you are (kubectl auth whoami): lock with --no-holder"
                .to_owned(),
        )),
    }
}

/// `expiresAt` from `--for` (from `now`, whole seconds) or `--until` (in the future).
fn expiry(args: &LockArgs, now: Timestamp) -> Result<Option<Timestamp>, PluginError> {
    if let Some(duration) = args.duration {
        let seconds = i64::try_from(duration.as_secs()).unwrap_or(i64::MAX);
        let at = (seconds > 0)
            .then(|| Timestamp::from_second(now.as_second().saturating_add(seconds)).ok())
            .flatten();
        return at.map(Some).ok_or_else(|| {
            PluginError::Message(format!(
                "--for {}: must be at least 1s and end before the year 10000",
                humantime::format_duration(duration)
            ))
        });
    }
    match args.until {
        Some(until) if until <= now => Err(PluginError::Message(format!(
            "--until {until} is in the past (now is {})",
            Timestamp::from_second(now.as_second()).unwrap_or(now)
        ))),
        until => Ok(until),
    }
}

pub(super) async fn unlock(
    connection: &ConnectionArgs,
    words: &[String],
    no_nudge: bool,
) -> Result<Report, PluginError> {
    let cluster = Cluster::connect(connection).await?;
    let mut notes = vec![];
    let target = Target::resolve(&cluster, connection, words, &mut notes).await?;
    let lock = target.lock();
    let api = lock.api(cluster.client.clone());
    let no_lock = |why: String| PluginError::Message(format!("no lock on {target}{why}"));
    let existing = match api.get(&lock.name).await {
        Ok(existing) => existing,
        Err(e) if status_code(&e) == Some(404) => return Err(no_lock(String::new())),
        Err(e) => return Err(cluster.failed(&e, format!("cannot read {lock}"))),
    };
    let (lock_spec, note) = spec::read(&existing);
    notes.extend(note);
    let (group, plural) = (&target.resource.group, &target.resource.plural);
    if !decide::covers_resource(&lock_spec, group, plural, None) {
        let why = match spec::describe_covers(&lock.name, &lock_spec) {
            covered if covered == "no resource" => format!(" ({lock} covers no resource)"),
            covered => format!(" ({lock} covers {covered} only)"),
        };
        return Err(no_lock(why));
    }
    // Delete the lock that was checked, not one created since under the same name.
    let uid = existing.metadata.uid.clone();
    let params = DeleteParams::default().preconditions(Preconditions {
        uid,
        ..Default::default()
    });
    match api.delete(&lock.name, &params).await {
        Ok(_) => {
            if let Some(note) = after_unlock(&cluster, &target, no_nudge).await {
                notes.push(note);
            }
            Report::ok(format!("unlocked {target} (deleted {lock})\n"), notes)
        }
        Err(e) if status_code(&e) == Some(404) => Err(no_lock(String::new())),
        Err(e) => Err(match (&lock_spec.holder, status_code(&e)) {
            (Some(holder), Some(403)) => PluginError::Message(format!(
                "{lock} is held by {holder}: only its holder, or someone granted the \"unlock\" verb on it, may lift it (kubectl auth whoami says who you are): {}",
                detail(&e)
            )),
            _ => cluster.failed(&e, format!("cannot delete {lock}")),
        }),
    }
}

/// If the garbage collector was waiting to delete the object, a note, and unless `no_nudge`, a
/// prompt to look again at once.
async fn after_unlock(cluster: &Cluster, target: &Target, no_nudge: bool) -> Option<String> {
    let api = cluster.api(&target.resource.api_resource(), target.namespace.as_deref());
    let object = api.get(&target.name).await.ok()?;
    let waiting = collector::waiting(cluster, target, &object).await?;
    let waiting = format!("{target} is waiting for the garbage collector ({waiting})");
    if no_nudge {
        return Some(format!(
            "{waiting}: it goes at the collector's next retry, up to about 17 minutes after a \
             long lock (without --no-nudge, kubectl unlock prompts it)"
        ));
    }
    Some(match collector::prompt(cluster, target, &object).await {
        Ok(()) => format!("{waiting}: prompted it to look again now"),
        Err(e) => {
            format!("{waiting}: could not prompt it ({e}); it goes at the collector's next retry")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::cli::{Invocation, parse};

    fn args(flags: &[&str]) -> LockArgs {
        let argv = ["kubectl-lock", "cm/x"].iter().chain(flags);
        match parse(argv) {
            Ok(Invocation::Lock(cli)) => cli.lock,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn expiry_from_for_and_until() {
        let now: Timestamp = "2026-01-01T00:00:00.75Z".parse().expect("time");
        assert_eq!(expiry(&args(&[]), now).expect("none"), None);
        let two_hours = expiry(&args(&["--for", "2h"]), now).expect("valid");
        assert_eq!(
            two_hours.map(|t| t.to_string()).as_deref(),
            Some("2026-01-01T02:00:00Z")
        );
        let until = expiry(&args(&["--until", "2026-01-01T07:00:00+02:00"]), now).expect("valid");
        assert_eq!(
            until.map(|t| t.to_string()).as_deref(),
            Some("2026-01-01T05:00:00Z")
        );

        let past = expiry(&args(&["--until", "2025-12-31T23:00:00Z"]), now).expect_err("past");
        assert_eq!(
            past.to_string(),
            "--until 2025-12-31T23:00:00Z is in the past (now is 2026-01-01T00:00:00Z)"
        );
        let zero = expiry(&args(&["--for", "0s"]), now).expect_err("zero");
        assert!(
            zero.to_string()
                .starts_with("--for 0s: must be at least 1s"),
            "{zero}"
        );
    }
}
