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

/// The flags of one command line as kubectl's completion offers them.
struct FlagTable {
    /// `--long` and `-s` forms, each with its help's first line.
    flags: Vec<(String, String)>,
    /// Forms that take the next word as their value.
    with_value: Vec<String>,
    /// Forms with a fixed set of values, and those values.
    values: Vec<(String, Vec<String>)>,
}

impl FlagTable {
    fn of(cmd: &Command) -> FlagTable {
        let mut table = FlagTable {
            flags: Vec::new(),
            with_value: Vec::new(),
            values: Vec::new(),
        };
        for arg in cmd.get_arguments() {
            if arg.is_positional() || arg.is_hide_set() {
                continue;
            }
            let help = arg
                .get_help()
                .map(|h| h.to_string())
                .unwrap_or_default()
                .lines()
                .next()
                .unwrap_or_default()
                .to_owned();
            let mut forms = Vec::new();
            if let Some(long) = arg.get_long() {
                forms.push(format!("--{long}"));
            }
            if let Some(short) = arg.get_short() {
                forms.push(format!("-{short}"));
            }
            let takes_value = arg.get_action().takes_values()
                && arg.get_num_args().is_some_and(|n| n.min_values() > 0);
            let possible: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_owned())
                .collect();
            for form in forms {
                table.flags.push((form.clone(), help.clone()));
                if takes_value {
                    table.with_value.push(form.clone());
                    if !possible.is_empty() {
                        table.values.push((form, possible.clone()));
                    }
                }
            }
        }
        table
    }

    /// A shell function printing the flags, one `FLAG<TAB>HELP` a line.
    fn flags_function(&self, name: &str) -> String {
        let mut out = format!("{name}() {{\n    cat <<'FLAGS'\n");
        for (flag, help) in &self.flags {
            let _ = writeln!(out, "{flag}\t{help}");
        }
        out.push_str("FLAGS\n}\n");
        out
    }
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
        .expect("kubectl lock has a list subcommand")
        .clone();
    let tables = [
        ("lock_flags", FlagTable::of(&lock)),
        ("list_flags", FlagTable::of(&list)),
        ("unlock_flags", FlagTable::of(&unlock)),
    ];
    let mut with_value: Vec<&str> = tables
        .iter()
        .flat_map(|(_, t)| t.with_value.iter().map(String::as_str))
        .collect();
    with_value.sort_unstable();
    with_value.dedup();
    let mut values = String::new();
    for (_, table) in &tables {
        for (flag, names) in &table.values {
            let _ = writeln!(values, "    {flag}) printf '%s\\n' {} ;;", names.join(" "));
        }
    }
    let (header, body) = SCRIPT.split_at(SCRIPT.find("\ncase ").expect("the script") + 1);
    let mut out = String::from(header);
    for (name, table) in &tables {
        out.push_str(&table.flags_function(name));
    }
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
