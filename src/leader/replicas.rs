//! Replica reports: how the leader knows what every ready replica serves.
//!
//! Each replica (leader or not) keeps its own coordination.k8s.io Lease
//! `<lease-name>-replica-<identity>` in the namespace, renewed every `--lease-renew`, with
//! annotations giving the SHA-256 fingerprint of the leaf it serves, of the CA that leaf chains
//! to in the live caBundle, and whether it is ready. The leader counts only fresh reports
//! (renewTime + leaseDurationSeconds in the future) and deletes reports that went stale long
//! ago. This works the same for pods on a cluster and for processes on the local control plane.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};

use super::ca::Fingerprint;
use super::rotation::ReplicaReport;
use super::webhook_config::MANAGED_BY;

pub const REPLICA_OF_LABEL: &str = "overcommit.dev/replica-of";
pub const LEAF_ANNOTATION: &str = "overcommit.dev/leaf-sha256";
pub const ISSUER_ANNOTATION: &str = "overcommit.dev/ca-sha256";
pub const READY_ANNOTATION: &str = "overcommit.dev/ready";

/// What one replica says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SelfReport {
    pub ready: bool,
    pub leaf: Option<Fingerprint>,
    pub issuer: Option<Fingerprint>,
}

/// A DNS-1123 subdomain-safe Lease name for this identity.
pub fn replica_lease_name(lease_name: &str, identity: &str) -> String {
    let mut id: String = identity
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let prefix = format!("{lease_name}-replica-");
    id.truncate(253usize.saturating_sub(prefix.len()));
    let name = format!("{prefix}{id}");
    name.trim_end_matches(['-', '.']).to_string()
}

/// The Lease a replica writes about itself.
pub fn report_lease(
    lease_name: &str,
    identity: &str,
    ttl: Duration,
    now: Timestamp,
    r: &SelfReport,
) -> Lease {
    let mut annotations = BTreeMap::from([(READY_ANNOTATION.to_string(), r.ready.to_string())]);
    if let Some(fp) = r.leaf {
        annotations.insert(LEAF_ANNOTATION.into(), fp.to_hex());
    }
    if let Some(fp) = r.issuer {
        annotations.insert(ISSUER_ANNOTATION.into(), fp.to_hex());
    }
    Lease {
        metadata: ObjectMeta {
            name: Some(replica_lease_name(lease_name, identity)),
            labels: Some(BTreeMap::from([
                (REPLICA_OF_LABEL.to_string(), lease_name.to_string()),
                (MANAGED_BY.0.to_string(), MANAGED_BY.1.to_string()),
            ])),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.to_string()),
            lease_duration_seconds: Some(ttl.as_secs().clamp(1, i32::MAX as u64) as i32),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    }
}

/// When a report stops counting (renewTime + duration); None if it has no usable times.
pub fn expires_at(lease: &Lease) -> Option<Timestamp> {
    let spec = lease.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref()?.0;
    let secs = spec.lease_duration_seconds?;
    renewed
        .checked_add(SignedDuration::from_secs(i64::from(secs)))
        .ok()
}

/// The report of a fresh Lease; None when stale or unreadable (an unreadable fresh report
/// counts as a ready replica serving nothing known, so it blocks dropping the old CA).
pub fn fresh_report(lease: &Lease, now: Timestamp) -> Option<ReplicaReport> {
    if expires_at(lease)? <= now {
        return None;
    }
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    let fp = |key: &str| annotations.get(key).and_then(|v| Fingerprint::from_hex(v));
    Some(ReplicaReport {
        identity: lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default(),
        ready: annotations
            .get(READY_ANNOTATION)
            .is_none_or(|v| v != "false"),
        leaf: fp(LEAF_ANNOTATION),
        issuer: fp(ISSUER_ANNOTATION),
    })
}

/// Reports older than this past their expiry are deleted by the leader.
pub const STALE_GRACE: SignedDuration = SignedDuration::from_secs(60);

/// Write this replica's report (create, or replace its own Lease).
pub async fn write_report(api: &Api<Lease>, lease: &Lease) -> Result<(), kube::Error> {
    let name = lease.metadata.name.clone().unwrap_or_default();
    match api.get_opt(&name).await? {
        None => api.create(&PostParams::default(), lease).await.map(|_| ()),
        Some(existing) => {
            let mut next = lease.clone();
            next.metadata.resource_version = existing.metadata.resource_version;
            api.replace(&name, &PostParams::default(), &next)
                .await
                .map(|_| ())
        }
    }
}

/// Remove this replica's report (on shutdown), so it stops counting at once.
pub async fn delete_report(api: &Api<Lease>, name: &str) {
    if let Err(e) = api.delete(name, &DeleteParams::default()).await {
        tracing::debug!(error = %e, lease = name, "could not delete own replica report");
    }
}

/// All fresh reports, and deletion of long-stale ones (leader only; precondition on each).
pub async fn fresh_reports(
    api: &Api<Lease>,
    lease_name: &str,
    now: Timestamp,
    collect_garbage: bool,
) -> Result<Vec<ReplicaReport>, kube::Error> {
    let list = api
        .list(&ListParams::default().labels(&format!("{REPLICA_OF_LABEL}={lease_name}")))
        .await?;
    let mut out = Vec::new();
    for lease in list.items {
        if let Some(report) = fresh_report(&lease, now) {
            out.push(report);
            continue;
        }
        let stale = expires_at(&lease)
            .and_then(|t| t.checked_add(STALE_GRACE).ok())
            .is_none_or(|t| t <= now);
        if collect_garbage && stale {
            let name = lease.metadata.name.clone().unwrap_or_default();
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: lease.metadata.resource_version.clone(),
                    uid: None,
                }),
                ..Default::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => tracing::info!(lease = %name, "deleted stale replica report"),
                Err(e) => {
                    tracing::debug!(lease = %name, error = %e, "stale replica report not deleted")
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    #[test]
    fn names_table() {
        let cases = [
            (
                "kube-overcommit-leader",
                "pod-abc-123",
                "kube-overcommit-leader-replica-pod-abc-123",
            ),
            ("l", "Host_Name", "l-replica-host-name"),
            ("l", "a.b.", "l-replica-a.b"),
        ];
        for (lease, id, want) in cases {
            assert_eq!(replica_lease_name(lease, id), want);
        }
        assert!(replica_lease_name("l", &"x".repeat(400)).len() <= 253);
    }

    #[test]
    fn freshness_table() {
        let leaf = Fingerprint::of_der(b"leaf");
        let ca = Fingerprint::of_der(b"ca");
        let report = SelfReport {
            ready: true,
            leaf: Some(leaf),
            issuer: Some(ca),
        };
        let lease = report_lease("l", "r1", Duration::from_secs(15), now(), &report);
        let cases = [(0, true), (14, true), (15, false), (100, false)];
        for (later, fresh) in cases {
            let at = now() + SignedDuration::from_secs(later);
            assert_eq!(fresh_report(&lease, at).is_some(), fresh, "+{later}s");
        }
        let got = fresh_report(&lease, now()).unwrap();
        assert_eq!(
            (got.identity.as_str(), got.ready, got.leaf, got.issuer),
            ("r1", true, Some(leaf), Some(ca))
        );
        let not_ready = report_lease(
            "l",
            "r2",
            Duration::from_secs(15),
            now(),
            &SelfReport::default(),
        );
        assert!(!fresh_report(&not_ready, now()).unwrap().ready);
        assert_eq!(fresh_report(&Lease::default(), now()), None);
    }
}
