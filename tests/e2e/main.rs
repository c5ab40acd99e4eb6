//! End-to-end suite: the project's binaries against a real kube-apiserver.
//!
//! It installs the CRDs, makes certificates, starts `kube-object-lock serve` on
//! `127.0.0.1:18443` (metrics on `127.0.0.1:18444`) with a ServiceAccount identity of its own,
//! registers it with the output of `manifests cluster`, and checks the README's promises
//! through kubectl and the REST API, each scenario in its own namespace. What only a real API server can show is the point: which
//! requests the admission chain sends (subresources, evictions, DELETECOLLECTION items, dry
//! runs, server-side apply), the CEL `matchConditions`, how the registration takes effect, what
//! survives an API server restart, and the API server's side of mTLS.
//!
//! Settings (environment):
//! - `KOL_E2E_KUBECONFIG`: the cluster. Unset: `~/.cache/control-plane/kubeconfig` when that file
//!   exists. Neither, or no answer on `/readyz`: one line `e2e: skipped: <reason>`, and a pass.
//! - `KOL_E2E_BIN_DIR`: take `kube-object-lock` and `kubectl-lock` from there (e.g.
//!   `target/release`) instead of the binaries cargo built for this test.
//! - `KOL_E2E_KUBECTL`: the kubectl binary (else the local control plane's when that is the
//!   cluster, else `kubectl` on PATH, else the control plane's).
//! - `KOL_E2E_WEBHOOK=external`: a webhook is already running and registered (the kind setup);
//!   only the lock checks run.
//! - `KOL_E2E_REQUIRE=1`: a cluster is known to be there (`.ci/run` sets it after building the
//!   local control plane): a suite that cannot run fails instead of skipping.
//! - `KOL_E2E_OUTAGE_SECONDS`: how long a restarted API server stays down (default 0), e.g. 60
//!   to see how `apiserver-restart` holds after a long outage.
//! - `KOL_E2E_TRIES`: lock-to-enforcement samples (default 20). `KOL_E2E_JOBS`: scenarios run at
//!   once (default 4).
//!
//! A scenario that restarts or stops the API server or adds a second one (restart, mTLS, silent
//! API server, two API servers, static registration) needs the local control plane's scripts or
//! processes and runs alone, after the others. Arguments: a substring of `e2e::<scenario>` selects scenarios;
//! `--list` lists them; libtest's flags are accepted and ignored.
#![forbid(unsafe_code)]

mod env;
mod harness;
mod kubectl;
mod node;
mod relay;
mod rest;
mod scenarios;
mod suite;
mod users;
mod webhook;

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut list = false;
    let mut filters = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--list" => list = true,
            // libtest flags that take a value as the next word.
            "--test-threads" | "--color" | "--format" | "--logfile" | "--skip" | "-Z" => {
                args.next();
            }
            flag if flag.starts_with('-') => {}
            filter => filters.push(filter.to_owned()),
        }
    }
    let all = scenarios::all();
    if list {
        for s in &all {
            println!("{}: test", s.name);
        }
        return ExitCode::SUCCESS;
    }
    let selected: Vec<_> = all
        .into_iter()
        .filter(|s| {
            let full = format!("e2e::{}", s.name);
            filters.is_empty() || filters.iter().any(|f| full.contains(f.as_str()))
        })
        .collect();
    if selected.is_empty() {
        return ExitCode::SUCCESS;
    }
    suite::run(selected)
}
