//! Who may lock and who may unlock: the ValidatingAdmissionPolicy of policy.yaml on the lock
//! resources (no escalation; changing a lock is unlocking it; held locks), with the rights a lock
//! needs generated here; its binding; the unlock role. Invariant: it never matches the status
//! subresource, so the webhook's status writes pass.

use serde_json::{Value, json};

use crate::admission::subresources;
use crate::api;

/// Name of the policy and of its binding.
pub const POLICY_NAME: &str = "locks.objectlock.dev";
/// The custom verb that lifts a held lock: a break-glass right, like RBAC's own `escalate`.
pub const UNLOCK_VERB: &str = "unlock";
/// Name of the example ClusterRole granting [`UNLOCK_VERB`].
pub const UNLOCK_ROLE: &str = "kube-object-lock-unlock";

/// How many permissions one lock may need checked: each check is one policy variable, and the
/// API server caps the cost of a whole policy evaluation. A pod lock needs 8, a Deployment's 5.
const MAX_CHECKS: usize = 16;

/// Resources of the API server whose `scale` subresource changes them. A custom resource's scale
/// subresource cannot be known in advance: locking one needs the rights on the resource only.
const SCALED: [&str; 4] = [
    "deployments",
    "replicasets",
    "statefulsets",
    "replicationcontrollers",
];

/// The pod subresources a CONNECT lock closes.
const CONNECT_SUBRESOURCES: [&str; 4] = ["exec", "attach", "portforward", "proxy"];

/// CEL for one entry of `variables.needed`: `[verb, group, resource, subresource]`.
fn check(verb: &str, resource: &str, subresource: &str) -> String {
    format!("['{verb}', string(p[0]), {resource}, '{subresource}']")
}

/// The rights a lock needs on one `[group, resource]` pair `p` of what it covers: the verbs of
/// its operations on the resource, and on each subresource of that resource that changes it
/// (on `*`, RBAC's own wildcard covers the subresources).
fn needed_for_pair() -> String {
    let mut parts = vec![
        format!(
            "('UPDATE' in variables.ops ? [{}, {}] : [])",
            check("update", "string(p[1])", ""),
            check("patch", "string(p[1])", "")
        ),
        // An eviction is a CREATE of pods/eviction: a DELETE lock naming it takes that away.
        "('DELETE' in variables.ops ? [[p[1] == 'pods/eviction' ? 'create' : 'delete', \
         string(p[0]), string(p[1]), '']] : [])"
            .to_owned(),
    ];
    for sub in subresources::CHANGING {
        let resources: &[&str] = match sub.resource {
            "*" if sub.name == "scale" => &SCALED,
            "*" => continue,
            resource => &[resource][..],
        };
        let list = resources
            .iter()
            .map(|r| format!("'{r}'"))
            .collect::<Vec<_>>()
            .join(", ");
        parts.push(format!(
            "('UPDATE' in variables.ops && p[1] in [{list}] ? [{}, {}] : [])",
            check("update", "string(p[1])", sub.name),
            check("patch", "string(p[1])", sub.name)
        ));
    }
    // An eviction deletes a pod without a DELETE.
    parts.push(format!(
        "('DELETE' in variables.ops && p[1] == 'pods' ? [{}] : [])",
        check("create", "string(p[1])", "eviction")
    ));
    parts.push(format!(
        "('CREATE' in variables.ops ? [{}] : [])",
        check("create", "string(p[1])", "")
    ));
    // CONNECT is authorized as `create` on the pod's subresource (the API server asks the same
    // verb of a WebSocket GET since 1.35); it concerns pods only, whatever else the lock covers.
    let connect: Vec<String> = CONNECT_SUBRESOURCES
        .iter()
        .map(|sub| format!("['create', '', 'pods', '{sub}']"))
        .collect();
    let named: Vec<String> = CONNECT_SUBRESOURCES
        .iter()
        .map(|sub| format!("'pods/{sub}'"))
        .collect();
    parts.push(format!(
        "('CONNECT' in variables.ops && p[0] in ['', '*'] && p[1] in ['pods', '*'] ? [{}] : [])",
        connect.join(", ")
    ));
    parts.push(format!(
        "('CONNECT' in variables.ops && p[0] in ['', '*'] && p[1] in [{}] ? [['create', '', string(p[1]), '']] : [])",
        named.join(", ")
    ));
    parts.join(" + ")
}

