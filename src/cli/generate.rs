//! Files generated from the command lines, printed or written by the binaries themselves
//! (`kube-object-lock completion|man`, `kubectl lock completion|man`) and packaged from the same
//! code: man pages (clap_mangen, a page per subcommand), bash/zsh/fish/elvish/PowerShell
//! completion (clap_complete), and kubectl's plugin completion `kubectl_complete-lock`, a shell
//! script whose flag tables come from `kubectl-lock`'s command line.

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use clap::{Command, ValueEnum};
pub use clap_complete::Shell;

/// Writes the man page of `cmd` and of each of its visible subcommands (`NAME-SUB.1`) into
/// `dir` (created if missing).
pub fn write_man_pages(cmd: Command, dir: &Path) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    clap_mangen::generate_to(cmd, dir)
}

/// The completion script of the binary `bin` for `shell`.
pub fn completion(mut cmd: Command, bin: &str, shell: Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, bin, &mut script);
    script
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PluginShell {
    /// kubectl-lock and kubectl-unlock typed as commands, in bash.
    Bash,
    /// ... in zsh.
    Zsh,
    /// ... in fish.
    Fish,
    /// `kubectl_complete-lock`, the program kubectl (1.26+) runs to complete `kubectl lock` and
    /// `kubectl unlock` (install it on PATH under both names, `kubectl_complete-unlock` too).
    Kubectl,
}

/// `kubectl_complete-lock`: kubectl (1.26+) runs it with the words typed after `kubectl lock`
/// (as `kubectl_complete-unlock`, after `kubectl unlock`), the last being the one to complete.
/// Flags and their values come from the command lines; resource types and object names from
/// the cluster, with a 2 s request timeout (3 s in all), printing nothing when it cannot answer.
pub fn kubectl_complete(lock: &Command, unlock: &Command) -> String {
    let (mut lock, mut unlock) = (lock.clone(), unlock.clone());
    lock.build();
    unlock.build();
    let list = lock
        .find_subcommand("list")
        .expect("kubectl lock has a list subcommand");
    let (header, body) = SCRIPT.split_at(SCRIPT.find("\ncase ").expect("the script") + 1);
    let (mut out, mut with_value, mut values) = (header.to_owned(), Vec::new(), String::new());
    // A shell function per command line printing its flags, one `FLAG<TAB>HELP` a line.
    for (name, cmd) in [("lock", &lock), ("list", list), ("unlock", &unlock)] {
        let _ = write!(out, "{name}_flags() {{\n    cat <<'FLAGS'\n");
        for arg in cmd.get_arguments() {
            if arg.is_positional() || arg.is_hide_set() {
                continue;
            }
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            let help = help.lines().next().unwrap_or_default();
            let takes_value = arg.get_action().takes_values()
                && arg.get_num_args().is_some_and(|n| n.min_values() > 0);
            let possible: Vec<String> = (arg.get_possible_values().iter())
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_owned())
                .collect();
            let long = arg.get_long().map(|long| format!("--{long}"));
            for form in long
                .into_iter()
                .chain(arg.get_short().map(|s| format!("-{s}")))
            {
                let _ = writeln!(out, "{form}\t{help}");
                if takes_value && !possible.is_empty() {
                    let _ = writeln!(
                        values,
                        "    {form}) printf '%s\\n' {} ;;",
                        possible.join(" ")
                    );
                }
                if takes_value {
                    with_value.push(form);
                }
            }
        }
        out.push_str("FLAGS\n}\n");
    }
    with_value.sort_unstable();
    with_value.dedup();
    let _ = write!(
        out,
        "takes_value() {{\n    case \"$1\" in\n    {}) return 0 ;;\n    esac\n    return 1\n}}\n\
         values_of() {{\n    case \"$1\" in\n{values}    esac\n}}\n",
        with_value.join(" | ")
    );
    out.push('\n');
    out.push_str(body);
    out
}

/// The script; the flag tables go between its header comment and its first `case`.
const SCRIPT: &str = include_str!("kubectl_complete.sh");
