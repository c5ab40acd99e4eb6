//! Load benchmark: the real `kube-object-lock serve` binary, driven over TLS with HTTP/1.1
//! keep-alive as the API server drives it, next to a baseline server on the same TLS and HTTP
//! stack that answers every request with a constant "allowed" AdmissionReview without parsing
//! it. The baseline is the floor for any webhook on this machine; the result that matters is the
//! ratio between the two, measured in the same run under the same noise.
//!
//! ```sh
//! cargo bench --bench load -- --connections 32 --duration 10s [--scenario NAME|all]
//! ```
//!
//! Both servers run as subprocesses so their CPU time and peak RSS (`VmHWM`) are comparable; the
//! webhook reads its locks from an in-process fake API server (the one the tests use, speaking
//! the real REST and watch protocol) through a kubeconfig, so the API calls it makes are counted
//! exactly. The load generator shares the machine with both, as it would on a control-plane node
//! running the API server. See BENCHMARKS.md for the scenarios and the goals.

#[path = "../../tests/support/fake_apiserver.rs"]
mod fake_apiserver;

mod baseline;
mod client;
mod report;
mod scenarios;
mod servers;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};

/// Load benchmark of the webhook against a constant-answer baseline on the same TLS/HTTP stack.
#[derive(Debug, Parser)]
#[command(
    name = "load",
    after_help = "Run through cargo: cargo bench --bench load -- --connections 32 --duration 10s"
)]
struct Args {
    /// Concurrent client connections (HTTP/1.1 keep-alive, as the API server keeps them).
    #[arg(long, short = 'c', default_value_t = 32, value_name = "C",
        value_parser = clap::value_parser!(u32).range(1..=4096))]
    connections: u32,
    /// Measured time per server and scenario [default: 10s under `cargo bench`, 1s otherwise,
    /// so that `cargo test --benches` is a quick smoke run].
    #[arg(long, short = 'd', value_name = "D", value_parser = positive_duration)]
    duration: Option<Duration>,
    /// Shortest warm-up before measuring. The warm-up also lasts until every prepared request
    /// body has been sent once (one pass over the 10,000 namespaces), at most 60s.
    #[arg(long, default_value = "1s", value_name = "D", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Slices the measured time of each server is cut into, taken in turns by the two servers
    /// (ABBA order), so that both see the same noise; 1 runs the baseline, then the webhook.
    #[arg(long, default_value_t = 5, value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    /// Scenario to run; repeat or separate with commas.
    #[arg(long, short = 's', value_enum, value_delimiter = ',', default_values_t = [Choice::All])]
    scenario: Vec<Choice>,
    /// Which servers to run (only one of them is useful when profiling).
    #[arg(long, value_enum, default_value_t = Servers::Both)]
    servers: Servers,
    /// Extra environment for the webhook, e.g. KUBE_OBJECT_LOCK__CACHE__TTL=10m (repeatable).
    #[arg(long = "server-env", value_name = "KEY=VALUE", value_parser = key_value)]
    server_env: Vec<(String, String)>,
    /// Run both servers under this command, e.g. "valgrind --tool=callgrind" (split on spaces).
    /// For profiling: the CPU and RSS columns then describe the wrapper.
    #[arg(long, value_name = "COMMAND")]
    server_wrapper: Option<String>,
    /// The webhook binary [default: the one cargo built with this benchmark].
    #[arg(long, value_name = "FILE")]
    server_bin: Option<PathBuf>,
    /// Passed by `cargo bench`; selects the full default duration.
    #[arg(long, hide = true)]
    bench: bool,
    /// Internal: serve the baseline (ADDR CERT KEY) until SIGTERM.
    #[arg(long, hide = true, num_args = 3, value_names = ["ADDR", "CERT", "KEY"])]
    serve_baseline: Option<Vec<String>>,
}

/// A scenario, or all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Choice {
    /// Every scenario below, in this order.
    All,
    /// ConfigMap UPDATE/DELETE reviews of 1,000 objects in one namespace, none locked.
    OneNamespace,
    /// The same reviews spread round-robin over 10,000 namespaces (cache loads and evictions).
    #[value(name = "namespaces-10k")]
    Namespaces10k,
    /// One namespace; 1% of the requests are on locked objects (and are denied).
    #[value(name = "locked-1pct")]
    Locked1Pct,
    /// A ConfigMap UPDATE whose object and oldObject each carry 512 KiB of data.
    LargeObject,
    /// The one-namespace reviews, with a new TCP and TLS connection for every request.
    NewConnection,
    /// Pod evictions in a namespace whose Lock is named: no label read.
    Evictions,
    /// Pod evictions under a selector Lock: one metadata GET of the pod each, half denied.
    SelectorEvictions,
    /// Lock-to-enforcement: Locks created one at a time, each until its object is refused.
    LockToEnforcement,
}

/// Which servers a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Servers {
    /// The baseline, then the webhook.
    Both,
    /// The webhook only.
    Ours,
    /// The baseline only.
    Baseline,
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if duration.is_zero() {
        return Err("must be longer than 0s".to_owned());
    }
    Ok(duration)
}

fn key_value(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

/// Lock-to-enforcement samples (one Lock each).
const ENFORCEMENT_SAMPLES: usize = 300;

fn main() -> ExitCode {
    // One crypto provider for everything in this process, as the webhook's own main does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    if let Some(serve) = &args.serve_baseline {
        return match baseline::serve(&serve[0], &serve[1], &serve[2]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("baseline server: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load benchmark failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let duration = args.duration.unwrap_or(if args.bench {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(1)
    });
    let chosen = scenarios::Name::chosen(&args.scenario);
    let server_bin = match &args.server_bin {
        Some(path) => path.clone(),
        None => PathBuf::from(env!("CARGO_BIN_EXE_kube-object-lock")),
    };
    anyhow::ensure!(
        server_bin.is_file(),
        "the webhook binary {} does not exist; build it with `cargo build --release` or pass --server-bin",
        server_bin.display()
    );
    let wrapper = args
        .server_wrapper
        .as_deref()
        .map(|w| w.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    let env = servers::Env::new(server_bin, args.server_env.clone(), wrapper)?;
    let runtime = tokio::runtime::Runtime::new().context("cannot start the client runtime")?;
    let plan = client::Plan {
        connections: args.connections as usize,
        warmup: args.warmup,
        duration,
        new_connection: false,
        rounds: args.rounds as usize,
        full_pass: true,
    };
    report::header(&env, &plan, &chosen);
    let mut results = Vec::new();
    for name in chosen {
        let scenario = scenarios::build(name).with_context(|| format!("scenario {name}"))?;
        let result = servers::run_scenario(&runtime, &env, &scenario, &plan, args.servers)
            .with_context(|| format!("scenario {name}"))?;
        report::scenario(&result);
        results.push(result);
    }
    let enforcement = if args
        .scenario
        .iter()
        .any(|c| matches!(c, Choice::All | Choice::LockToEnforcement))
        && args.servers != Servers::Baseline
    {
        eprintln!("== lock-to-enforcement: {ENFORCEMENT_SAMPLES} Locks, one at a time");
        let measured = servers::measure_enforcement(&runtime, &env, ENFORCEMENT_SAMPLES)
            .context("lock-to-enforcement")?;
        report::enforcement(&measured);
        Some(measured)
    } else {
        None
    };
    report::summary(&results, enforcement.as_ref());
    Ok(())
}
