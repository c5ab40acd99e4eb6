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

/// What `kubectl lock completion` prints.
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
    let mut out = String::from(HEADER);
    for (name, table) in &tables {
        out.push_str(&table.flags_function(name));
    }
    let _ = write!(
        out,
        "takes_value() {{\n    case \"$1\" in\n    {}) return 0 ;;\n    esac\n    return 1\n}}\n\
         values_of() {{\n    case \"$1\" in\n{values}    esac\n}}\n",
        with_value.join(" | ")
    );
    out.push_str(BODY);
    out
}

const HEADER: &str = r#"#!/bin/sh
# Completion of `kubectl lock` and `kubectl unlock` for kubectl 1.26+, which runs this program
# (as kubectl_complete-lock or kubectl_complete-unlock) with the words typed after the plugin's
# name, the last one being the word to complete. Prints the candidates, one a line (then a tab
# and what it is), then `:4` (no file names). The flags come from kubectl-lock's own command
# line; resource types and object names from the cluster, with a 2 s request timeout (3 s in
# all), and none when it cannot be asked.
# Printed by `kubectl lock completion kubectl` from its own command line: do not edit.

"#;

const BODY: &str = r#"
case "${0##*/}" in
*unlock) cmd=unlock ;;
*) cmd=lock ;;
esac
tab="$(printf '\t')"

# The words before the last: the cluster flags (passed on to kubectl), the positionals.
kubeconfig="" context="" namespace="" expect="" first="" positional=0 list=no cur=""
last=$#
i=0
for word in "$@"; do
    i=$((i + 1))
    if [ "$i" -eq "$last" ]; then
        cur=$word
        break
    fi
    if [ -n "$expect" ]; then
        case "$expect" in
        --kubeconfig) kubeconfig=$word ;;
        --context) context=$word ;;
        -n | --namespace) namespace=$word ;;
        esac
        expect=""
        continue
    fi
    case "$word" in
    --kubeconfig=*) kubeconfig=${word#*=} ;;
    --context=*) context=${word#*=} ;;
    --namespace=*) namespace=${word#*=} ;;
    -n?*) namespace=${word#-n} ;;
    -*) if takes_value "$word"; then expect=$word; fi ;;
    *)
        positional=$((positional + 1))
        if [ "$positional" -eq 1 ]; then
            first=$word
            if [ "$cmd" = lock ] && [ "$word" = list ]; then list=yes; fi
        fi
        ;;
    esac
done

# kubectl with the cluster flags typed so far; nothing at all when it fails or is slow.
k() {
    command -v kubectl >/dev/null 2>&1 || return 0
    set -- --request-timeout=2s ${kubeconfig:+"--kubeconfig=$kubeconfig"} \
        ${context:+"--context=$context"} "$@"
    if command -v timeout >/dev/null 2>&1; then
        timeout 3 kubectl "$@" 2>/dev/null
    else
        kubectl "$@" 2>/dev/null
    fi
}
# The candidates that start with the word being completed.
emit() {
    while IFS= read -r line; do
        case "${line%%"$tab"*}" in
        "$cur"*) printf '%s\n' "$line" ;;
        esac
    done
}
resources() { k api-resources --verbs=delete -o name; }
names() { # RESOURCE: the names of its objects in the namespace typed (or the context's)
    k get "$1" -o name ${namespace:+"--namespace=$namespace"} | sed 's|^[^/]*/||'
}
flags() {
    if [ "$cmd" = unlock ]; then
        unlock_flags
    elif [ "$list" = yes ]; then
        list_flags
    else
        lock_flags
    fi
}

if [ -n "$expect" ]; then
    case "$expect" in
    --kubeconfig)
        echo ':0' # file names
        exit 0
        ;;
    -n | --namespace) k get namespaces -o name | sed 's|^namespace/||' | emit ;;
    --context) k config get-contexts -o name | emit ;;
    *) values_of "$expect" | emit ;;
    esac
    echo ':4'
    exit 0
fi

case "$cur" in
-*) flags | emit ;;
*/*)
    resource=${cur%%/*}
    names "$resource" | while IFS= read -r name; do printf '%s/%s\n' "$resource" "$name"; done | emit
    ;;
*)
    if [ "$list" = yes ]; then
        :
    elif [ "$positional" -eq 0 ]; then
        {
            if [ "$cmd" = lock ]; then printf 'list\t%s\n' 'list the locks'; fi
            resources
        } | emit
    elif [ "$positional" -eq 1 ]; then
        case "$first" in
        */*) ;;
        *) names "$first" | emit ;;
        esac
    fi
    ;;
esac
echo ':4'
"#;
