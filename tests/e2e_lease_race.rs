//! Leader election against a REAL kube-apiserver (tests/cluster's `kcp`): replicas racing for a
//! free Lease (expired, or released) never both win. Every acquisition is a replace carrying the
//! resourceVersion read, so the API server lets one through and answers the others 409; a
//! merge patch without it (kube-leader-election 0.44, used before) let the chaos run see two
//! replicas "acquire" the same expired Lease 5 ms apart. A Lease is judged on locally observed
//! time only: a holder whose clock is behind keeps it while it renews, and a huge duration is
//! capped at the racers' own TTL. Needs the local control plane, so it
//! is ignored for `cargo test` and run with `--ignored` (make test-e2e).

mod common;

use std::time::Duration;

use common::ControlPlane;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_overcommit::leader::lease_lock::{LeaseLock, Outcome};

const RACERS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the local control plane (make test-e2e)"]
async fn racing_replicas_never_both_acquire_the_lease() {
    let cp = ControlPlane::up();
    let kubeconfig = Kubeconfig::read_from(cp.kubeconfig()).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    let api: Api<Lease> = Api::namespaced(client, "default");
    let ttl = Duration::from_secs(2);
    let locks: Vec<LeaseLock> = (0..RACERS)
        .map(|i| LeaseLock::new(api.clone(), "race".into(), format!("replica-{i}"), ttl))
        .collect();

    // Rounds: none yet (create), then released by the winner (step down), then expired (the
    // winner stops renewing for longer than the TTL).
    let mut last_winner: Option<usize> = None;
    for round in ["created", "released", "expired"] {
        match (round, last_winner) {
            ("released", Some(w)) => {
                assert!(locks[w].step_down().await.expect("step down"), "{round}");
            }
            ("expired", Some(_)) => tokio::time::sleep(ttl + Duration::from_millis(500)).await,
            _ => {}
        }
        let outcomes =
            futures::future::join_all(locks.iter().map(|l| l.try_acquire_or_renew())).await;
        let winners: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter(|(_, o)| matches!(o, Ok(Outcome::Leading)))
            .map(|(i, _)| i)
            .collect();
        for o in &outcomes {
            assert!(o.is_ok(), "{round}: {o:?}");
        }
        // A racer that read the Lease after the winner's write sees it held and waits; one
        // that read before writes and gets 409: either way exactly one leads.
        assert_eq!(winners.len(), 1, "{round}: winners {winners:?}");
        let stored = api.get("race").await.expect("lease");
        let holder = stored
            .spec
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        assert_eq!(holder, format!("replica-{}", winners[0]), "{round}");
        // The winner renews; the others keep waiting.
        assert_eq!(
            locks[winners[0]]
                .try_acquire_or_renew()
                .await
                .expect("renew"),
            Outcome::Leading,
            "{round}"
        );
        let other = (winners[0] + 1) % RACERS;
        assert_eq!(
            locks[other].try_acquire_or_renew().await.expect("try"),
            Outcome::NotLeading,
            "{round}"
        );
        eprintln!("{round}: replica-{} won, {} lost", winners[0], RACERS - 1);
        last_winner = Some(winners[0]);
    }
    skewed_and_greedy_holder(&api, ttl).await;
}

/// Write the Lease "skewed" as its holder would: `renewTime` an hour behind this machine's
/// clock (the holder's clock is behind), with `seconds` as its duration.
async fn hold_skewed(api: &Api<Lease>, seconds: i32) {
    let behind = jiff::Timestamp::now() - jiff::SignedDuration::from_hours(1);
    let mut lease = api
        .get_opt("skewed")
        .await
        .expect("get")
        .unwrap_or_default();
    lease.metadata.name = Some("skewed".into());
    lease.spec = Some(LeaseSpec {
        holder_identity: Some("far-away".into()),
        lease_duration_seconds: Some(seconds),
        acquire_time: Some(MicroTime(behind)),
        renew_time: Some(MicroTime(behind)),
        ..LeaseSpec::default()
    });
    if lease.metadata.resource_version.is_some() {
        api.replace("skewed", &PostParams::default(), &lease)
            .await
            .expect("renew");
    } else {
        api.create(&PostParams::default(), &lease)
            .await
            .expect("create");
    }
}

/// Racers that have not seen the Lease unchanged for their own TTL never take it, whatever its
/// renewTime says: a holder whose clock is an hour behind keeps it while it renews. A holder
/// that writes a huge leaseDurationSeconds and stops renewing loses it after the racers' own
/// TTL (capped), to exactly one of them.
async fn skewed_and_greedy_holder(api: &Api<Lease>, ttl: Duration) {
    let locks: Vec<LeaseLock> = (0..RACERS)
        .map(|i| LeaseLock::new(api.clone(), "skewed".into(), format!("racer-{i}"), ttl))
        .collect();
    let race = || async {
        let outcomes =
            futures::future::join_all(locks.iter().map(|l| l.try_acquire_or_renew())).await;
        outcomes
            .iter()
            .filter(|o| matches!(o, Ok(Outcome::Leading)))
            .count()
    };
    // The holder renews (each time an hour behind here) for longer than the TTL: nobody takes it.
    let renewing_until = tokio::time::Instant::now() + ttl * 2;
    while tokio::time::Instant::now() < renewing_until {
        hold_skewed(api, 15).await;
        assert_eq!(
            race().await,
            0,
            "a renewed Lease taken for its old renewTime"
        );
    }
    // It writes i32::MAX seconds and stops: one racer takes it after the own TTL, not never.
    hold_skewed(api, i32::MAX).await;
    let seen = tokio::time::Instant::now();
    assert_eq!(race().await, 0, "taken at first sight");
    let deadline = seen + ttl * 5;
    loop {
        let winners = race().await;
        assert!(winners <= 1, "{winners} racers took the Lease");
        if winners == 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nobody took a Lease unchanged for 5 x the own TTL (its duration not capped?)"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen.elapsed() >= ttl,
        "taken before the own TTL: {:?}",
        seen.elapsed()
    );
    let holder = api
        .get("skewed")
        .await
        .expect("lease")
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(holder.starts_with("racer-"), "{holder}");
    eprintln!(
        "skewed: held while renewed; {holder} took it {:?} after it stopped",
        seen.elapsed()
    );
}
