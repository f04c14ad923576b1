//! Command line: `serve` (and `review`, `crd`, `rotate` from the other parts). Every flag
//! also reads an environment variable `KUBE_OVERCOMMIT_<FLAG>`.

use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};

use crate::server::serve::{self, ServeArgs};

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
    /// Ask the leader for a forced rotation of the serving leaf (or, with --ca, of the CA).
    Rotate(crate::leader::rotate::RotateArgs),
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

fn init_tracing(args: &LogArgs) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let res = match args.log_format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    res.map_err(|e| anyhow::anyhow!("initialising logging: {e}"))
}

pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing(&cli.log)?;
    match cli.command {
        Command::Serve(args) => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            let res = rt.block_on(serve::run(*args));
            // Tasks still running (file watchers, aborted connections) get a moment, no more.
            rt.shutdown_timeout(Duration::from_millis(100));
            res
        }
        Command::Review(args) => crate::review::run(&args),
        Command::Crd => crate::review::run_crd(),
        Command::Rotate(args) => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            rt.block_on(crate::leader::rotate::run(args))
        }
    }
}
