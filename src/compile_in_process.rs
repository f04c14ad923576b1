//! `kube-overcommit compile-inprocess`: print the MutatingAdmissionPolicy and binding that
//! apply the static policies of a policy file in the API server (`overcommit_core::in_process`),
//! as a JSON List, and which policies stay on the webhook (stderr). Both objects are named
//! like the ones the leader keeps (`--webhook-config-name`, same env var and default), so a
//! compiled policy applied by hand and the one `serve --mode in-process` keeps are the same
//! object; so is `--heartbeat-refresh`. With `serve --in-process-policy operator` this output,
//! applied by the operator or GitOps, is the only writer of both objects.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use overcommit_core::in_process;
use overcommit_core::policy::PolicySet;
use serde_json::Value;

use crate::duration::duration_arg;
use crate::leader::in_process_policy::named;
use crate::leader::{DEFAULT_CONFIG_NAME, DEFAULT_SERVICE_ACCOUNT, service_account_user};

#[derive(Debug, clap::Args)]
pub struct CompileArgs {
    /// Policies to compile: a YAML file of one or more OvercommitPolicy documents.
    #[arg(long, env = "KUBE_OVERCOMMIT_POLICY_FILE")]
    pub policy_file: PathBuf,
    /// Name of both objects: the name `serve --webhook-config-name` gives the ones the leader
    /// keeps in in-process mode.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_WEBHOOK_CONFIG_NAME",
        default_value = DEFAULT_CONFIG_NAME
    )]
    pub webhook_config_name: String,
    /// Quiet heartbeats' refresh period, as `serve --heartbeat-refresh` (0: none compiled). The
    /// compiled rule cannot read a clock: a stored heartbeat's age is counted from the
    /// heartbeat the kubelet sends (its clock), where the webhook counts from the time of the
    /// review.
    #[arg(long, env = "KUBE_OVERCOMMIT_HEARTBEAT_REFRESH", default_value = "5m", value_parser = duration_arg)]
    pub heartbeat_refresh: Duration,
    /// The namespace the replicas run in, as `serve --namespace`: with --service-account, the
    /// user whose node status writes (the leader's nudges) the compiled policy takes.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_NAMESPACE",
        default_value = "kube-overcommit"
    )]
    pub namespace: String,
    /// The replicas' ServiceAccount, as `serve --service-account`.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_SERVICE_ACCOUNT",
        default_value = DEFAULT_SERVICE_ACCOUNT
    )]
    pub service_account: String,
}

/// The JSON List of the compiled policy and binding named `name`, and the policies compiled
/// and left to the webhook.
pub fn output(
    policies: &PolicySet,
    name: &str,
    heartbeat_refresh: Duration,
    nudger: &str,
) -> (Value, Vec<String>, Vec<String>) {
    let compiled = in_process::compile(policies, heartbeat_refresh, nudger);
    let (policy, binding) = named(compiled.policy, compiled.binding, name);
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [policy, binding],
    });
    (list, compiled.in_process, compiled.webhook)
}

pub fn run(args: &CompileArgs) -> anyhow::Result<()> {
    let policies = crate::review::read_policy_file(&args.policy_file)?;
    let nudger = service_account_user(&args.namespace, &args.service_account);
    let (list, in_process, webhook) = output(
        &policies,
        &args.webhook_config_name,
        args.heartbeat_refresh,
        &nudger,
    );
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut stdout, &list)?;
    stdout.write_all(b"\n")?;
    stdout.flush()?;
    eprintln!(
        "in-process: {}; webhook: {}",
        in_process.join(","),
        webhook.join(",")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::in_process_policy::desired;
    use crate::mode::Path;
    use clap::Parser;

    const STATIC: &str = "apiVersion: overcommit.dev/v1alpha1\nkind: OvercommitPolicy\nmetadata: {name: s}\nspec:\n  nodeRatios: {cpu: \"2\"}\n";

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        compile: CompileArgs,
    }

    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        leader: crate::leader::LeaderArgs,
    }

    #[derive(Parser)]
    struct ServeAll {
        #[command(flatten)]
        serve: crate::app::ServeArgs,
    }

    #[test]
    fn named_like_the_leaders_objects() {
        let set =
            PolicySet::new(overcommit_core::policy::parse_policy_file(STATIC).unwrap()).unwrap();
        let refresh = Duration::from_secs(300);
        for name in ["kube-overcommit", "other"] {
            let nudger = "system:serviceaccount:kube-overcommit:kube-overcommit";
            let (list, in_process, _) = output(&set, name, refresh, nudger);
            let want = desired(&set, Path::InProcess, name, refresh, nudger).unwrap();
            assert_eq!(list["items"][0], want.policy, "{name}: policy");
            assert_eq!(list["items"][1], want.binding, "{name}: binding");
            assert_eq!(list["items"][1]["spec"]["policyName"], name, "{name}");
            assert_eq!(in_process, want.in_process, "{name}");
        }
    }

    #[test]
    fn same_flag_and_default_as_serve() {
        let compile = Cli::try_parse_from(["x", "--policy-file", "p"]).unwrap();
        let serve = Serve::try_parse_from(["x"]).unwrap();
        assert_eq!(
            compile.compile.webhook_config_name,
            serve.leader.webhook_config_name
        );
        assert_eq!(compile.compile.webhook_config_name, "kube-overcommit");
        assert_eq!(
            compile.compile.heartbeat_refresh,
            ServeAll::try_parse_from(["x"])
                .unwrap()
                .serve
                .heartbeat_refresh
        );
        assert_eq!(compile.compile.heartbeat_refresh, Duration::from_secs(300));
        let off =
            Cli::try_parse_from(["x", "--policy-file", "p", "--heartbeat-refresh", "0"]).unwrap();
        assert_eq!(off.compile.heartbeat_refresh, Duration::ZERO);
        let named =
            Cli::try_parse_from(["x", "--policy-file", "p", "--webhook-config-name", "n"]).unwrap();
        assert_eq!(named.compile.webhook_config_name, "n");
        assert_eq!(
            service_account_user(&compile.compile.namespace, &compile.compile.service_account),
            service_account_user("kube-overcommit", &serve.leader.service_account),
        );
    }
}
