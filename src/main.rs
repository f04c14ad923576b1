//! The kube-overcommit binary: parse the command line, run.
#![forbid(unsafe_code)]

fn main() -> anyhow::Result<()> {
    kube_overcommit::cli::main()
}
