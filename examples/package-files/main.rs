//! Writes what the Debian package installs besides the binaries, generated from the current
//! command-line definitions so that a new flag reaches the man pages and the completion by
//! itself: `cargo run --example package-files [-- OUT_DIR]` (default target/release/package/),
//! then `cargo deb`. See the `[package.metadata.deb]` assets in Cargo.toml and `.ci/package`.
//!
//! `cargo run --example package-files -- --docs docs/reference` writes the reference pages
//! instead (commands, settings, metrics, Lock fields), from the same code.

mod generate;
mod reference;

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("--docs") {
        let Some(dir) = std::env::args_os().nth(2).map(PathBuf::from) else {
            eprintln!("error: --docs needs a directory");
            return ExitCode::from(2);
        };
        return write_reference(&dir);
    }
    let out = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target/release/package"));
    let unit = match std::fs::read_to_string("systemd/kube-object-lock.service") {
        Ok(unit) => unit,
        Err(e) => {
            eprintln!("error: systemd/kube-object-lock.service: {e} (run from the checkout)");
            return ExitCode::FAILURE;
        }
    };
    match generate::write_all(&out, &unit) {
        Ok(files) => {
            println!("{} files in {}", files, out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the reference pages into `dir`.
fn write_reference(dir: &std::path::Path) -> ExitCode {
    let read = |path: &str| {
        std::fs::read_to_string(path).map_err(|e| format!("{path}: {e} (run from the checkout)"))
    };
    let written = read("src/settings.rs")
        .and_then(|settings| Ok((settings, read("src/metrics.rs")?)))
        .and_then(|(settings, metrics)| reference::pages(&settings, &metrics))
        .and_then(|pages| {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            for (name, text) in &pages {
                let path = dir.join(name);
                std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            Ok(pages.len())
        });
    match written {
        Ok(n) => {
            println!("{n} reference pages in {}", dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
