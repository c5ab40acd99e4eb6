//! The printed report: the machine, one table row per server and scenario with the
//! webhook/baseline ratios under it, the API calls, and the goals met or missed.

use crate::client::Plan;
use crate::scenarios::Name;
use crate::servers::{Enforcement, Env, Run, ScenarioResult};

/// Throughput of the webhook over the baseline's, one namespace: at least this.
const GOAL_THROUGHPUT: f64 = 0.85;
/// p99 of the webhook over the baseline's, one namespace: at most this.
const GOAL_P99: f64 = 1.5;
/// Server CPU per request of the webhook over the baseline's, one namespace: at most this.
const GOAL_CPU: f64 = 1.3;
/// API calls per 1000 admissions at steady state: at most this.
const GOAL_API_PER_1000: f64 = 1.0;
/// Peak RSS of the webhook with 10,000 Locks in 10,000 namespaces, MiB: at most this.
const GOAL_RSS_MIB: f64 = 64.0;
/// Lock-to-enforcement p99, ms: at most this.
const GOAL_ENFORCEMENT_P99_MS: f64 = 50.0;

pub fn header(env: &Env, plan: &Plan, chosen: &[Name]) {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    println!("kube-object-lock load benchmark");
    println!(
        "machine:   {cpus} CPUs ({model}), {mem_gib:.1} GiB memory; the load generator shares them"
    );
    println!("webhook:   {}", env.server_bin.display());
    if !env
        .server_bin
        .components()
        .any(|c| c.as_os_str() == "release")
    {
        println!("           warning: not under target/release; is this an optimized build?");
    }
    println!(
        "load:      {} HTTP/1.1 keep-alive connections over TLS, closed loop; warm-up >= {:?} (and one pass over the bodies), then {:?} measured per server in {} turns",
        plan.connections, plan.warmup, plan.duration, plan.rounds
    );
    let names: Vec<&str> = chosen.iter().map(|n| n.as_str()).collect();
    println!("scenarios: {}", names.join(", "));
    println!();
}

/// Prints one scenario's rows as soon as it has run.
pub fn scenario(result: &ScenarioResult) {
    println!("{}: {}", result.name, result.about);
    table_header();
    rows(result);
    for run in [&result.baseline, &result.ours].into_iter().flatten() {
        for sample in &run.outcome.error_samples {
            println!("    {} error: {sample}", run.server);
        }
    }
    println!();
}

fn table_header() {
    println!(
        "  {:<15} {:<9} {:>8} {:>7} {:>7} {:>7} {:>8} {:>7} {:>6} {:>7} {:>7} {:>7} {:>6} {:>7}",
        "scenario",
        "server",
        "req/s",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p99.9 ms",
        "max ms",
        "errors",
        "denied",
        "API/1k",
        "RSS MiB",
        "CPU %",
        "CPU µs"
    );
}

struct Row {
    rps: f64,
    latency_ms: [f64; 5],
    rss_mib: Option<f64>,
    cpu_percent: Option<f64>,
    cpu_us_per_request: Option<f64>,
}

fn row(run: &Run) -> Row {
    let o = &run.outcome;
    let secs = o.window.as_secs_f64();
    let h = &o.latency;
    let ms = |us: u64| us as f64 / 1000.0;
    let cpu_secs = o
        .delta(|s| s.cpu_ticks)
        .map(|t| t as f64 / run.ticks_per_second as f64);
    Row {
        rps: o.ok as f64 / secs,
        latency_ms: [
            ms(h.value_at_quantile(0.50)),
            ms(h.value_at_quantile(0.90)),
            ms(h.value_at_quantile(0.99)),
            ms(h.value_at_quantile(0.999)),
            ms(h.max()),
        ],
        rss_mib: run.peak_rss_kib.map(|k| k as f64 / 1024.0),
        cpu_percent: cpu_secs.map(|c| c / secs * 100.0),
        cpu_us_per_request: cpu_secs.filter(|_| o.ok > 0).map(|c| c * 1e6 / o.ok as f64),
    }
}

/// API calls per 1000 admissions during the measured window.
fn api_per_1000(run: &Run) -> Option<f64> {
    let api = run.api.as_ref()?;
    let admissions = run.outcome.ok + run.outcome.errors;
    (admissions > 0).then(|| api.window.total() as f64 * 1000.0 / admissions as f64)
}

fn opt(value: Option<f64>, width: usize, decimals: usize) -> String {
    match value {
        Some(v) => format!("{v:>width$.decimals$}"),
        None => format!("{:>width$}", "-"),
    }
}

