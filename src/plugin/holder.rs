//! Who the caller is, for a lock's `spec.holder`: the API server's own answer (`kubectl auth
//! whoami`), so the holder written is exactly what the lock policy compares on create.

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};

use super::{Cluster, PluginError};
use crate::api::Holder;

/// The caller as a holder: its ServiceAccount, else its user name.
pub(super) async fn caller(cluster: &Cluster) -> Result<Holder, PluginError> {
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
        _ => Err(PluginError::Usage(
            "the API server did not say who you are (kubectl auth whoami): lock with --no-holder"
                .to_owned(),
        )),
    }
}
