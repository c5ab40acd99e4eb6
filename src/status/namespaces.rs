//! The labels of every namespace, for the status of locks under a registration the operator
//! limits to some namespaces (`manifests cluster --namespace-selector`): a Lock in a namespace
//! it does not select is never sent to the webhook, and its status must say so.
//!
//! One metadata-only list-and-watch of namespaces (kube-runtime's `watcher` of
//! `PartialObjectMeta`: names and labels, never specs), started only once the registration
//! carries requirements of the operator's. Without them no label matters, and an identity
//! granted less (an upgrade that did not apply `manifests cluster` again) is never asked for
//! more. A re-list replaces the labels at its end, never half-way.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::NamespaceLabels;
use crate::registration::Registered;
use crate::retry::{self, LastError};

/// The RBAC rule the watch needs: `list` and `watch` on namespaces (their metadata is all it
/// reads, but RBAC has no metadata-only verb).
pub fn rbac_rule() -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["namespaces".to_owned()]),
        verbs: ["list", "watch"].map(str::to_owned).to_vec(),
        ..PolicyRule::default()
    }
}

/// Follows the namespaces' labels once `registered` carries requirements of the operator's:
/// the receiver sees every change; the future runs until dropped or the receiver is gone.
pub fn follow(
    client: kube::Client,
    mut registered: watch::Receiver<Registered>,
) -> (
    watch::Receiver<NamespaceLabels>,
    impl Future<Output = ()> + Send + 'static,
) {
    let (tx, rx) = watch::channel(NamespaceLabels::default());
    let run = async move {
        loop {
            if !registered.borrow_and_update().namespaces.is_everything() {
                break;
            }
            tokio::select! {
                changed = registered.changed() => if changed.is_err() { return },
                () = tx.closed() => return,
            }
        }
        info!(
            "the registration limits locks to selected namespaces: watching the namespaces' labels"
        );
        // Metadata only: an `Api` of `PartialObjectMeta` asks for nothing else.
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
        let mut events = watcher(api, watcher::Config::default())
            .backoff(retry::watcher())
            .boxed();
        let mut state = Labels::default();
        let mut last_error = LastError::default();
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(event)) => {
                        // `Init` comes before each re-list, before it is tried: not a success.
                        if !matches!(event, watcher::Event::Init) {
                            last_error.clear();
                        }
                        if state.apply(event) {
                            tx.send_replace(state.published.clone());
                        }
                    }
                    Some(Err(error)) => {
                        let refused = retry::watcher_refusal(&error);
                        let error = retry::error_chain(&error);
                        if !last_error.is_new(&error) {
                            debug!(%error, "watching namespaces failed again");
                        } else if refused {
                            warn!(%error, "watching namespaces failed; retrying with backoff (the webhook's identity needs list and watch on namespaces: apply `manifests cluster` again)");
                        } else {
                            warn!(%error, "watching namespaces failed; retrying with backoff");
                        }
                    }
                    None => return,
                },
                () = tx.closed() => return,
            }
        }
    };
    (rx, run)
}

/// What the watch has shown: the labels published, and those of a re-list in progress.
#[derive(Default)]
struct Labels {
    published: NamespaceLabels,
    /// The namespaces listed so far by a re-list, published at its end.
    listing: Option<imbl::OrdMap<String, Arc<BTreeMap<String, String>>>>,
}

impl Labels {
    /// Takes in one watch event; true when what is published changed.
    fn apply(&mut self, event: watcher::Event<PartialObjectMeta<Namespace>>) -> bool {
        let entry = |meta: PartialObjectMeta<Namespace>| {
            let name = meta.metadata.name.unwrap_or_default();
            (name, Arc::new(meta.metadata.labels.unwrap_or_default()))
        };
        match event {
            watcher::Event::Init => {
                self.listing = Some(imbl::OrdMap::new());
                false
            }
            watcher::Event::InitApply(meta) => {
                let (name, labels) = entry(meta);
                self.listing
                    .get_or_insert_with(imbl::OrdMap::new)
                    .insert(name, labels);
                false
            }
            watcher::Event::InitDone => {
                let labels = self.listing.take().unwrap_or_default();
                let listed = NamespaceLabels {
                    listed: true,
                    labels,
                };
                let changed = listed != self.published;
                self.published = listed;
                changed
            }
            watcher::Event::Apply(meta) => {
                let (name, labels) = entry(meta);
                // Most updates of a namespace (finalizers, status) leave its labels alone.
                let same = self.published.labels.get(&name) == Some(&labels);
                if !same {
                    self.published.labels.insert(name, labels);
                }
                !same
            }
            watcher::Event::Delete(meta) => {
                let (name, _) = entry(meta);
                self.published.labels.remove(&name).is_some()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn namespace(name: &str, labels: &[(&str, &str)]) -> PartialObjectMeta<Namespace> {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(
                    (labels.iter())
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            _phantom: std::marker::PhantomData,
        }
    }

    fn label(state: &Labels, ns: &str, key: &str) -> Option<String> {
        state.published.labels.get(ns)?.get(key).cloned()
    }

    #[test]
    fn a_list_is_published_whole_and_then_each_change_of_labels() {
        let mut state = Labels::default();
        assert!(!state.apply(watcher::Event::Init));
        assert!(!state.apply(watcher::Event::InitApply(namespace(
            "a",
            &[("lockable", "true")]
        ))));
        assert!(!state.published.listed, "half a list is not published");
        assert!(state.apply(watcher::Event::InitDone));
        assert!(state.published.listed);
        assert_eq!(label(&state, "a", "lockable").as_deref(), Some("true"));

        // The same labels again (a finalizer, a status): nothing to publish.
        assert!(!state.apply(watcher::Event::Apply(namespace(
            "a",
            &[("lockable", "true")]
        ))));
        assert!(state.apply(watcher::Event::Apply(namespace(
            "a",
            &[("lockable", "false")]
        ))));
        assert_eq!(label(&state, "a", "lockable").as_deref(), Some("false"));
        assert!(state.apply(watcher::Event::Apply(namespace("b", &[]))));
        assert!(state.apply(watcher::Event::Delete(namespace("b", &[]))));
        assert!(!state.apply(watcher::Event::Delete(namespace("b", &[]))));

        // A re-list: the labels stay as they were until it ends, then are replaced whole.
        assert!(!state.apply(watcher::Event::Init));
        assert!(!state.apply(watcher::Event::InitApply(namespace("c", &[]))));
        assert!(state.published.labels.contains_key("a"));
        assert!(state.apply(watcher::Event::InitDone));
        let names: Vec<_> = state.published.labels.keys().cloned().collect();
        assert_eq!(names, ["c"]);
    }

    #[test]
    fn the_rule_lists_and_watches_namespaces_only() {
        let rule = rbac_rule();
        assert_eq!(rule.verbs, ["list", "watch"]);
        assert_eq!(
            rule.resources.as_deref(),
            Some(&["namespaces".to_owned()][..])
        );
        assert_eq!(rule.api_groups.as_deref(), Some(&[String::new()][..]));
    }
}
