//! The scenarios, one module per README promise group. Each creates its own namespaces.

mod audit;
mod cluster_locks;
mod collections;
mod collector;
mod command;
mod confirm;
mod create_connect;
mod enforcement;
mod excluded;
mod fields;
mod latency;
mod lookup_allow;
mod lookup_error;
mod metrics;
mod mtls;
mod namespaces;
mod narrowing;
mod operations;
mod opt_in;
mod owned;
mod paths;
mod plugin;
mod pods;
mod registration_cost;
mod restart;
mod rights;
mod rotation;
mod scale;
mod sigterm;
mod silent_apiserver;
mod spec;
mod static_registration;
mod terminating;
mod two_apiservers;
mod unconfirmed;
mod unreadable;
mod warn_events;
mod watch_forbidden;
mod writes;

use crate::suite::Scenario;

/// Every scenario, in the order they start.
pub fn all() -> Vec<Scenario> {
    let parallel = |name, run| Scenario {
        name,
        exclusive: false,
        run,
    };
    let alone = |name, run| Scenario {
        name,
        exclusive: true,
        run,
    };
    vec![
        parallel("writes", writes::run),
        parallel("deletecollection", collections::run),
        parallel("pods", pods::run),
        parallel("scale", scale::run),
        parallel("terminating", terminating::run),
        parallel("path-status-write", fields::status_write),
        parallel("fields-deployment", fields::deployment_template),
        parallel("fields-custom-resource", fields::virtual_machine),
        parallel("fields-unchanged-writes", fields::unchanged_writes),
        parallel("fields-except", fields::except_annotations),
        parallel("fields-validation", fields::validation),
        parallel("namespace-deletion", namespaces::run),
        parallel("cluster-locks", cluster_locks::run),
        parallel("collector", collector::run),
        parallel("create-and-connect", create_connect::run),
        parallel("spec-operations", spec::operations),
        parallel("spec-resources", spec::resources),
        parallel("spec-selector", spec::selector),
        parallel("spec-exempt", spec::exempt),
        parallel("spec-expiry", spec::expiry),
        parallel("spec-warn", spec::warn),
        parallel("spec-validation", spec::validation),
        parallel("combining", spec::combining),
        parallel("plugin", plugin::run),
        parallel("plugin-owned", owned::run),
        parallel("plugin-command", command::run),
        parallel("plugin-confirm", confirm::run),
        parallel("excluded-namespaces", excluded::run),
        parallel("enforcement-visible", enforcement::run),
        parallel("warn-events", warn_events::run),
        parallel("metrics", metrics::run),
        parallel("lookup-error-allow", lookup_allow::run),
        parallel("plugin-unconfirmed", unconfirmed::run),
        parallel("path-proxy-port", paths::proxy_port),
        parallel("path-namespace-nothing", paths::namespace_nothing),
        parallel("path-reason-control", paths::reason_control),
        parallel("path-crd-delete", paths::crd_delete),
        // Alone, so that its figures are not those of a loaded machine.
        alone("lock-rights", rights::run),
        alone("latency", latency::run),
        alone("narrowing", narrowing::run),
        alone("narrowing-upgrade", narrowing::upgrade),
        // Alone: it counts every CREATE sent to the webhook.
        alone("narrowing-operations", operations::run),
        alone("registration-cost", registration_cost::run),
        alone("apiserver-restart", restart::run),
        // Alone: it stops the API server for a few seconds.
        alone("silent-apiserver", silent_apiserver::run),
        alone("audit", audit::run),
        // Alone: it replaces the webhook's certificate files and its registration's caBundle.
        alone("cert-rotation", rotation::run),
        alone("mtls", mtls::run),
        // Alone: it stops the webhook for a few seconds.
        alone("sigterm-withdraw", sigterm::run),
        alone("lookup-error", lookup_error::run),
        alone("watch-forbidden", watch_forbidden::run),
        // Alone: it limits the registration to labelled namespaces for a while.
        alone("namespace-opt-in", opt_in::run),
        // Alone: it widens the Lock CRD for a while.
        alone("unreadable-lock", unreadable::run),
        // Alone: a second API server and webhook instance, which every Lock's status names.
        alone("two-apiservers", two_apiservers::run),
        // Alone: it stops the webhook, and runs it with a lower registration.max_names.
        alone("path-tenant-widening", paths::tenant_widening),
        // Alone: it restarts the API server with the static registration and removes the API one.
        alone("static-registration", static_registration::run),
    ]
}