/// One validation per right a lock may need: the API server caps each expression's cost, and one
/// authorizer check costs about a third of the cap (three in one expression already exceed it).
/// The message of the first right missing names it, without a check of its own.
fn escalation_checks() -> Vec<Value> {
    let mut out = vec![json!({
        "expression": format!("!variables.escalates || size(variables.needed) <= {MAX_CHECKS}"),
        "messageExpression": format!(
            "variables.lockText + ' needs ' + string(size(variables.needed)) + ' permissions checked, \
             more than the {MAX_CHECKS} a lock may need: split it into several locks'"
        ),
        "reason": "Forbidden",
    })];
    for i in 0..MAX_CHECKS {
        let c = |k: usize| format!("string(variables.needed[{i}][{k}])");
        let (verb, group, resource, sub) = (c(0), c(1), c(2), c(3));
        let what = format!(
            "({resource} == '*' ? 'any resource' + ({group} == '*' ? '' : ' of API group \"' + {group} + '\"') + \
               (variables.coveredName == '' ? '' : ' named \"' + variables.coveredName + '\"') : \
             {resource} + ({sub} == '' ? '' : '/' + {sub}) + ({group} == '' ? '' : {group} == '*' ? ' (any API group)' : '.' + {group}) + \
               (variables.coveredName == '' ? ' (any name: the lock has a selector)' : ' \"' + string(variables.coveredName) + '\"'))"
        );
        out.push(json!({
            "expression": format!(
                "!variables.escalates || size(variables.needed) <= {i} || \
                 authorizer.group({group}).resource({resource}).subresource({sub})\
                 .namespace(variables.lockNamespace).name(variables.coveredName).check({verb}).allowed()"
            ),
            "messageExpression": format!(
                "'user \"' + request.userInfo.username + '\" may not ' + {verb} + ' ' + {what} + \
                 (variables.lockNamespace == '' ? '' : ' in namespace \"' + variables.lockNamespace + '\"') + \
                 ', so may not lock it' + (has(object.spec.resources) ? '' : \
                 ' (a lock without spec.resources covers every resource: name the resource, as kubectl lock does)')"
            ),
            "reason": "Forbidden",
        }));
    }
    out
}

/// policy.yaml with the rights a lock needs filled in and checked.
pub fn policy() -> Value {
    let template = include_str!("policy.yaml").replace("{needed}", &needed_for_pair());
    let mut policy: Value = serde_saphyr::from_str(&template).expect("policy.yaml is valid");
    let validations = &mut policy["spec"]["validations"];
    let mut checks = escalation_checks();
    checks.extend(validations.as_array().into_iter().flatten().cloned());
    *validations = Value::Array(checks);
    policy
}

/// The binding that makes the policy refuse (every namespace, every lock).
pub fn binding() -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {
            "name": POLICY_NAME,
            "labels": {"app.kubernetes.io/name": super::NAME},
        },
        "spec": {
            "policyName": POLICY_NAME,
            "validationActions": ["Deny"],
        },
    })
}

