//! Command line: `serve`, `review`, `rotate`, `crd`. Flags have env fallbacks.

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "kube-overcommit",
    version,
    about = "Mutating admission webhook that overcommits node allocatable by policy"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the AdmissionReview response `serve` would give for a review: try policies offline.
    Review(crate::review::ReviewArgs),
    /// Print the OvercommitPolicy CustomResourceDefinition (YAML).
    Crd,
}

pub fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Review(args) => crate::review::run(&args),
        Command::Crd => crate::review::run_crd(),
    }
}