fn rows(result: &ScenarioResult) {
    let name = result.name.as_str();
    let mut printed = Vec::new();
    for run in [&result.baseline, &result.ours].into_iter().flatten() {
        let r = row(run);
        let o = &run.outcome;
        let denied = if o.ok > 0 {
            format!("{:.2}%", o.denied as f64 * 100.0 / o.ok as f64)
        } else {
            "-".to_owned()
        };
        println!(
            "  {:<15} {:<9} {:>8.0} {:>7.2} {:>7.2} {:>7.2} {:>8.2} {:>7.2} {:>6} {:>7} {} {} {} {}",
            if printed.is_empty() { name } else { "" },
            run.server,
            r.rps,
            r.latency_ms[0],
            r.latency_ms[1],
            r.latency_ms[2],
            r.latency_ms[3],
            r.latency_ms[4],
            o.errors,
            denied,
            opt(api_per_1000(run), 7, 2),
            opt(r.rss_mib, 7, 1),
            opt(r.cpu_percent, 6, 0),
            opt(r.cpu_us_per_request, 7, 0),
        );
        printed.push(r);
    }
    if let [base, ours] = &printed[..] {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
        let both = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| ratio(a, b));
        let l = |i: usize| ratio(ours.latency_ms[i], base.latency_ms[i]);
        println!(
            "  {:<15} {:<9} {:>7.2}x {:>6.2}x {:>6.2}x {:>6.2}x {:>7.2}x {:>6.2}x {:>6} {:>7} {:>7} {}x {}x {}x",
            "",
            "ours/base",
            ratio(ours.rps, base.rps),
            l(0),
            l(1),
            l(2),
            l(3),
            l(4),
            "",
            "",
            "",
            opt(both(ours.rss_mib, base.rss_mib), 6, 2),
            opt(both(ours.cpu_percent, base.cpu_percent), 5, 2),
            opt(both(ours.cpu_us_per_request, base.cpu_us_per_request), 6, 2),
        );
    }
}

/// Prints the lock-to-enforcement figures.
pub fn enforcement(e: &Enforcement) {
    let ms = |q: f64| e.latency.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "lock-to-enforcement: {} Locks created one at a time; from the API server storing each to the first refusal of its object",
        e.latency.len() as usize + e.missed
    );
    println!(
        "  p50 {:.2} ms  p90 {:.2} ms  p99 {:.2} ms  max {:.2} ms  never enforced {}",
        ms(0.5),
        ms(0.9),
        ms(0.99),
        e.latency.max() as f64 / 1000.0,
        e.missed
    );
    println!();
}