/// An example ClusterRole, not bound, for administrators who must be able to lift anyone's lock.
pub fn unlock_role() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {
            "name": UNLOCK_ROLE,
            "labels": {"app.kubernetes.io/name": super::NAME},
        },
        "rules": [{
            "apiGroups": [api::GROUP],
            "resources": [api::LOCKS, api::CLUSTER_LOCKS],
            "verbs": ["get", "list", "delete", UNLOCK_VERB],
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rights `needed_for_pair` asks for a lock of `ops` covering `[group, resource]`, as
    /// `verb group resource/subresource`.
    fn needed(ops: &[&str], pair: [&str; 2]) -> Vec<String> {
        let expression = needed_for_pair();
        let program = cel::Program::compile(&expression).expect("compiles");
        let mut context = cel::Context::default();
        for (name, value) in [("p", json!(pair)), ("variables", json!({ "ops": ops }))] {
            let value = cel::to_value(value).expect("value");
            context.add_variable(name, value).expect("variable");
        }
        let cel::Value::List(checks) = program.execute(&context).expect("evaluates") else {
            panic!("not a list")
        };
        (checks.iter())
            .map(|check| {
                let cel::Value::List(parts) = check else {
                    panic!("not a list: {check:?}")
                };
                let part = |i: usize| match &parts[i] {
                    cel::Value::String(s) => s.to_string(),
                    other => panic!("not a string: {other:?}"),
                };
                let sub = part(3);
                let sub = if sub.is_empty() {
                    sub
                } else {
                    format!("/{sub}")
                };
                format!("{} {} {}{sub}", part(0), part(1), part(2))
            })
            .collect()
    }

    #[test]
    fn update_and_delete_need_the_rights_the_api_server_asks_for_them() {
        // PATCH changes through a subresource as UPDATE does; an eviction is a create.
        assert_eq!(
            needed(&["UPDATE", "DELETE"], ["", "pods"]),
            [
                "update  pods",
                "patch  pods",
                "delete  pods",
                "update  pods/ephemeralcontainers",
                "patch  pods/ephemeralcontainers",
                "update  pods/resize",
                "patch  pods/resize",
                "create  pods/eviction",
            ]
        );
        assert_eq!(
            needed(&["UPDATE", "DELETE"], ["apps", "deployments"]),
            [
                "update apps deployments",
                "patch apps deployments",
                "delete apps deployments",
                "update apps deployments/scale",
                "patch apps deployments/scale",
            ]
        );
        assert_eq!(
            needed(&["DELETE"], ["", "pods/eviction"]),
            ["create  pods/eviction"]
        );
        assert_eq!(
            needed(&["DELETE"], ["", "configmaps"]),
            ["delete  configmaps"]
        );
        // On every resource, RBAC's wildcard covers the subresources.
        assert_eq!(
            needed(&["UPDATE", "DELETE"], ["*", "*"]),
            ["update * *", "patch * *", "delete * *"]
        );
        // Within the cap, with every operation.
        assert!(
            needed(&["CREATE", "CONNECT", "UPDATE", "DELETE"], ["", "pods"]).len() <= MAX_CHECKS
        );
    }

    #[test]
    fn create_and_connect_need_the_rights_the_api_server_asks_for_them() {
        assert_eq!(
            needed(&["CREATE"], ["apps", "deployments"]),
            ["create apps deployments"]
        );
        let connect = [
            "create  pods/exec",
            "create  pods/attach",
            "create  pods/portforward",
            "create  pods/proxy",
        ];
        assert_eq!(needed(&["CONNECT"], ["", "pods"]), connect);
        // Every resource includes pods; a lock on Deployments has no pod to connect to.
        assert_eq!(needed(&["CONNECT"], ["*", "*"]), connect);
        assert!(needed(&["CONNECT"], ["apps", "deployments"]).is_empty());
        assert_eq!(
            needed(&["CONNECT"], ["", "pods/exec"]),
            ["create  pods/exec"]
        );
        // The default operations ask for neither.
        let default = needed(&["UPDATE", "DELETE"], ["", "pods"]);
        assert!(
            default
                .iter()
                .all(|c| !c.starts_with("create") || c.ends_with("/eviction")),
            "{default:?}"
        );
        assert_eq!(
            needed(&["CREATE", "CONNECT", "UPDATE", "DELETE"], ["", "pods"]).len(),
            default.len() + 1 + connect.len()
        );
    }
}
