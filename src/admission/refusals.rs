//! A record per refusing (or Warn-mode) lock, queued without waiting for the event writer
//! ([`crate::events`]) to turn it into a Kubernetes Event.

use tokio::sync::mpsc;

use super::decide::{Outcome, Verdict};
use super::request::AdmissionRequest;
use crate::api::LockKey;
use crate::locks::{LockRef, LockSet};
use crate::metrics::{DropLabels, EnforcementMetrics, EventLabels, RefusalLabels};

pub const BLOCKED: &str = "Blocked";
pub const WOULD_BLOCK: &str = "WouldBlock";
/// An Event's note is at most 1 KiB.
const MAX_NOTE_BYTES: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    Blocked,
    WouldBlock,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Blocked => BLOCKED,
            Reason::WouldBlock => WOULD_BLOCK,
        }
    }
}

/// One refused (or Warn-mode) request, as the event writer needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusalEvent {
    pub lock: LockKey,
    pub reason: Reason,
    /// `UPDATE`, `DELETE`, or `CREATE` (of `pods/eviction`).
    pub operation: &'static str,
    pub note: String,
}

/// The admission path's end of the event queue. Cloning shares the queue.
#[derive(Clone, Debug)]
pub struct EventSink {
    tx: mpsc::Sender<RefusalEvent>,
    metrics: EnforcementMetrics,
}

impl EventSink {
    /// A queue of `capacity` records and its receiving end, for [`crate::events::run`].
    pub fn channel(
        capacity: usize,
        metrics: EnforcementMetrics,
    ) -> (EventSink, mpsc::Receiver<RefusalEvent>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (EventSink { tx, metrics }, rx)
    }

    /// Queues `refusal` without waiting; a full queue drops it and counts the drop.
    pub fn record(&self, refusal: RefusalEvent) {
        let reason = refusal.reason.as_str();
        let lock = RefusalLabels {
            reason,
            namespace: refusal.lock.namespace.clone().unwrap_or_default(),
            name: refusal.lock.name.clone(),
        };
        self.metrics.refusals.get_or_create(&lock).inc();
        match self.tx.try_send(refusal) {
            Ok(()) => self
                .metrics
                .refusal_events
                .get_or_create(&EventLabels { reason })
                .inc(),
            Err(_) => self
                .metrics
                .refusal_events_dropped
                .get_or_create(&DropLabels {
                    cause: "queue_full",
                })
                .inc(),
        };
    }

    /// Records what `verdict` says about `req`: a Blocked refusal for each lock that refused it,
    /// a WouldBlock for each Warn-mode lock that would have. `scope` and `contents` are the lock
    /// sets the verdict was decided from. Dry runs are skipped.
    pub fn record_verdict(
        &self,
        req: &AdmissionRequest,
        verdict: &Verdict,
        scope: &LockSet,
        contents: Option<&LockSet>,
    ) {
        if req.dry_run == Some(true) {
            return;
        }
        for (lock, reason) in refusing_locks(verdict, scope, contents) {
            let key = lock.key();
            let changed = (verdict.changed.iter())
                .find(|(k, _)| *k == key)
                .map(|(_, path)| path.as_str());
            self.record(refusal(req, lock, reason, changed));
        }
    }
}

/// The locks a verdict names as refusing (Blocked) or warning (WouldBlock), found by name in
/// the sets it was decided from.
pub fn refusing_locks<'a>(
    verdict: &Verdict,
    scope: &'a LockSet,
    contents: Option<&'a LockSet>,
) -> Vec<(&'a LockRef, Reason)> {
    let mut found = vec![];
    let sets = || std::iter::once(scope).chain(contents);
    let named = |keys: &[LockKey], lock: &LockRef| {
        keys.iter()
            .any(|key| key.name == lock.name && key.namespace == lock.namespace)
    };
    if verdict.outcome == Outcome::Denied {
        for lock in sets().flat_map(LockSet::iter) {
            if named(&verdict.locks, lock) {
                found.push((lock, Reason::Blocked));
            }
        }
    }
    for lock in scope.iter() {
        if named(&verdict.warned, lock) {
            found.push((lock, Reason::WouldBlock));
        }
    }
    found
}

/// The record of `req` refused (or warned) by `lock`, naming the field that `changed`, if known.
fn refusal(
    req: &AdmissionRequest,
    lock: &LockRef,
    reason: Reason,
    changed: Option<&str>,
) -> RefusalEvent {
    let operation = req.operation.as_str();
    let mut what = format!("{operation} of {}", req.resource_path());
    let name = req.object_name().unwrap_or_default();
    what.push_str(&format!(" \"{}\"", crate::api::escape(name)));
    if let Some(ns) = req.object_namespace() {
        what.push_str(&format!(" in namespace \"{ns}\""));
    }
    if let Some(path) = changed {
        what.push_str(&format!(" ({path} changed)"));
    }
    let user = crate::api::escape(&req.user_info.username);
    let note = match reason {
        Reason::Blocked => format!("{what} by {user} refused"),
        Reason::WouldBlock => format!("{what} by {user} allowed with a warning (mode Warn)"),
    };
    RefusalEvent {
        lock: lock.key(),
        reason,
        operation,
        note: clip(note),
    }
}

fn clip(mut text: String) -> String {
    if text.len() > MAX_NOTE_BYTES {
        let mut cut = MAX_NOTE_BYTES - 3;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests;
