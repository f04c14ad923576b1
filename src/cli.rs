//! Command line: `serve`, `review`, `crd`, `rotate`, `status`. Every flag also reads an environment
//! variable `KUBE_OVERCOMMIT_<FLAG>`; every duration flag takes the one grammar of
//! `crate::duration`.

use std::time::Duration;

use anyhow::Context as _;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::app::{self, ServeArgs};

#[derive(Debug, Parser)]
#[command(
    name = "kube-overcommit",
    version,
    about = "Mutating admission webhook that overcommits node allocatable by policy"
)]
pub struct Cli {
    #[command(flatten)]
    pub log: LogArgs,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the admission webhook (HTTPS) and the probe/metrics port (HTTP).
    Serve(Box<ServeArgs>),
    /// Print the AdmissionReview response `serve` would give for a review: try policies offline.
    Review(crate::review::ReviewArgs),
    /// Print the OvercommitPolicy CustomResourceDefinition (YAML).
    Crd,
    /// Print the MutatingAdmissionPolicy and binding (a JSON List) that apply the static
    /// policies of a policy file inside the API server.
    CompileInprocess(crate::compile_in_process::CompileArgs),
    /// Ask the leader for a forced rotation of the serving leaf (or, with --ca, of the CA).
    Rotate(crate::leader::rotate_request::RotateArgs),
    /// One row per node: policy, raw and written allocatable, requested, usage (like
    /// `kubectl top nodes`). Also `kubectl overcommit status` with the binary installed as
    /// `kubectl-overcommit` on the PATH.
    Status(crate::status::StatusArgs),
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Logging flags; the level comes from RUST_LOG (default `info`).
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log line format.
    #[arg(
        long,
        global = true,
        env = "KUBE_OVERCOMMIT_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

/// `default` is the level without RUST_LOG: `info` for the server, `error` for commands a
/// person reads the output of.
fn init_tracing(args: &LogArgs, default: &str) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let res = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    res.map_err(|e| anyhow::anyhow!("initialising logging: {e}"))
}

/// The name kubectl runs a plugin by: `kubectl overcommit ...` runs `kubectl-overcommit ...`.
pub const KUBECTL_PLUGIN: &str = "kubectl-overcommit";

pub fn main() -> anyhow::Result<()> {
    let invoked_as_plugin = std::env::args_os()
        .next()
        .and_then(|arg0| {
            std::path::Path::new(&arg0)
                .file_name()
                .map(|n| n == KUBECTL_PLUGIN)
        })
        .unwrap_or(false);
    let mut command = Cli::command();
    if invoked_as_plugin {
        // Help and errors name the command as the user typed it.
        command = command.bin_name("kubectl overcommit");
    }
    let cli = Cli::from_arg_matches_mut(&mut command.get_matches()).unwrap_or_else(|e| e.exit());
    let default_level = match cli.command {
        Command::Status(_) => "error",
        _ => "info",
    };
    init_tracing(&cli.log, default_level)?;
    match cli.command {
        Command::Serve(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let res = rt.block_on(app::run(*args));
            // Tasks still running (file watchers, aborted connections) get a moment, no more.
            rt.shutdown_timeout(Duration::from_millis(100));
            res
        }
        Command::Review(args) => crate::review::run(&args),
        Command::Crd => crate::review::run_crd(),
        Command::CompileInprocess(args) => crate::compile_in_process::run(&args),
        Command::Rotate(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(crate::leader::rotate_request::run(args))
        }
        Command::Status(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(crate::status::run(args))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::any::TypeId;
    use std::time::Duration;

    use clap::CommandFactory;

    use super::*;

    /// The subcommand's required flags, each with a placeholder value.
    fn required(sub: &str) -> Vec<String> {
        let cli = Cli::command();
        let Some(sub) = cli.find_subcommand(sub) else {
            return Vec::new();
        };
        sub.get_arguments()
            .filter(|arg| arg.is_required_set())
            .filter_map(|arg| arg.get_long())
            .flat_map(|long| [format!("--{long}"), "placeholder".to_owned()])
            .collect()
    }

    /// Every flag of every subcommand whose value is a `Duration`, as (subcommand, long name).
    fn duration_flags() -> Vec<(String, String)> {
        let cli = Cli::command();
        let mut out = Vec::new();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                if arg.get_value_parser().type_id() == TypeId::of::<Duration>() {
                    let long = arg.get_long().expect("duration flags are long flags");
                    out.push((sub.get_name().to_owned(), long.to_owned()));
                }
            }
        }
        out
    }

    #[test]
    fn every_duration_flag_takes_the_one_grammar() {
        let flags = duration_flags();
        // The enumeration is not vacuous: these are among them.
        for known in [
            "idle-timeout",
            "lease-ttl",
            "ca-validity",
            "shutdown-grace",
            "policy-reload-interval",
            "wait",
        ] {
            assert!(flags.iter().any(|(_, f)| f == known), "{known}: {flags:?}");
        }
        let cases = [
            ("120", Duration::from_secs(120)),
            ("500ms", Duration::from_millis(500)),
            ("10s", Duration::from_secs(10)),
            ("2m", Duration::from_secs(120)),
            ("1h30m", Duration::from_secs(5400)),
            ("7d", Duration::from_secs(7 * 86_400)),
        ];
        for (sub, flag) in &flags {
            for (text, want) in cases {
                let mut argv = vec![
                    "kube-overcommit".to_owned(),
                    sub.clone(),
                    format!("--{flag}"),
                ];
                argv.push(text.to_owned());
                argv.extend(required(sub));
                let matches = Cli::command()
                    .try_get_matches_from(argv)
                    .unwrap_or_else(|e| panic!("{sub} --{flag} {text}: {e}"));
                let got = matches
                    .subcommand_matches(sub)
                    .and_then(|m| m.get_one::<Duration>(&flag.replace('-', "_")).copied());
                assert_eq!(got, Some(want), "{sub} --{flag} {text}");
            }
            let mut argv = vec![
                "kube-overcommit".to_owned(),
                sub.clone(),
                format!("--{flag}"),
            ];
            argv.push("1.5s".to_owned());
            argv.extend(required(sub));
            assert!(
                Cli::command().try_get_matches_from(argv).is_err(),
                "{sub} --{flag} 1.5s"
            );
        }
    }

    #[test]
    fn named_duration_flags_parse() {
        for argv in [
            &["kube-overcommit", "serve", "--idle-timeout", "120"][..],
            &["kube-overcommit", "serve", "--lease-ttl", "2m"],
            &["kube-overcommit", "serve", "--ca-validity", "365d"],
        ] {
            let cli = Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            let Command::Serve(args) = cli.command else {
                panic!("not serve");
            };
            let want = match argv[2] {
                "--idle-timeout" => (args.server.idle_timeout, Duration::from_secs(120)),
                "--lease-ttl" => (args.leader.lease_ttl, Duration::from_secs(120)),
                _ => (args.leader.ca_validity, Duration::from_secs(365 * 86_400)),
            };
            assert_eq!(want.0, want.1, "{argv:?}");
        }
    }
}
