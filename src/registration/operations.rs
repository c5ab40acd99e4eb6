//! The entries that send CREATE and CONNECT to the webhook, only while a live Lock asks for the
//! operation, naming only those Locks' keys and namespaces. Invariant: every other field is copied
//! from the base entry of the same scope.

use std::collections::BTreeSet;

use k8s_openapi::api::admissionregistration::v1::{RuleWithOperations, ValidatingWebhook};
use k8s_openapi::jiff::Timestamp;

use super::conditions::{self, Clauses, ConditionsPlan, NarrowingBounds, Scope};
use super::{
    CLUSTER_ENTRY, MissingEntry, NAMESPACED_ENTRY, RegisteredScope, copies, expressions,
    is_extra_entry, selected, template,
};
use crate::api::{LockKey, LockOperation};
use crate::locks::{LockKind, LockRef};

pub const CREATE_ENTRY: &str = "create.objectlock.dev";
pub const CLUSTER_CREATE_ENTRY: &str = "cluster-create.objectlock.dev";
pub const CONNECT_ENTRY: &str = "connect.objectlock.dev";
/// Every way into a pod through the API server.
pub const CONNECT_SUBRESOURCES: [&str; 4] =
    ["pods/exec", "pods/attach", "pods/portforward", "pods/proxy"];

/// True for every entry this module writes, chunks included.
pub fn is_operation_entry(name: &str) -> bool {
    [CREATE_ENTRY, CLUSTER_CREATE_ENTRY, CONNECT_ENTRY]
        .iter()
        .any(|base| name == *base || is_extra_entry(name, base))
}

/// One operation: the live locks asking for it, and their conditions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationPlan {
    pub keys: BTreeSet<LockKey>,
    pub plan: ConditionsPlan,
}

impl OperationPlan {
    pub fn registered(&self) -> RegisteredScope {
        match &self.plan.scope {
            Scope::Narrow { .. } => RegisteredScope::Narrow(self.keys.clone()),
            Scope::Broad(reason) => RegisteredScope::Broad(reason.to_string()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationsPlan {
    pub create: OperationPlan,
    /// Namespaced Locks only: pods are namespaced.
    pub connect: OperationPlan,
}

pub fn plan<'a>(
    locks: impl IntoIterator<Item = &'a LockRef>,
    now: Timestamp,
    limits: &NarrowingBounds,
) -> OperationsPlan {
    let live: Vec<&LockRef> = (locks.into_iter())
        .filter(|l| !l.spec.is_expired(now))
        .collect();
    let asking = |clauses, operation, namespaced_only: bool| {
        let locks: Vec<&LockRef> = (live.iter().copied())
            .filter(|l| l.spec.operations().contains(&operation))
            .filter(|l| !namespaced_only || (l.kind == LockKind::Lock && l.namespace.is_some()))
            .collect();
        OperationPlan {
            keys: locks.iter().map(|l| l.key()).collect(),
            plan: conditions::plan(clauses, locks, now, limits),
        }
    };
    OperationsPlan {
        create: asking(Clauses::Names, LockOperation::Create, false),
        connect: asking(Clauses::Connect, LockOperation::Connect, true),
    }
}

/// The entries `plan` asks for, copies of the base entries; none while no lock asks.
pub fn webhooks(
    current: &[ValidatingWebhook],
    plan: &OperationsPlan,
) -> Result<Vec<ValidatingWebhook>, MissingEntry> {
    let mut out = Vec::new();
    let create = ("CREATE", "*", "*", &["*"][..]);
    let connect = ("CONNECT", "", "v1", &CONNECT_SUBRESOURCES[..]);
    for (base, part, (operation, groups, versions, resources), namespaced) in [
        (CREATE_ENTRY, &plan.create, create, true),
        (CONNECT_ENTRY, &plan.connect, connect, true),
        (CLUSTER_CREATE_ENTRY, &plan.create, create, false),
    ] {
        if !(part.keys.iter()).any(|k| k.namespace.is_some() == namespaced) {
            continue;
        }
        let rules = vec![RuleWithOperations {
            operations: Some(vec![operation.to_owned()]),
            api_groups: Some(vec![groups.to_owned()]),
            api_versions: Some(vec![versions.to_owned()]),
            resources: Some(resources.iter().map(|r| (*r).to_owned()).collect()),
            scope: Some(if namespaced { "Namespaced" } else { "Cluster" }.to_owned()),
        }];
        let of = [CLUSTER_ENTRY, NAMESPACED_ENTRY][usize::from(namespaced)];
        let template = template(current, of)?;
        let narrowing = move |index| namespaced.then(|| selected(&part.plan, index));
        let exprs = expressions(&part.plan, namespaced);
        let entries = copies(template, base, exprs, narrowing);
        out.extend(entries.map(|mut entry| {
            entry.rules = Some(rules.clone());
            entry
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
