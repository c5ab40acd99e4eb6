//! The package's man pages and completion are generated from the current command lines: every
//! flag of every (sub)command of both binaries is in its man page and in the bash, zsh and fish
//! completion, and kubectl's plugin completion (`kubectl_complete-lock`, run here as kubectl
//! runs it, against a stand-in kubectl) offers the plugin's flags, their values, resource types
//! and object names.

#[path = "../examples/package-files/generate.rs"]
mod generate;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use clap::{Arg, CommandFactory};
use kube_object_lock::plugin::cli::{LockCli, UnlockCli};

fn text(files: &[generate::File]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(path, bytes)| (path.clone(), String::from_utf8_lossy(bytes).into_owned()))
        .collect()
}

/// (page name, long flags) of `cmd` and every visible subcommand, as clap_mangen names pages.
fn long_flags(cmd: &clap::Command) -> Vec<(String, Vec<String>)> {
    fn walk(cmd: &clap::Command, page: String, out: &mut Vec<(String, Vec<String>)>) {
        let flags = cmd
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect();
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, format!("{page}-{}", sub.get_name()), out);
        }
        out.push((page, flags));
    }
    let mut cmd = cmd.clone().disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    walk(&cmd, cmd.get_name().to_owned(), &mut out);
    out
}

#[test]
fn every_flag_of_every_command_is_in_its_man_page_and_the_shell_completion() {
    let mut checked = 0;
    for (bin, cmd) in generate::commands() {
        let pages = text(&generate::man_pages(cmd.clone()).expect("man pages"));
        let completions = text(&generate::completions(cmd.clone(), bin));
        let bash = &completions[&format!("completions/bash/{bin}")];
        let zsh = &completions[&format!("completions/zsh/_{bin}")];
        let fish = &completions[&format!("completions/fish/{bin}.fish")];
        for (page, flags) in long_flags(&cmd) {
            let man = pages
                .get(&format!("man/{page}.1"))
                .unwrap_or_else(|| panic!("no man page {page}.1 in {:?}", pages.keys()));
            assert!(man.contains(".TH "), "{page}.1 is a man page: {man}");
            for flag in flags {
                // roff writes a hyphen as \-.
                let roff = format!("\\-\\-{}", flag.replace('-', "\\-"));
                assert!(man.contains(&roff), "{page}.1 lacks --{flag}");
                assert!(bash.contains(&format!("--{flag}")), "bash {bin}: --{flag}");
                assert!(zsh.contains(&format!("--{flag}")), "zsh {bin}: --{flag}");
                assert!(fish.contains(&format!("-l {flag}")), "fish {bin}: --{flag}");
                checked += 1;
            }
        }
    }
    // serve, certs, manifests ... and the plugin: far more than a handful.
    assert!(checked > 40, "only {checked} flags checked");
}

#[test]
fn a_flag_added_to_a_command_line_reaches_every_generated_file() {
    let (bin, cmd) = generate::commands().swap_remove(0);
    let cmd = cmd.mut_subcommand("serve", |serve| {
        serve.arg(
            Arg::new("brand-new")
                .long("brand-new-flag")
                .help("A flag no release has."),
        )
    });
    let pages = text(&generate::man_pages(cmd.clone()).expect("man pages"));
    assert!(pages[&format!("man/{bin}-serve.1")].contains("\\-\\-brand\\-new\\-flag"));
    assert!(!pages[&format!("man/{bin}-certs.1")].contains("brand\\-new"));
    for (path, script) in text(&generate::completions(cmd, bin)) {
        assert!(script.contains("brand-new-flag"), "{path}");
    }
    let lock = LockCli::command().arg(Arg::new("brand-new").long("brand-new-flag"));
    let script = generate::kubectl_complete(&lock, &UnlockCli::command());
    assert!(script.contains("--brand-new-flag\t"), "{script}");
}

#[test]
fn the_packaged_unit_runs_the_packaged_binary() {
    let unit = std::fs::read_to_string("systemd/kube-object-lock.service").expect("unit");
    let packaged = generate::packaged_unit(&unit).expect("one ExecStart");
    let exec: Vec<&str> = packaged
        .lines()
        .filter(|l| l.starts_with("ExecStart="))
        .collect();
    assert_eq!(
        exec,
        ["ExecStart=/usr/bin/kube-object-lock serve --config /etc/kube-object-lock/config.toml"]
    );
    // Everything else as written.
    assert_eq!(packaged.lines().count(), unit.lines().count(), "{packaged}");
    assert!(generate::packaged_unit("[Service]\nExecStart=/opt/kol serve\n").is_err());
}

