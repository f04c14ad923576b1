//! `kube-overcommit compile-inprocess`: print the MutatingAdmissionPolicy and binding that
//! apply the static policies of a policy file in the API server (`overcommit_core::inprocess`),
//! as a JSON List, and which policies stay on the webhook (stderr).

use std::io::Write;
use std::path::PathBuf;

use overcommit_core::inprocess;

#[derive(Debug, clap::Args)]
pub struct CompileArgs {
    /// Policies to compile: a YAML file of one or more OvercommitPolicy documents.
    #[arg(long, env = "KUBE_OVERCOMMIT_POLICY_FILE")]
    pub policy_file: PathBuf,
}

pub fn run(args: &CompileArgs) -> anyhow::Result<()> {
    let policies = crate::review::read_policy_file(&args.policy_file)?;
    let compiled = inprocess::compile(&policies);
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [compiled.policy, compiled.binding],
    });
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, &list)?;
    stdout.write_all(b"\n")?;
    stdout.flush()?;
    eprintln!(
        "in-process: {}; webhook: {}",
        compiled.in_process.join(","),
        compiled.webhook.join(",")
    );
    Ok(())
}
