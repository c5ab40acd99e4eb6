//! The one-pass review reader against serde_json, on mutated captured reviews.
//!
//! `review::parse` reads a body with the one-pass reader (`src/admission/scan.rs`) and leaves to
//! serde_json what that does not plainly accept; `review::parse_with_serde_json` uses serde_json
//! alone. For every body the two must give the same request or the same error. The bodies are
//! the captured reviews of `tests/fixtures/`, indented and compacted, first as they are and then
//! mutated by a seeded generator (`tests/support/mutate.rs`), so a run is reproducible from its
//! seed, and any one body from the seed and its index.
//!
//! ```sh
//! cargo test --locked --test differential                                # 10,000 bodies, seed 0
//! DIFFERENTIAL_SECONDS=300 DIFFERENTIAL_SEED=7 cargo test --locked --test differential
//! ```
//!
//! Settings (environment):
//! - `DIFFERENTIAL_SEED`: the seed (default 0).
//! - `DIFFERENTIAL_BODIES`: how many bodies (default 10,000, or no limit when
//!   `DIFFERENTIAL_SECONDS` is set).
//! - `DIFFERENTIAL_SECONDS`: stop after this long (whole bodies; default none).
//! - `DIFFERENTIAL_INDEX`: only the body of this index (to replay a mismatch).
//! - `DIFFERENTIAL_OUT`: where mismatching bodies are written (default `differential/` in
//!   cargo's temporary directory for tests, under `target/`).
//!
//! It prints `differential: N bodies, M parsed, K refused, X mismatches in Ts` and exits
//! non-zero on any mismatch, after printing each one's seed and index and writing its body to a
//! file. Arguments: `--list` lists it; a filter that is not part of `differential` runs nothing;
//! libtest's other flags are accepted and ignored.
#![forbid(unsafe_code)]

#[path = "support/mutate.rs"]
mod mutate;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use kube_object_lock::admission::review;

/// A run stops reporting (and writing files) after this many mismatches.
const MAX_REPORTED: u64 = 20;

struct Settings {
    seed: u64,
    bodies: Option<u64>,
    seconds: Option<f64>,
    index: Option<u64>,
    out: PathBuf,
}

fn env_number<T: std::str::FromStr>(name: &str) -> Result<Option<T>, String> {
    match std::env::var(name) {
        Ok(text) if !text.trim().is_empty() => text
            .trim()
            .replace('_', "")
            .parse()
            .map(Some)
            .map_err(|_| format!("{name}={text:?} is not a number")),
        _ => Ok(None),
    }
}

impl Settings {
    fn from_env() -> Result<Settings, String> {
        let seconds = env_number::<f64>("DIFFERENTIAL_SECONDS")?;
        let bodies = env_number::<u64>("DIFFERENTIAL_BODIES")?;
        Ok(Settings {
            seed: env_number("DIFFERENTIAL_SEED")?.unwrap_or(0),
            bodies: match (bodies, seconds) {
                (None, None) => Some(10_000),
                (bodies, _) => bodies,
            },
            seconds,
            index: env_number("DIFFERENTIAL_INDEX")?,
            out: std::env::var_os("DIFFERENTIAL_OUT")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("differential")),
        })
    }
}

/// What a run counted.
#[derive(Default)]
struct Counts {
    bodies: u64,
    /// Both gave the same request.
    parsed: u64,
    /// Both gave the same error.
    refused: u64,
    /// Read by the one-pass reader itself (not left to serde_json).
    one_pass: u64,
    mismatches: u64,
}

/// `review::parse` and `review::parse_with_serde_json` on `body`, compared as the fuzz target
/// and the property tests compare them; a panic in either is a mismatch too.
fn check(body: &[u8]) -> Result<bool, String> {
    let fast = catch_unwind(AssertUnwindSafe(|| review::parse(body)));
    let serde = catch_unwind(AssertUnwindSafe(|| review::parse_with_serde_json(body)));
    match (fast, serde) {
        (Ok(fast), Ok(serde)) if fast == serde => Ok(fast.is_ok()),
        (Ok(fast), Ok(serde)) => Err(format!(
            "the fast parse gave\n  {fast:?}\nand serde_json alone\n  {serde:?}"
        )),
        (Err(_), _) => Err("review::parse panicked".to_owned()),
        (_, Err(_)) => Err("review::parse_with_serde_json panicked".to_owned()),
    }
}