/// `kubectl_complete-lock` (and its `-unlock` name) in `dir`, with a stand-in `kubectl` that
/// logs its arguments and answers discovery and listings.
fn completion_dir(dir: &Path) {
    let script = generate::kubectl_complete(&LockCli::command(), &UnlockCli::command());
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let complete = bin.join("kubectl_complete-lock");
    std::fs::write(&complete, script).expect("write");
    std::fs::set_permissions(&complete, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::os::unix::fs::symlink("kubectl_complete-lock", bin.join("kubectl_complete-unlock"))
        .expect("symlink");
    let kubectl = format!(
        r#"#!/bin/sh
echo "$*" >> {log}
case "$*" in
*api-resources*) printf '%s\n' configmaps deployments.apps namespaces ;;
*"get namespaces"*) printf '%s\n' namespace/default namespace/prod ;;
*"get deployments.apps"*) printf '%s\n' deployment.apps/web deployment.apps/worker ;;
*"get configmaps"*) printf '%s\n' configmap/app-config ;;
*) echo "unexpected: $*" >&2; exit 1 ;;
esac
"#,
        log = dir.join("kubectl.log").display()
    );
    std::fs::write(dir.join("kubectl"), kubectl).expect("write");
    std::fs::set_permissions(dir.join("kubectl"), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
}

/// Runs `name` with `words` as kubectl would, `kubectl` on PATH or not; (lines, stderr).
fn complete(dir: &Path, name: &str, words: &[&str], with_kubectl: bool) -> (Vec<String>, String) {
    let mut path = format!("{}:/usr/bin:/bin", dir.join("bin").display());
    if with_kubectl {
        path = format!("{}:{path}", dir.display());
    }
    let out = Command::new(dir.join("bin").join(name))
        .args(words)
        .env_clear()
        .env("PATH", path)
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    (lines, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn candidates(lines: &[String]) -> Vec<&str> {
    lines
        .iter()
        .map(|l| l.split('\t').next().unwrap_or_default())
        .collect()
}

#[test]
fn kubectl_plugin_completion_offers_flags_values_resources_and_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    completion_dir(dir.path());
    let d = dir.path();

    // First word: `list` and the cluster's resource types; no file names (:4).
    let (lines, _) = complete(d, "kubectl_complete-lock", &[""], true);
    assert_eq!(
        candidates(&lines),
        ["list", "configmaps", "deployments.apps", "namespaces", ":4"]
    );
    let (lines, _) = complete(d, "kubectl_complete-lock", &["de"], true);
    assert_eq!(candidates(&lines), ["deployments.apps", ":4"]);

    // Object names, in the namespace and context typed, both forms.
    let (lines, _) = complete(
        d,
        "kubectl_complete-lock",
        &["--context", "ctx", "-n", "prod", "deployments.apps", "w"],
        true,
    );
    assert_eq!(candidates(&lines), ["web", "worker", ":4"]);
    let (lines, _) = complete(d, "kubectl_complete-lock", &["configmaps/"], true);
    assert_eq!(candidates(&lines), ["configmaps/app-config", ":4"]);
    let log = std::fs::read_to_string(d.join("kubectl.log")).expect("log");
    assert!(
        log.lines().any(|l| l.contains("--request-timeout=2s")
            && l.contains("--context=ctx")
            && l.contains("get deployments.apps -o name --namespace=prod")),
        "{log}"
    );

    // Flags with their help, and the values of a flag that has a fixed set.
    let (lines, _) = complete(d, "kubectl_complete-lock", &["deploy/web", "--op"], true);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with("--operations\t"), "{lines:?}");
    let (lines, _) = complete(
        d,
        "kubectl_complete-lock",
        &["deploy/web", "--operations", ""],
        true,
    );
    assert_eq!(
        candidates(&lines),
        ["UPDATE", "DELETE", "CREATE", "CONNECT", ":4"]
    );
    let (lines, _) = complete(d, "kubectl_complete-lock", &["-n", ""], true);
    assert_eq!(candidates(&lines), ["default", "prod", ":4"]);
    let (lines, _) = complete(d, "kubectl_complete-lock", &["--kubeconfig", ""], true);
    assert_eq!(lines, [":0"], "file names for --kubeconfig");

    // Every flag of the plugin's command lines, each where it applies.
    let (lock, _) = complete(d, "kubectl_complete-lock", &["deploy/web", "--"], true);
    let (list, _) = complete(d, "kubectl_complete-lock", &["list", "--"], true);
    let (unlock, _) = complete(d, "kubectl_complete-unlock", &["--"], true);
    for (cmd, lines, must, must_not) in [
        (
            LockCli::command(),
            &lock,
            "--allow-missing",
            "--all-namespaces",
        ),
        (
            LockCli::command()
                .find_subcommand("list")
                .expect("list")
                .clone(),
            &list,
            "--all-namespaces",
            "--reason",
        ),
        (UnlockCli::command(), &unlock, "--context", "--reason"),
    ] {
        let offered = candidates(lines);
        for arg in cmd.get_arguments().filter(|a| !a.is_positional()) {
            if let Some(long) = arg.get_long() {
                assert!(
                    offered.contains(&format!("--{long}").as_str()),
                    "--{long}: {offered:?}"
                );
            }
        }
        assert!(
            offered.contains(&must) && !offered.contains(&must_not),
            "{offered:?}"
        );
        assert!(!offered.contains(&"list"), "{offered:?}");
    }

    // No cluster (no kubectl): the plugin's own words only, and not a word on stderr.
    let (lines, stderr) = complete(d, "kubectl_complete-lock", &[""], false);
    assert_eq!(candidates(&lines), ["list", ":4"]);
    assert_eq!(stderr, "");
    let (lines, stderr) = complete(
        d,
        "kubectl_complete-unlock",
        &["deployments.apps", ""],
        false,
    );
    assert_eq!(lines, [":4"]);
    assert_eq!(stderr, "");
}

