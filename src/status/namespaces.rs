//! The labels of every namespace, from one metadata-only watcher started only once the
//! registration carries the operator's namespace selector requirements: a Lock in a namespace it
//! does not select is never sent to the webhook, and its status must say so.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, reflector, watcher};
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
        tokio::select! {
            selected = registered.wait_for(|r| r.namespaces != Default::default()) => {
                if selected.is_err() {
                    return;
                }
            }
            () = tx.closed() => return,
        }
        info!(
            "the registration limits locks to selected namespaces: watching the namespaces' labels"
        );
        // Metadata only: an `Api` of `PartialObjectMeta` asks for nothing else. The store takes
        // a re-list in whole at its end, never half-way.
        let api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
        let (store, writer) = reflector::store();
        let mut events = reflector(writer, watcher(api, watcher::Config::default()))
            .backoff(retry::watcher())
            .boxed();
        let mut last_error = LastError::default();
        loop {
            tokio::select! {
                event = events.next() => match event {
                    // `Init` comes before each re-list, before it is tried: not a success.
                    Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
                    Some(Ok(_)) => {
                        last_error.clear();
                        let labels = (store.state().iter())
                            .map(|meta| {
                                let name = meta.metadata.name.clone().unwrap_or_default();
                                (name, Arc::new(meta.metadata.labels.clone().unwrap_or_default()))
                            })
                            .collect();
                        let labels = NamespaceLabels { listed: true, labels };
                        // Most updates of a namespace (finalizers, status) leave its labels alone.
                        if *tx.borrow() != labels {
                            tx.send_replace(labels);
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

#[cfg(test)]
mod tests {
    use super::*;

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
