//! Running kubectl (and the plugin) as a user would, with the suite's kubeconfig.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

use anyhow::{Result, bail, ensure};

/// kubectl with a fixed kubeconfig.
#[derive(Clone, Debug)]
pub struct Kubectl {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
    /// Prepended to PATH, so that `kubectl lock` finds the plugin under test.
    pub plugin_dir: Option<PathBuf>,
}

/// What a command did.
#[derive(Debug)]
pub struct Out {
    pub cmd: String,
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// The output if the command succeeded, else an error with its stderr.
    pub fn check(self) -> Result<Out> {
        if self.ok() {
            Ok(self)
        } else {
            bail!(
                "`{}` failed ({}): {}{}",
                self.cmd,
                self.code().map_or("no exit code".into(), |c| c.to_string()),
                self.stderr.trim(),
                self.stdout.trim()
            )
        }
    }

    /// Asserts that the API server refused the command as Forbidden with `message` in it.
    pub fn refused(&self, message: &str) -> Result<()> {
        ensure!(
            !self.ok(),
            "`{}` was allowed; expected a refusal with: {message}\n    stdout: {}\n    stderr: {}",
            self.cmd,
            self.stdout.trim(),
            self.stderr.trim()
        );
        // kubectl says `Error from server (Forbidden)`, or wraps the message in its own words
        // (`kubectl set image`: "failed to patch image update ...").
        ensure!(
            (self.stderr.contains("(Forbidden)") || self.stderr.contains("denied the request"))
                && self.stderr.contains(message),
            "`{}` failed, but not with the expected refusal\n    expected: Forbidden ... {message}\n    got: {}",
            self.cmd,
            self.stderr.trim()
        );
        Ok(())
    }

    /// Asserts success, returning stderr (kubectl's `Warning:` lines are there).
    pub fn allowed(&self) -> Result<&str> {
        ensure!(
            self.ok(),
            "`{}` was refused: {}",
            self.cmd,
            self.stderr.trim()
        );
        Ok(&self.stderr)
    }

    /// Asserts success with a `Warning:` line containing `text` (or as much of it as fits: the
    /// webhook cuts warnings to 256 characters with `…`).
    pub fn allowed_warning(&self, text: &str) -> Result<()> {
        let stderr = self.allowed()?;
        ensure!(
            stderr.lines().any(|l| l
                .strip_prefix("Warning: ")
                .is_some_and(|w| warning_matches(w, text))),
            "`{}` allowed without the warning `{text}`; stderr: {}",
            self.cmd,
            stderr.trim()
        );
        Ok(())
    }
}

/// `warning` contains `text`, or was cut (`…`) inside it.
pub fn warning_matches(warning: &str, text: &str) -> bool {
    if warning.contains(text) {
        return true;
    }
    let Some(cut) = warning.strip_suffix('…') else {
        return false;
    };
    // The longest end of `cut` that starts `text` and is a fair part of it.
    (0..cut.len())
        .filter(|i| cut.is_char_boundary(*i))
        .any(|i| text.starts_with(&cut[i..]) && cut.len() - i >= text.len().min(40))
}

impl Kubectl {
    pub fn new(bin: PathBuf, kubeconfig: PathBuf) -> Kubectl {
        Kubectl {
            bin,
            kubeconfig,
            plugin_dir: None,
        }
    }

    /// `kubectl --kubeconfig F ARGS...`.
    pub fn run(&self, args: &[&str]) -> Out {
        self.run_stdin(args, None)
    }

    /// `kubectl --kubeconfig F ARGS...` with `stdin`.
    pub fn run_stdin(&self, args: &[&str], stdin: Option<&str>) -> Out {
        // Global flags work after the command, and a plugin takes them only after its name;
        // before `--`, after which everything is the command's (`kubectl exec POD -- CMD`).
        let kubeconfig = self.kubeconfig.to_string_lossy().into_owned();
        let mut full: Vec<&str> = args.to_vec();
        let at = args.iter().position(|a| *a == "--").unwrap_or(args.len());
        full.splice(at..at, ["--kubeconfig", kubeconfig.as_str()]);
        run(&self.bin, &full, stdin, self.path_env())
    }

    fn path_env(&self) -> Option<OsString> {
        let dir = self.plugin_dir.as_ref()?;
        let mut paths = vec![dir.clone()];
        if let Some(path) = std::env::var_os("PATH") {
            paths.extend(std::env::split_paths(&path));
        }
        std::env::join_paths(paths).ok()
    }

    /// The kubeconfig as kubectl reads it: the current context only, files inlined.
    pub fn view(&self) -> Result<serde_json::Value> {
        let out = self
            .run(&[
                "config",
                "view",
                "--raw",
                "--minify",
                "--flatten",
                "-o",
                "json",
            ])
            .check()?;
        Ok(serde_json::from_str(&out.stdout)?)
    }

    /// `kubectl apply --server-side -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> Result<Out> {
        self.run_stdin(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=kol-e2e",
                "-f",
                "-",
            ],
            Some(yaml),
        )
        .check()
    }
}

/// Runs `bin ARGS...`, capturing its output; `path` replaces PATH when given.
pub fn run(bin: &Path, args: &[&str], stdin: Option<&str>, path: Option<OsString>) -> Out {
    let cmd = format!(
        "{} {}",
        bin.file_name().map_or_else(
            || bin.display().to_string(),
            |n| n.to_string_lossy().into_owned()
        ),
        args.iter()
            .filter(|a| !a.contains("kubeconfig") && !a.starts_with('/'))
            .copied()
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut command = Command::new(bin);
    command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(path) = path {
        command.env("PATH", path);
    }
    let child = command.spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            return Out {
                cmd,
                status: None,
                stdout: String::new(),
                stderr: format!("cannot run {}: {e}", bin.display()),
            };
        }
    };
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let _ = pipe.write_all(input.as_bytes());
    }
    match child.wait_with_output() {
        Ok(output) => Out {
            cmd,
            status: Some(output.status),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        },
        Err(e) => Out {
            cmd,
            status: None,
            stdout: String::new(),
            stderr: format!("{}: {e}", bin.display()),
        },
    }
}
