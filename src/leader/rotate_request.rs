//! `kube-overcommit rotate [--ca]`: ask the leader for a forced rotation (an operator who
//! suspects a leaked key). It sets `overcommit.dev/rotate` on the serving Secret, the single
//! mechanism; the leader acts on it and clears it. With `--wait`, waits for that.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use super::store::{ROTATE_ANNOTATION, ROTATE_AT_ANNOTATION};

/// `rotate` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RotateArgs {
    /// Rotate the CA (all four phases) instead of only the serving leaf.
    #[arg(long)]
    pub ca: bool,
    /// Namespace of the webhook.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_NAMESPACE",
        default_value = "kube-overcommit"
    )]
    pub namespace: String,
    /// The serving Secret.
    #[arg(
        long,
        env = "KUBE_OVERCOMMIT_SERVING_SECRET",
        default_value = "kube-overcommit-tls"
    )]
    pub serving_secret: String,
    /// Wait until the leader has taken the request (cleared the annotation), at most this long.
    #[arg(long, value_parser = crate::duration::duration_arg)]
    pub wait: Option<Duration>,
}

#[derive(Debug, thiserror::Error)]
pub enum RotateError {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the leader did not take the request within {0:?} (is a leader running?)")]
    Timeout(Duration),
}

/// Annotate the serving Secret; optionally wait until the leader clears it.
pub async fn request(client: Client, args: &RotateArgs) -> Result<(), RotateError> {
    let api: Api<Secret> = Api::namespaced(client, &args.namespace);
    let kind = if args.ca { "ca" } else { "leaf" };
    let patch = json!({ "metadata": { "annotations": {
        ROTATE_ANNOTATION: kind,
        ROTATE_AT_ANNOTATION: jiff::Timestamp::now().to_string(),
    }}});
    api.patch(
        &args.serving_secret,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    println!(
        "requested a {kind} rotation on secret {}/{}",
        args.namespace, args.serving_secret
    );
    let Some(limit) = args.wait else {
        return Ok(());
    };
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let s = api.get(&args.serving_secret).await?;
        let pending = s
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(ROTATE_ANNOTATION));
        if !pending {
            println!("the leader took the request");
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(RotateError::Timeout(limit));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The `rotate` subcommand (binary edge: anyhow).
pub async fn run(args: RotateArgs) -> anyhow::Result<()> {
    let client = Client::try_default()
        .await
        .map_err(|e| anyhow::anyhow!("rotate needs a cluster (kubeconfig or in-cluster): {e}"))?;
    request(client, &args).await?;
    Ok(())
}
