#![forbid(unsafe_code)]
//! The `kube-object-lock` binary: parse, set up, hand off to the library; errors become exit
//! codes (1 = failure or denied, 2 = bad input, 3 = `check` could not read the locks).

use std::io::Write;
use std::process::ExitCode;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use kube_object_lock::admission::Outcome;
use kube_object_lock::cli::{Cli, Command, certs};
use kube_object_lock::settings::{LogFormat, LogSettings, LogTarget, Settings};
use kube_object_lock::{api, app, cli, systemd, telemetry};

fn main() -> ExitCode {
    // One crypto provider for the server and the kube client alike.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    // Before the runtime starts its threads: taking the socket changes the environment.
    if matches!(cli.command, Command::Serve(_))
        && let Err(e) = systemd::take_passed_listener()
    {
        return fail(1, anyhow::Error::new(e).context("cannot start the webhook"));
    }
    let runtime = match kube_object_lock::runtime(tokio::runtime::Builder::new_multi_thread()) {
        Ok(rt) => rt,
        Err(e) => return fail(2, anyhow::anyhow!(e)),
    };
    runtime.block_on(run(cli))
}

async fn run(cli: Cli) -> ExitCode {
    let done = |()| ExitCode::SUCCESS;
    let result = match cli.command {
        Command::Serve(args) => serve(&args).await,
        Command::Certs(args) => certs::generate(&args).map_err(Into::into).map(|written| {
            for path in written {
                println!("wrote {}", path.display());
            }
            ExitCode::SUCCESS
        }),
        Command::Crd => (api::crds_yaml().context("cannot render the CRDs")).map(|yaml| {
            print!("{yaml}");
            ExitCode::SUCCESS
        }),
        Command::Manifests(command) => manifests(&command).map(done),
        Command::Completion(args) => {
            let script = cli::generate::completion(Cli::command(), "kube-object-lock", args.shell);
            (std::io::stdout().write_all(&script))
                .context("cannot print the completion")
                .map(done)
        }
        Command::Man(args) => cli::generate::write_man_pages(Cli::command(), &args.dir)
            .with_context(|| format!("cannot write the man pages into {}", args.dir.display()))
            .map(done),
        Command::Check(args) => return check(&args).await,
    };
    result.unwrap_or_else(|e| fail(1, e))
}

async fn check(args: &cli::CheckArgs) -> ExitCode {
    let settings = match Settings::load(&args.layers()) {
        Ok(s) => s,
        Err(e) => return fail(2, e.into()),
    };
    // A command's output: always stderr, whatever the settings say.
    let _ = telemetry::init(&LogSettings {
        level: "warn".to_owned(),
        format: LogFormat::Text,
        target: LogTarget::Stderr,
    });
    match cli::check::check(&settings, &args.review).await {
        Ok(result) => {
            // A closed pipe (`| head`) is not an error of the check.
            let _ = writeln!(std::io::stdout(), "{}", result.response);
            if result.outcome == Outcome::Error {
                eprintln!(
                    "kube-object-lock: could not decide: the locks could not be read from {} (the answer above is on_lookup_error's)",
                    result.source
                );
            }
            ExitCode::from(result.exit_code())
        }
        Err(e) => fail(e.exit_code(), e.into()),
    }
}

async fn serve(args: &cli::ServeArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::load(&args.layers()).context("invalid settings")?;
    telemetry::init(&settings.log)?;
    let webhook = app::Webhook::bind(settings, None, Default::default())
        .await
        .context("cannot start the webhook")?;
    // Connections left after the grace period were cut; the stop itself was still orderly.
    webhook
        .run(app::shutdown_signal(), app::reload_signal())
        .await;
    Ok(ExitCode::SUCCESS)
}

fn manifests(command: &cli::ManifestsCommand) -> anyhow::Result<()> {
    use kube_object_lock::cli::manifests as m;
    match command {
        cli::ManifestsCommand::Cluster(args) => {
            let reg = args.registration.registration()?;
            let yaml = if args.broad {
                m::cluster_broad(&reg)?
            } else {
                m::cluster(&reg)?
            };
            print!("{yaml}")
        }
        cli::ManifestsCommand::Alerts(args) => print!("{}", m::alerts::alerts(args)?),
        cli::ManifestsCommand::Static(args) => {
            print!("{}", m::static_manifest(&args.registration()?)?)
        }
        cli::ManifestsCommand::Apiserver(args) => {
            let seen_at = args
                .apiserver_dir
                .clone()
                .or_else(|| args.dir.clone())
                .unwrap_or_else(|| m::DEFAULT_APISERVER_DIR.into());
            let files = m::apiserver(
                &args.url,
                &args.client_cert,
                &args.client_key,
                &seen_at,
                args.static_manifests_dir.as_deref(),
            )?;
            match &args.dir {
                Some(dir) => {
                    for path in m::write_apiserver(dir, &files)? {
                        println!("wrote {}", path.display());
                    }
                }
                None => print!(
                    "# {}\n{}---\n# {}\n{}",
                    m::ADMISSION_CONFIG_FILE,
                    files.admission_config,
                    m::KUBECONFIG_FILE,
                    files.kubeconfig
                ),
            }
        }
    }
    Ok(())
}

fn fail(code: u8, error: anyhow::Error) -> ExitCode {
    // On a journal stream, `<3>` makes this line's priority err (`journalctl -p err`).
    let priority = if telemetry::stderr_is_journal() {
        "<3>"
    } else {
        ""
    };
    eprintln!(
        "{priority}kube-object-lock: {}",
        kube_object_lock::error_chain(error.as_ref())
    );
    ExitCode::from(code)
}