/// The whole table again, the API calls, and the goals.
pub fn summary(results: &[ScenarioResult], enforcement: Option<&Enforcement>) {
    println!("== results");
    table_header();
    for result in results {
        rows(result);
    }
    println!();
    println!(
        "columns: latency from sending to the last byte of the answer; API/1k = requests to the"
    );
    println!("API server per 1000 admissions in the measured window; RSS = peak (VmHWM) of the");
    println!(
        "server process; CPU % = server CPU over the window (100% = one core); CPU µs = server"
    );
    println!("CPU per answered request.");
    println!();

    let with_api: Vec<_> = results
        .iter()
        .filter_map(|r| Some((r, r.ours.as_ref()?, r.ours.as_ref()?.api.as_ref()?)))
        .collect();
    if !with_api.is_empty() {
        println!(
            "== API server requests made by the webhook (lookup LISTs / watch LISTs / WATCHes)"
        );
        for (result, run, api) in &with_api {
            let admissions = run.outcome.ok + run.outcome.errors;
            let c = |c: &crate::servers::Classified| {
                format!("{}/{}/{}", c.lookup_lists, c.watch_lists, c.watches)
                    + &if c.other > 0 {
                        format!(" +{} other", c.other)
                    } else {
                        String::new()
                    }
            };
            println!(
                "  {:<15} start-up {:<9} warm-up ({:.1}s) {:<11} measured {:<9} for {admissions} admissions",
                result.name.as_str(),
                c(&api.startup),
                run.outcome.warmup.as_secs_f64(),
                c(&api.warmup),
                c(&api.window),
            );
        }
        println!();
    }

    println!("== CPU in the measured window (100% = one core; noise shows as \"others\")");
    for result in results {
        for run in [&result.baseline, &result.ours].into_iter().flatten() {
            let o = &run.outcome;
            let pct = |ticks: Option<u64>| {
                ticks.map(|t| {
                    t as f64 / run.ticks_per_second as f64 / o.window.as_secs_f64() * 100.0
                })
            };
            let server = pct(o.delta(|s| s.cpu_ticks));
            let own = pct(o.delta(|s| s.own_cpu_ticks));
            let busy = pct(o.delta(|s| s.machine_ticks.map(|t| t.0)));
            let others = match (server, own, busy) {
                (Some(s), Some(c), Some(b)) => Some((b - s - c).max(0.0)),
                _ => None,
            };
            println!(
                "  {:<15} {:<9} server {}%  load generator + fake API {}%  others {}%  machine busy {}%",
                result.name.as_str(),
                run.server,
                opt(server, 4, 0),
                opt(own, 4, 0),
                opt(others, 4, 0),
                opt(busy, 4, 0),
            );
        }
    }
    println!();

    println!("== goals");
    let find = |name: Name| results.iter().find(|r| r.name == name);
    let one = find(Name::OneNamespace);
    let pair = one.and_then(|r| Some((row(r.baseline.as_ref()?), row(r.ours.as_ref()?))));
    match &pair {
        Some((base, ours)) => {
            let t = ours.rps / base.rps;
            goal(
                t >= GOAL_THROUGHPUT,
                &format!(
                    "one-namespace throughput >= {GOAL_THROUGHPUT} x baseline: {t:.2} x ({:.0} vs {:.0} req/s)",
                    ours.rps, base.rps
                ),
            );
            let p = ours.latency_ms[2] / base.latency_ms[2];
            goal(
                p <= GOAL_P99,
                &format!(
                    "one-namespace p99 <= {GOAL_P99} x baseline: {p:.2} x ({:.2} vs {:.2} ms)",
                    ours.latency_ms[2], base.latency_ms[2]
                ),
            );
            if let (Some(o), Some(b)) = (ours.cpu_us_per_request, base.cpu_us_per_request) {
                let c = o / b;
                goal(
                    c <= GOAL_CPU,
                    &format!(
                        "one-namespace server CPU per request <= {GOAL_CPU} x baseline: {c:.2} x ({o:.1} vs {b:.1} µs)"
                    ),
                );
            }
        }
        None => println!("  [not run] one-namespace throughput and p99 (needs both servers)"),
    }
    let mut api: Vec<(Name, f64, String)> = Vec::new();
    for result in results {
        let Some(run) = &result.ours else { continue };
        let Some(measured) = api_per_1000(run) else {
            continue;
        };
        // One label GET per review is what that scenario measures, not a lookup cost.
        if result.name == Name::SelectorEvictions {
            continue;
        }
        // With the watch live nothing expires: what the window measured is the steady state.
        api.push((result.name, measured, format!("{measured:.2}")));
    }
    if api.is_empty() {
        println!("  [not run] API calls per 1000 admissions");
    } else {
        let worst = api.iter().map(|(_, v, _)| *v).fold(0.0, f64::max);
        goal(
            worst <= GOAL_API_PER_1000,
            &format!("<= {GOAL_API_PER_1000} API call per 1000 admissions at steady state:"),
        );
        for (name, value, note) in &api {
            let mark = if *value <= GOAL_API_PER_1000 {
                " "
            } else {
                "!"
            };
            println!("           {mark} {:<15} {note}", name.as_str());
        }
    }
    match find(Name::Namespaces10k).and_then(|r| r.ours.as_ref()?.peak_rss_kib) {
        Some(kib) => {
            let mib = kib as f64 / 1024.0;
            goal(
                mib <= GOAL_RSS_MIB,
                &format!(
                    "namespaces-10k (10,000 Locks) peak RSS <= {GOAL_RSS_MIB} MiB: {mib:.1} MiB"
                ),
            );
        }
        None => println!("  [not run] namespaces-10k peak RSS"),
    }
    match enforcement {
        Some(e) if !e.latency.is_empty() => {
            let p99 = e.latency.value_at_quantile(0.99) as f64 / 1000.0;
            goal(
                p99 <= GOAL_ENFORCEMENT_P99_MS && e.missed == 0,
                &format!(
                    "lock-to-enforcement p99 <= {GOAL_ENFORCEMENT_P99_MS} ms: {p99:.2} ms ({} never enforced)",
                    e.missed
                ),
            );
        }
        _ => println!("  [not run] lock-to-enforcement"),
    }
    for result in results {
        if let Some(run) = &result.ours {
            let o = &run.outcome;
            if o.ok == 0 {
                continue;
            }
            let share = o.denied as f64 / o.ok as f64;
            if (share - result.expected_denied).abs() > 0.002 {
                println!(
                    "  [check]   {}: {:.2}% denied, expected {:.2}%",
                    result.name,
                    share * 100.0,
                    result.expected_denied * 100.0
                );
            }
            if o.errors > 0 {
                println!("  [check]   {}: {} errors", result.name, o.errors);
            }
        }
    }
}

fn goal(met: bool, text: &str) {
    println!("  [{}] {text}", if met { "met   " } else { "MISSED" });
}
