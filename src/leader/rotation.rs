//! The rotation decision: what the leader should do next, from what is stored in the API
//! server, the replicas' reports and the clock. Pure; the I/O loop (`controller`) executes one
//! action, reads the state back and asks again until the answer is `Wait`.
//!
//! CA rotation follows docs/architecture.md §6:
//! - `Published { since }`: the next CA is in the CA Secret beside the current one, and both
//!   are in the caBundle and in the serving Secret's `ca.crt`. Leaves still come from the
//!   current CA.
//! - after `since + propagation_delay`, once the live caBundle shows the next CA:
//!   `Switched { since }`, the serving leaf is issued from the next CA.
//! - when every fresh, ready replica reports a leaf from the next CA: the current CA is
//!   dropped, the next one becomes current, the phase is cleared.
//!
//! If the CA Secret is lost while the serving Secret still holds a working leaf, the new CA is
//! started as a rotation that keeps the orphaned CA certificate (without its key) trusted, so
//! replicas serving the old leaf stay trusted until they serve a new one.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};

use super::ca::{CertInfo, Fingerprint};

/// Where a CA rotation stands (stored as annotations on the CA Secret).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Idle,
    Published { since: Timestamp },
    Switched { since: Timestamp },
}

/// A rotation asked for by an operator (the `overcommit.dev/rotate` annotation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forced {
    Leaf,
    Ca,
}

/// The CA Secret as read.
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)] // one per decision, never stored in bulk
pub enum CaState {
    /// No CA Secret.
    Missing,
    /// A CA Secret exists but is unusable (no certificate, bad PEM, key does not match).
    Broken,
    Present {
        current: CertInfo,
        /// False when the current CA was carried over without its key (recovery).
        current_has_key: bool,
        next: Option<CertInfo>,
        phase: Phase,
    },
}

/// The serving Secret as read.
#[derive(Debug, Clone, PartialEq)]
pub enum LeafState {
    Missing,
    /// Present but tls.crt / tls.key unusable or not a pair.
    Broken,
    Present {
        leaf: CertInfo,
        /// CA certificates in its `ca.crt`, in order.
        bundle: Vec<CertInfo>,
    },
}

/// One replica's report (its own Lease), only fresh ones are passed in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaReport {
    pub identity: String,
    pub ready: bool,
    pub leaf: Option<Fingerprint>,
    pub issuer: Option<Fingerprint>,
}

/// Everything the decision looks at.
#[derive(Debug, Clone)]
pub struct Observed {
    pub now: Timestamp,
    pub ca: CaState,
    pub serving: LeafState,
    /// DNS names the leaf must carry.
    pub dns_names: Vec<String>,
    pub forced: Option<Forced>,
    /// Fingerprints of the CAs in the live webhook configuration's caBundle (None: no config).
    pub live_bundle: Option<Vec<Fingerprint>>,
    pub replicas: Vec<ReplicaReport>,
    pub propagation_delay: Duration,
}

/// Why a leaf is (re)issued (a log and metrics label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafReason {
    Missing,
    Invalid,
    WrongIssuer,
    WrongNames,
    Due,
    Forced,
}

impl LeafReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Invalid => "invalid",
            Self::WrongIssuer => "wrong-issuer",
            Self::WrongNames => "wrong-names",
            Self::Due => "due",
            Self::Forced => "forced",
        }
    }
}

/// The next thing to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// No usable CA: create one. With `carry_over`, the CA certificates the serving leaf chains
    /// to (from its ca.crt) stay trusted and the new CA starts as a rotation (`Published`).
    CreateCa { carry_over: Option<Fingerprint> },
    /// Generate the next CA and publish it beside the current one.
    StartCaRotation { forced: bool },
    /// Issue the serving leaf from the next CA and mark the phase `Switched`.
    SwitchToNextCa,
    /// Every ready replica serves a leaf from the next CA: drop the current one.
    FinishCaRotation,
    /// Issue a new serving leaf from the signing CA.
    IssueLeaf { reason: LeafReason },
    /// The serving Secret's ca.crt is not the trusted bundle: rewrite it, same leaf.
    SyncServingBundle,
    /// Clear an operator's request that needs nothing more (e.g. CA rotation already running).
    ClearForced,
    /// Nothing to do before `until` (or the next event).
    Wait { until: Timestamp },
}

