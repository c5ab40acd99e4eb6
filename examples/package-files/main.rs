//! Writes what the Debian package installs besides the binaries, generated from the current
//! command-line definitions so that a new flag reaches the man pages and the completion by
//! itself: `cargo run --example package-files [-- OUT_DIR]` (default target/release/package/),
//! then `cargo deb`. See the `[package.metadata.deb]` assets in Cargo.toml and `.ci/package`.

mod generate;

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
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