/// Body `index` of a run: first each base as it is, then mutated ones.
fn body(bases: &[(String, Vec<u8>)], seed: u64, index: u64) -> (&str, Vec<u8>) {
    if let Some((name, base)) = usize::try_from(index).ok().and_then(|i| bases.get(i)) {
        return (name, base.clone());
    }
    let mut rng = mutate::Rng::for_body(seed, index);
    let (name, base) = rng.pick(bases);
    (name, mutate::mutate(base, &mut rng))
}

fn run(settings: &Settings) -> ExitCode {
    let bases = mutate::bases();
    // The unmutated bodies must take the one-pass reader and parse: otherwise the comparison
    // says nothing about it.
    for (name, base) in &bases {
        if !review::read_in_one_pass(base) || review::parse(base).is_err() {
            eprintln!("differential: {name} is not read by the one-pass reader, or does not parse");
            return ExitCode::FAILURE;
        }
    }
    let started = Instant::now();
    let deadline = settings
        .seconds
        .map(|s| started + Duration::from_secs_f64(s));
    let indices: Box<dyn Iterator<Item = u64>> = match settings.index {
        Some(index) => Box::new(std::iter::once(index)),
        None => Box::new(0..settings.bodies.unwrap_or(u64::MAX)),
    };
    let mut counts = Counts::default();
    for index in indices {
        if index % 64 == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let (name, body) = body(&bases, settings.seed, index);
        counts.bodies += 1;
        counts.one_pass += u64::from(review::read_in_one_pass(&body));
        match check(&body) {
            Ok(true) => counts.parsed += 1,
            Ok(false) => counts.refused += 1,
            Err(what) => {
                counts.mismatches += 1;
                if counts.mismatches <= MAX_REPORTED {
                    report(settings, index, name, &body, &what);
                }
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "differential: {} bodies, {} parsed, {} refused, {} mismatches in {elapsed:.1}s \
         (seed {}, {} read in one pass, {:.0} bodies/s)",
        counts.bodies,
        counts.parsed,
        counts.refused,
        counts.mismatches,
        settings.seed,
        counts.one_pass,
        counts.bodies as f64 / elapsed.max(1e-9),
    );
    if counts.mismatches == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn report(settings: &Settings, index: u64, name: &str, body: &[u8], what: &str) {
    let file = settings
        .out
        .join(format!("seed-{}-index-{index}.json", settings.seed));
    let written = std::fs::create_dir_all(&settings.out)
        .and_then(|()| std::fs::write(&file, body))
        .map_or_else(
            |e| format!("not written: {e}"),
            |()| file.display().to_string(),
        );
    eprintln!(
        "differential: MISMATCH at seed {} index {index} (from {name}): {what}\n  body: {written}\n  \
         replay: DIFFERENTIAL_SEED={} DIFFERENTIAL_INDEX={index} cargo test --locked --test differential",
        settings.seed, settings.seed,
    );
}

fn main() -> ExitCode {
    let mut list = false;
    let mut ignored = false;
    let mut filters = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--list" => list = true,
            "--ignored" => ignored = true,
            // libtest flags that take a value as the next word.
            "--test-threads" | "--color" | "--format" | "--logfile" | "--skip" | "-Z" => {
                args.next();
            }
            flag if flag.starts_with('-') => {}
            filter => filters.push(filter.to_owned()),
        }
    }
    if list {
        println!("differential: test");
        return ExitCode::SUCCESS;
    }
    let selected =
        filters.is_empty() || filters.iter().any(|f| "differential".contains(f.as_str()));
    if ignored || !selected {
        return ExitCode::SUCCESS;
    }
    match Settings::from_env() {
        Ok(settings) => run(&settings),
        Err(e) => {
            eprintln!("differential: {e}");
            ExitCode::FAILURE
        }
    }
}