#[test]
fn writing_replaces_what_an_earlier_run_wrote() {
    let unit = std::fs::read_to_string("systemd/kube-object-lock.service").expect("unit");
    let out = tempfile::tempdir().expect("tempdir");
    let stale = out.path().join("man/kube-object-lock-gone.1");
    std::fs::create_dir_all(stale.parent().expect("dir")).expect("mkdir");
    std::fs::write(&stale, "a page of a subcommand since removed").expect("write");
    let written = generate::write_all(out.path(), &unit).expect("write");
    assert_eq!(written, generate::all(&unit).expect("files").len());
    assert!(!stale.exists(), "stale page left");
    // The paths the package's assets (Cargo.toml) take them from.
    for path in [
        "man/kube-object-lock.1",
        "man/kube-object-lock-serve.1",
        "man/kubectl-lock.1",
        "man/kubectl-unlock.1",
        "completions/bash/kubectl-lock",
        "completions/zsh/_kube-object-lock",
        "completions/fish/kubectl-unlock.fish",
        "kubectl_complete-lock",
        "kube-object-lock.service",
    ] {
        assert!(out.path().join(path).is_file(), "{path}");
    }
}

/// Runs a binary of the crate; its stdout, after asserting it succeeded.
fn run_bin(bin: &str, args: &[&str]) -> Vec<u8> {
    let out = Command::new(bin).args(args).output().expect("run");
    assert!(out.status.success(), "{bin} {args:?}: {out:?}");
    out.stdout
}

#[test]
fn the_binaries_print_the_packaged_completion_and_write_the_packaged_man_pages() {
    let server = env!("CARGO_BIN_EXE_kube-object-lock");
    let plugin = env!("CARGO_BIN_EXE_kubectl-lock");
    for (shell, path) in [
        ("bash", "completions/bash/kube-object-lock"),
        ("zsh", "completions/zsh/_kube-object-lock"),
        ("fish", "completions/fish/kube-object-lock.fish"),
    ] {
        let (bin, cmd) = generate::commands().swap_remove(0);
        let packaged = text(&generate::completions(cmd, bin))
            .remove(path)
            .expect(path);
        let printed = String::from_utf8(run_bin(server, &["completion", shell])).expect("utf-8");
        assert_eq!(printed, packaged, "{shell}");
    }
    // The plugin: both command names in one script, and kubectl's plugin completion.
    let bash = String::from_utf8(run_bin(plugin, &["completion", "bash"])).expect("utf-8");
    assert!(bash.contains("default kubectl-lock\n") && bash.contains("default kubectl-unlock\n"));
    let kubectl = run_bin(plugin, &["completion", "kubectl"]);
    let packaged = generate::kubectl_complete(&LockCli::command(), &UnlockCli::command());
    assert_eq!(String::from_utf8(kubectl).expect("utf-8"), packaged);

    // `man DIR`: the package's pages, each binary its own.
    let dir = tempfile::tempdir().expect("tempdir");
    let (server_dir, plugin_dir) = (dir.path().join("server"), dir.path().join("plugin"));
    run_bin(server, &["man", server_dir.to_str().expect("utf-8")]);
    run_bin(plugin, &["man", plugin_dir.to_str().expect("utf-8")]);
    let mut packaged = BTreeMap::new();
    for (_, cmd) in generate::commands() {
        packaged.extend(text(&generate::man_pages(cmd).expect("man pages")));
    }
    let mut written = BTreeMap::new();
    for d in [&server_dir, &plugin_dir] {
        for entry in std::fs::read_dir(d).expect("read_dir") {
            let entry = entry.expect("entry");
            let name = format!("man/{}", entry.file_name().to_string_lossy());
            written.insert(name, std::fs::read_to_string(entry.path()).expect("page"));
        }
    }
    assert_eq!(written, packaged);

    // A directory that cannot be made: one error line naming it.
    let out = Command::new(plugin)
        .args(["man", "/proc/no/such/dir"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("/proc/no/such/dir"), "{stderr}");
}

#[test]
fn both_binaries_print_the_version_with_the_commit() {
    for (name, bin) in [
        ("kube-object-lock", env!("CARGO_BIN_EXE_kube-object-lock")),
        ("kubectl-lock", env!("CARGO_BIN_EXE_kubectl-lock")),
    ] {
        let out = String::from_utf8(run_bin(bin, &["--version"])).expect("utf-8");
        let commit = out
            .trim_end()
            .strip_prefix(&format!("{name} {} (commit ", env!("CARGO_PKG_VERSION")))
            .and_then(|rest| rest.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{name}: {out}"));
        assert!(!commit.is_empty() && !commit.contains(' '), "{name}: {out}");
    }
}