impl Observed {
    /// The CA certificates that must be trusted now, current first.
    pub fn trusted(&self) -> Vec<&CertInfo> {
        match &self.ca {
            CaState::Present { current, next, .. } => {
                std::iter::once(current).chain(next.iter()).collect()
            }
            _ => Vec::new(),
        }
    }
}

fn after(ts: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| ts.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// Decide the next action.
pub fn decide(o: &Observed) -> Action {
    let (current, current_has_key, next, phase) = match &o.ca {
        CaState::Missing | CaState::Broken => return create_ca(o),
        CaState::Present {
            current,
            current_has_key,
            next,
            phase,
        } => (current, *current_has_key, next.as_ref(), *phase),
    };

    // A rotation phase without a next CA (hand edit): treat as idle. A next CA without a phase:
    // treat as just published, so it is waited for before use.
    let phase = match (phase, next) {
        (Phase::Idle, Some(_)) => Phase::Published { since: o.now },
        (_, None) => Phase::Idle,
        (p, Some(_)) => p,
    };
    let signing = match (phase, next) {
        (Phase::Switched { .. }, Some(next)) => next,
        _ => current,
    };

    // Operator requests first: a leaked key is the most urgent thing there is.
    match o.forced {
        Some(Forced::Ca) if phase == Phase::Idle => {
            return Action::StartCaRotation { forced: true };
        }
        Some(Forced::Ca) => return Action::ClearForced,
        _ => {}
    }

    let problem = leaf_problem(o, phase, signing);
    if let Some(action) = phase_action(o, phase, current, current_has_key, next, problem) {
        return action;
    }
    upkeep(o, phase, current)
}

/// No usable CA: create one, carrying over the CA that signed a leaf still served, if it is
/// still valid and in the served bundle.
fn create_ca(o: &Observed) -> Action {
    let carry_over = match &o.serving {
        LeafState::Present { leaf, bundle } if leaf.not_after > o.now => {
            super::ca::issuer_of(leaf, bundle).filter(|fp| {
                bundle
                    .iter()
                    .any(|ca| ca.fingerprint == *fp && ca.not_after > o.now)
            })
        }
        _ => None,
    };
    Action::CreateCa { carry_over }
}

/// What is wrong with the serving leaf, if anything. It must be usable and signed by a CA it
/// may come from: the signing CA, or while both are published either of them.
fn leaf_problem(o: &Observed, phase: Phase, signing: &CertInfo) -> Option<LeafReason> {
    let acceptable: Vec<CertInfo> = match phase {
        Phase::Published { .. } => o.trusted().into_iter().cloned().collect(),
        _ => vec![signing.clone()],
    };
    match &o.serving {
        LeafState::Missing => Some(LeafReason::Missing),
        LeafState::Broken => Some(LeafReason::Invalid),
        LeafState::Present { leaf, .. } => {
            if leaf.not_after <= o.now {
                Some(LeafReason::Invalid)
            } else if super::ca::issuer_of(leaf, &acceptable).is_none() {
                Some(LeafReason::WrongIssuer)
            } else if !o.dns_names.iter().all(|n| leaf.dns_names.contains(n)) {
                Some(LeafReason::WrongNames)
            } else if o.forced == Some(Forced::Leaf) {
                Some(LeafReason::Forced)
            } else if leaf.renew_at() <= o.now && leaf.not_after < signing.not_after {
                // (A leaf that already ends with its CA cannot be improved on: the CA's own
                // rotation comes first.)
                Some(LeafReason::Due)
            } else {
                None
            }
        }
    }
}

/// The phase's own step, if one is due: a leaf, the start, switch or end of a CA rotation.
fn phase_action(
    o: &Observed,
    phase: Phase,
    current: &CertInfo,
    current_has_key: bool,
    next: Option<&CertInfo>,
    leaf_problem: Option<LeafReason>,
) -> Option<Action> {
    match phase {
        Phase::Idle => {
            if let Some(reason) = leaf_problem {
                return Some(Action::IssueLeaf { reason });
            }
            if current.renew_at() <= o.now {
                return Some(Action::StartCaRotation { forced: false });
            }
        }
        Phase::Published { since } => {
            let next_live = next.is_some_and(|n| {
                o.live_bundle
                    .as_ref()
                    .is_some_and(|b| b.contains(&n.fingerprint))
            });
            let waited = after(since, o.propagation_delay) <= o.now;
            if next_live && waited {
                return Some(Action::SwitchToNextCa);
            }
            if let Some(reason) = leaf_problem {
                if current_has_key {
                    return Some(Action::IssueLeaf { reason });
                }
                // Without the current CA's key (recovery) a leaf can only come from the next CA:
                // switch early, but keep a leaf that still works until the next CA is live.
                let nothing_to_keep = matches!(reason, LeafReason::Missing | LeafReason::Invalid);
                if next_live || nothing_to_keep {
                    return Some(Action::SwitchToNextCa);
                }
            }
        }
        Phase::Switched { .. } => {
            if let Some(reason) = leaf_problem {
                return Some(Action::IssueLeaf { reason });
            }
            let Some(next) = next else {
                return Some(Action::Wait { until: o.now });
            };
            let ready: Vec<&ReplicaReport> = o.replicas.iter().filter(|r| r.ready).collect();
            let all_on_next =
                !ready.is_empty() && ready.iter().all(|r| r.issuer == Some(next.fingerprint));
            if all_on_next {
                return Some(Action::FinishCaRotation);
            }
        }
    }
    None
}

/// Nothing of the phase is due: the served bundle, a forced request to clear, or the wait.
fn upkeep(o: &Observed, phase: Phase, current: &CertInfo) -> Action {
    // The serving Secret's ca.crt must be exactly the trusted bundle.
    if let LeafState::Present { bundle, .. } = &o.serving {
        let want: Vec<Fingerprint> = o.trusted().iter().map(|c| c.fingerprint).collect();
        let have: Vec<Fingerprint> = bundle.iter().map(|c| c.fingerprint).collect();
        if want != have {
            return Action::SyncServingBundle;
        }
    }
    if o.forced.is_some() {
        return Action::ClearForced;
    }

    let mut until = current.renew_at();
    if let LeafState::Present { leaf, .. } = &o.serving {
        until = until.min(leaf.renew_at());
    }
    match phase {
        Phase::Published { since } => until = until.min(after(since, o.propagation_delay)),
        // Waiting on replicas' reports: look again at the next check.
        Phase::Switched { .. } => until = o.now,
        Phase::Idle => {}
    }
    Action::Wait {
        until: until.max(o.now),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::ca::{Issued, issue_ca, issue_leaf, parse_pem_bundle, service_dns_names};

    const DAY: u64 = 86_400;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn info(issued: &Issued) -> CertInfo {
        parse_pem_bundle(issued.cert_pem.as_bytes())
            .unwrap()
            .remove(0)
    }

    struct Fixture {
        old: Issued,
        old_ca: CertInfo,
        new_ca: CertInfo,
        leaf_old: CertInfo,
        leaf_new: CertInfo,
        leaf_old_due: CertInfo,
        leaf_wrong_names: CertInfo,
    }

    fn fixture() -> Fixture {
        let old = issue_ca(t(-30 * DAY as i64), Duration::from_secs(330 * DAY), "k").unwrap();
        let new = issue_ca(t(10), Duration::from_secs(300 * DAY), "k").unwrap();
        let names = service_dns_names("svc", "ns");
        let leaf = |ca: &Issued, at: i64, names: &[String]| {
            info(
                &issue_leaf(
                    &ca.cert_pem,
                    &ca.key_pem,
                    names,
                    t(at),
                    Duration::from_secs(7 * DAY),
                )
                .unwrap(),
            )
        };
        Fixture {
            old: old.clone(),
            old_ca: info(&old),
            new_ca: info(&new),
            leaf_old: leaf(&old, 100, &names),
            leaf_new: leaf(&new, 100, &names),
            leaf_old_due: leaf(&old, -(6 * DAY as i64), &names),
            leaf_wrong_names: leaf(&old, 100, &service_dns_names("other", "ns")),
        }
    }

    fn observed(f: &Fixture, ca: CaState, serving: LeafState) -> Observed {
        Observed {
            now: t(200),
            ca,
            serving,
            dns_names: service_dns_names("svc", "ns"),
            forced: None,
            live_bundle: Some(vec![f.old_ca.fingerprint]),
            replicas: vec![],
            propagation_delay: Duration::from_secs(120),
        }
    }

    fn idle(f: &Fixture) -> CaState {
        CaState::Present {
            current: f.old_ca.clone(),
            current_has_key: true,
            next: None,
            phase: Phase::Idle,
        }
    }

    fn rotating(f: &Fixture, phase: Phase) -> CaState {
        CaState::Present {
            current: f.old_ca.clone(),
            current_has_key: true,
            next: Some(f.new_ca.clone()),
            phase,
        }
    }

    fn serving(leaf: &CertInfo, bundle: &[&CertInfo]) -> LeafState {
        LeafState::Present {
            leaf: leaf.clone(),
            bundle: bundle.iter().map(|c| (*c).clone()).collect(),
        }
    }

    fn report(id: &str, ready: bool, issuer: &CertInfo) -> ReplicaReport {
        ReplicaReport {
            identity: id.into(),
            ready,
            leaf: None,
            issuer: Some(issuer.fingerprint),
        }
    }

    #[test]
    #[allow(clippy::vec_init_then_push)] // cases read best one by one, with their comments
    fn decision_table() {
        let f = fixture();
        let both = [&f.old_ca, &f.new_ca];
        let mut cases: Vec<(&str, Observed, Action)> = Vec::new();

        cases.push((
            "empty cluster: bootstrap",
            observed(&f, CaState::Missing, LeafState::Missing),
            Action::CreateCa { carry_over: None },
        ));
        cases.push((
            "CA Secret lost, leaf still works: carry its CA over",
            observed(&f, CaState::Missing, serving(&f.leaf_old, &[&f.old_ca])),
            Action::CreateCa {
                carry_over: Some(f.old_ca.fingerprint),
            },
        ));
        cases.push((
            "CA Secret broken, leaf missing",
            observed(&f, CaState::Broken, LeafState::Missing),
            Action::CreateCa { carry_over: None },
        ));
        cases.push((
            "serving Secret missing",
            observed(&f, idle(&f), LeafState::Missing),
            Action::IssueLeaf {
                reason: LeafReason::Missing,
            },
        ));
        cases.push((
            "serving Secret broken",
            observed(&f, idle(&f), LeafState::Broken),
            Action::IssueLeaf {
                reason: LeafReason::Invalid,
            },
        ));
        cases.push((
            "leaf from a foreign CA",
            observed(&f, idle(&f), serving(&f.leaf_new, &[&f.old_ca])),
            Action::IssueLeaf {
                reason: LeafReason::WrongIssuer,
            },
        ));
        cases.push((
            "leaf for other names",
            observed(&f, idle(&f), serving(&f.leaf_wrong_names, &[&f.old_ca])),
            Action::IssueLeaf {
                reason: LeafReason::WrongNames,
            },
        ));
        cases.push((
            "leaf at 2/3 of its life",
            observed(&f, idle(&f), serving(&f.leaf_old_due, &[&f.old_ca])),
            Action::IssueLeaf {
                reason: LeafReason::Due,
            },
        ));
        let mut o = observed(&f, idle(&f), serving(&f.leaf_old, &[&f.old_ca]));
        o.now = t(8 * DAY as i64);
        cases.push((
            "expired leaf",
            o,
            Action::IssueLeaf {
                reason: LeafReason::Invalid,
            },
        ));
        cases.push((
            "serving ca.crt out of date",
            observed(&f, idle(&f), serving(&f.leaf_old, &[&f.new_ca])),
            Action::SyncServingBundle,
        ));
        let all_good = observed(&f, idle(&f), serving(&f.leaf_old, &[&f.old_ca]));
        let until = f.leaf_old.renew_at();
        cases.push((
            "all good: wait for the leaf's 2/3",
            all_good.clone(),
            Action::Wait { until },
        ));
        let mut o = all_good.clone();
        o.forced = Some(Forced::Leaf);
        cases.push((
            "forced leaf",
            o,
            Action::IssueLeaf {
                reason: LeafReason::Forced,
            },
        ));
        let mut o = all_good.clone();
        o.forced = Some(Forced::Ca);
        cases.push(("forced CA", o, Action::StartCaRotation { forced: true }));
        let mut o = all_good.clone();
        o.now = t(201 * DAY as i64);
        o.serving = LeafState::Present {
            leaf: info_leaf_at(&f, 201 * DAY as i64),
            bundle: vec![f.old_ca.clone()],
        };
        cases.push((
            "CA at 2/3 of its life",
            o,
            Action::StartCaRotation { forced: false },
        ));

        // Phase 1: published, waiting out the propagation delay.
        let published = |since: i64| rotating(&f, Phase::Published { since: t(since) });
        let mut o = observed(&f, published(150), serving(&f.leaf_old, &both));
        o.live_bundle = Some(vec![f.old_ca.fingerprint, f.new_ca.fingerprint]);
        cases.push((
            "published, delay not over",
            o.clone(),
            Action::Wait { until: t(270) },
        ));
        let mut o2 = o.clone();
        o2.forced = Some(Forced::Ca);
        cases.push(("forced CA while rotating: clear", o2, Action::ClearForced));
        let mut o2 = o.clone();
        o2.now = t(300);
        cases.push(("published, delay over", o2.clone(), Action::SwitchToNextCa));
        let mut o3 = o2.clone();
        o3.live_bundle = Some(vec![f.old_ca.fingerprint]);
        cases.push((
            "published, delay over, caBundle not showing the next CA yet",
            o3,
            Action::Wait { until: o2.now },
        ));
        let mut o3 = observed(&f, published(150), serving(&f.leaf_old, &[&f.old_ca]));
        o3.live_bundle = o.live_bundle.clone();
        cases.push((
            "published: serving ca.crt gets both",
            o3,
            Action::SyncServingBundle,
        ));
        let o3 = observed(&f, published(150), serving(&f.leaf_old_due, &both));
        cases.push((
            "published: a due leaf still comes from the current CA",
            o3,
            Action::IssueLeaf {
                reason: LeafReason::Due,
            },
        ));
        let recovering = CaState::Present {
            current: f.old_ca.clone(),
            current_has_key: false,
            next: Some(f.new_ca.clone()),
            phase: Phase::Published { since: t(150) },
        };
        let o3 = observed(&f, recovering.clone(), serving(&f.leaf_old, &both));
        cases.push((
            "recovery: old leaf kept while the delay runs",
            o3,
            Action::Wait { until: t(270) },
        ));
        let o3 = observed(&f, recovering.clone(), LeafState::Missing);
        cases.push((
            "recovery: no leaf, switch at once",
            o3,
            Action::SwitchToNextCa,
        ));
        let mut o3 = observed(&f, recovering, serving(&f.leaf_old_due, &both));
        o3.live_bundle = Some(vec![f.old_ca.fingerprint, f.new_ca.fingerprint]);
        cases.push((
            "recovery: due leaf, next CA live: switch",
            o3,
            Action::SwitchToNextCa,
        ));

        // Phase 3/4: switched, waiting for every ready replica.
        let switched = rotating(&f, Phase::Switched { since: t(180) });
        let o = observed(&f, switched.clone(), serving(&f.leaf_old, &both));
        cases.push((
            "switched but the leaf is from the old CA (leader died mid-switch)",
            o,
            Action::IssueLeaf {
                reason: LeafReason::WrongIssuer,
            },
        ));
        let mut o = observed(&f, switched.clone(), serving(&f.leaf_new, &both));
        o.replicas = vec![report("a", true, &f.new_ca), report("b", true, &f.old_ca)];
        cases.push((
            "switched, one ready replica still old",
            o.clone(),
            Action::Wait { until: t(200) },
        ));
        o.replicas = vec![report("a", true, &f.new_ca), report("b", false, &f.old_ca)];
        cases.push((
            "switched, old one not ready: finish",
            o.clone(),
            Action::FinishCaRotation,
        ));
        o.replicas = vec![];
        cases.push((
            "switched, no reports at all: wait",
            o,
            Action::Wait { until: t(200) },
        ));
        let o = observed(
            &f,
            CaState::Present {
                current: f.old_ca.clone(),
                current_has_key: true,
                next: None,
                phase: Phase::Switched { since: t(100) },
            },
            serving(&f.leaf_old, &[&f.old_ca]),
        );
        cases.push(("phase without a next CA is idle", o, Action::Wait { until }));

        for (what, o, want) in cases {
            let got = decide(&o);
            match (&got, &want) {
                // Waiting: only the kind matters where the deadline depends on fixture timing.
                (Action::Wait { until: a }, Action::Wait { until: b }) => {
                    assert!(a <= b || a == b, "{what}: got {got:?}, want {want:?}")
                }
                _ => assert_eq!(got, want, "{what}"),
            }
        }
    }

    fn info_leaf_at(f: &Fixture, at: i64) -> CertInfo {
        let names = service_dns_names("svc", "ns");
        let leaf = issue_leaf(
            &f.old.cert_pem,
            &f.old.key_pem,
            &names,
            t(at),
            Duration::from_secs(7 * DAY),
        );
        info(&leaf.unwrap())
    }
}
