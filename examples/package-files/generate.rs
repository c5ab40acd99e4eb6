//! The package's generated files, from the clap definitions of both binaries, by the code the
//! binaries' own `completion` and `man` subcommands run (`kube_object_lock::cli::generate`):
//! man pages, bash/zsh/fish completion, kubectl's plugin completion (`kubectl_complete-lock`),
//! and the unit with the package's binary path.
//!
//! Shared by the `package-files` example (which writes them) and `tests/package_files.rs`
//! (which checks them against the current command lines).

use std::io;
use std::path::Path;

use clap::{Command, CommandFactory};
use kube_object_lock::cli::Cli;
pub use kube_object_lock::cli::generate::kubectl_complete;
use kube_object_lock::cli::generate::{self, Shell};
use kube_object_lock::plugin::cli::{LockCli, UnlockCli};

/// The binary path of a manual install (the repository's unit) and of the package.
const MANUAL_BIN: &str = "/usr/local/bin/kube-object-lock";
const PACKAGE_BIN: &str = "/usr/bin/kube-object-lock";

/// The command lines, each named as its binary.
pub fn commands() -> Vec<(&'static str, Command)> {
    vec![
        ("kube-object-lock", Cli::command()),
        ("kubectl-lock", LockCli::command()),
        ("kubectl-unlock", UnlockCli::command()),
    ]
}

/// One generated file: its path under the output directory and its bytes.
pub type File = (String, Vec<u8>);

/// The man pages of `cmd` and of each of its visible subcommands (`NAME-SUB.1`).
pub fn man_pages(cmd: Command) -> io::Result<Vec<File>> {
    let dir = tempfile::tempdir()?;
    generate::write_man_pages(cmd, dir.path())?;
    let mut pages = Vec::new();
    for entry in std::fs::read_dir(dir.path())? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        pages.push((format!("man/{name}"), std::fs::read(entry.path())?));
    }
    pages.sort();
    Ok(pages)
}

/// bash, zsh and fish completion of the binary `bin`, named where each shell looks for it.
pub fn completions(cmd: Command, bin: &str) -> Vec<File> {
    [
        (Shell::Bash, format!("completions/bash/{bin}")),
        (Shell::Zsh, format!("completions/zsh/_{bin}")),
        (Shell::Fish, format!("completions/fish/{bin}.fish")),
    ]
    .into_iter()
    .map(|(shell, path)| (path, generate::completion(cmd.clone(), bin, shell)))
    .collect()
}

/// The repository's unit with the package's binary path in ExecStart=.
pub fn packaged_unit(unit: &str) -> Result<String, String> {
    let exec = format!("ExecStart={MANUAL_BIN} ");
    match unit.lines().filter(|l| l.starts_with(&exec)).count() {
        1 => Ok(unit.replace(&exec, &format!("ExecStart={PACKAGE_BIN} "))),
        n => Err(format!(
            "systemd/kube-object-lock.service: expected one `{exec}...` line, found {n}"
        )),
    }
}

/// Every generated file, from the current command lines and `unit` (the repository's unit).
pub fn all(unit: &str) -> io::Result<Vec<File>> {
    let mut files = Vec::new();
    for (bin, cmd) in commands() {
        files.extend(man_pages(cmd.clone())?);
        files.extend(completions(cmd, bin));
    }
    files.push((
        "kubectl_complete-lock".to_owned(),
        kubectl_complete(&LockCli::command(), &UnlockCli::command()).into_bytes(),
    ));
    let unit = packaged_unit(unit).map_err(io::Error::other)?;
    files.push(("kube-object-lock.service".to_owned(), unit.into_bytes()));
    Ok(files)
}

/// Writes [`all`] under `out` (replacing what an earlier run wrote); returns how many files.
pub fn write_all(out: &Path, unit: &str) -> io::Result<usize> {
    let files = all(unit)?;
    for dir in ["man", "completions"] {
        match std::fs::remove_dir_all(out.join(dir)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    for (path, bytes) in &files {
        let path = out.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, bytes)?;
    }
    Ok(files.len())
}
