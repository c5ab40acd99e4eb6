#![forbid(unsafe_code)]
//! The `kubectl-lock` binary, also installed as `kubectl-unlock`: parse, run, print. Exit codes:
//! 0 done, 1 failed, 2 bad command line, or with a command after `--` the command's own status
//! and the codes of `plugin::run`; every failure ends with one `error: ...` line on stderr.

use std::process::ExitCode;

use kube_object_lock::plugin;

fn main() -> ExitCode {
    // One crypto provider for the kube client, as in the webhook binary.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let invocation = match plugin::parse(std::env::args_os()) {
        Ok(invocation) => invocation,
        // --help and --version
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{}", plugin::one_line(&e));
            return ExitCode::from(2);
        }
    };
    let result = match kube_object_lock::runtime(tokio::runtime::Builder::new_current_thread()) {
        Ok(runtime) => runtime.block_on(plugin::run(invocation)),
        Err(e) => Err(plugin::PluginError::Message(e)),
    };
    match result {
        Ok(report) => {
            print!("{}", report.stdout);
            for note in report.notes {
                eprintln!("note: {note}");
            }
            ExitCode::from(report.exit_code)
        }
        Err(e) => {
            let message = kube_object_lock::error_chain(&e);
            let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
            eprintln!("error: {message}");
            ExitCode::from(e.exit_code())
        }
    }
}
