package main

import (
	"bytes"
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Object names of an installed kube-overcommit (src/leader defaults).
type names struct {
	Namespace, ServingSecret, CASecret, WebhookConfig, Lease string
}

func defaultNames(ns string) names {
	return names{Namespace: ns, ServingSecret: "kube-overcommit-tls", CASecret: "kube-overcommit-ca",
		WebhookConfig: "kube-overcommit", Lease: "kube-overcommit-leader"}
}

// target is what the fault scenarios act on: replicas as local processes or as pods.
type target interface {
	// Replicas is the desired replica count.
	Replicas() int
	// Ready names the ready replicas.
	Ready(ctx context.Context) []string
	// Stop ends one replica: graceful (SIGTERM / kubectl delete pod) or forced (SIGKILL /
	// --grace-period=0 --force). The replacement is started by the target (the Deployment).
	Stop(ctx context.Context, replica string, force bool) error
	// Leader names the replica that holds the Lease ("" if none known).
	Leader(ctx context.Context) string
	// Rotate asks the leader for a forced rotation (kube-overcommit rotate [--ca]).
	Rotate(ctx context.Context, ca bool) error
	// FaultKind names a stop for the report.
	FaultKind(force bool) string
}

type scenario struct {
	t      *Tally
	tg     target
	client kubernetes.Interface
	n      names
	// settle is how long to wait for every replica to be ready again.
	settle time.Duration
	// rotationTimeout bounds one rotation.
	rotationTimeout time.Duration
}

// waitAllReady waits until every replica is ready.
func (s *scenario) waitAllReady(ctx context.Context) error {
	return waitFor(ctx, s.settle, 200*time.Millisecond, "all replicas ready", func() error {
		if r := s.tg.Ready(ctx); len(r) < s.tg.Replicas() {
			return fmt.Errorf("%d of %d ready: %v", len(r), s.tg.Replicas(), r)
		}
		return nil
	})
}

// settlePhase waits until all replicas are ready again, in a phase of its own so that the
// writes of the recovery are not counted against the next fault kind. After a phase that
// requires every write mutated the recovery requires it too, and lasts long enough for the
// metrics scrape (every 2 s) to catch up, so that nothing of it is counted in the next phase.
func (s *scenario) settlePhase(ctx context.Context) {
	strict := s.t.Current().AllMutated
	s.t.Begin("settle", strict, false)
	if err := s.waitAllReady(ctx); err != nil && ctx.Err() == nil {
		s.t.Error("%v", err)
	}
	if strict {
		sleepCtx(ctx, 3*time.Second)
	}
}

// kills stops a random ready replica every interval for d, only when every replica is ready
// (so at least Replicas()-1 stay serving), and lets the target replace it.
func (s *scenario) kills(ctx context.Context, d, interval time.Duration, force bool) {
	end := time.Now().Add(d)
	for ctx.Err() == nil && time.Now().Before(end) {
		if err := s.waitAllReady(ctx); err != nil {
			if ctx.Err() == nil {
				s.t.Error("before a kill: %v", err)
			}
			return
		}
		ready := s.tg.Ready(ctx)
		if len(ready) == 0 {
			continue
		}
		victim := ready[int(time.Now().UnixNano()%int64(len(ready)))]
		if err := s.tg.Stop(ctx, victim, force); err != nil {
			s.t.Error("stop %s: %v", victim, err)
		} else {
			s.t.Fault(s.tg.FaultKind(force), fmt.Sprintf("%s (%d ready before)", victim, len(ready)))
		}
		sleepCtx(ctx, min(interval, time.Until(end)))
	}
}

func (s *scenario) secret(ctx context.Context, name string) (map[string][]byte, map[string]string, error) {
	sec, err := s.client.CoreV1().Secrets(s.n.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	return sec.Data, sec.Annotations, nil
}

func (s *scenario) killLeader(ctx context.Context, force bool, when string) {
	var leader string
	err := waitFor(ctx, s.settle, 200*time.Millisecond, "a leader", func() error {
		if leader = s.tg.Leader(ctx); leader == "" {
			return fmt.Errorf("no replica holds the Lease")
		}
		return nil
	})
	if err != nil {
		s.t.Error("kill the leader %s: %v", when, err)
		return
	}
	if err := s.tg.Stop(ctx, leader, force); err != nil {
		s.t.Error("stop leader %s %s: %v", leader, when, err)
		return
	}
	s.t.Fault("leader-"+s.tg.FaultKind(force), fmt.Sprintf("%s %s", leader, when))
}

// leafRotation kills the leader and requests a leaf rotation right after, while the Lease still
// names the dead leader: the next leader must carry it out. (A leaf rotation is one Secret
// write: a leader killed after the request, through kubectl, has usually done it already.)
func (s *scenario) leafRotation(ctx context.Context) {
	old, _, err := s.secret(ctx, s.n.ServingSecret)
	if err != nil {
		s.t.Error("read serving secret: %v", err)
		return
	}
	s.killLeader(ctx, true, "before a leaf rotation request")
	if err := s.tg.Rotate(ctx, false); err != nil {
		s.t.Error("request leaf rotation: %v", err)
		return
	}
	s.t.Fault("rotate-leaf", "requested while the Lease names the killed leader")
	err = waitFor(ctx, s.rotationTimeout, 250*time.Millisecond, "new leaf in the serving secret", func() error {
		cur, ann, err := s.secret(ctx, s.n.ServingSecret)
		if err != nil {
			return err
		}
		if bytes.Equal(cur["tls.crt"], old["tls.crt"]) || ann["overcommit.dev/rotate"] != "" {
			return fmt.Errorf("not rotated yet")
		}
		return nil
	})
	if err != nil {
		s.t.Error("%v", err)
	}
}

// caRotation forces a CA rotation and kills the leader in its phases (published, switched).
func (s *scenario) caRotation(ctx context.Context) {
	old, _, err := s.secret(ctx, s.n.CASecret)
	if err != nil {
		s.t.Error("read CA secret: %v", err)
		return
	}
	if err := s.tg.Rotate(ctx, true); err != nil {
		s.t.Error("request CA rotation: %v", err)
		return
	}
	s.t.Fault("rotate-ca", "requested")
	phase := func() (string, bool, error) {
		data, ann, err := s.secret(ctx, s.n.CASecret)
		if err != nil {
			return "", false, err
		}
		return ann["overcommit.dev/ca-rotation-phase"], !bytes.Equal(data["ca.crt"], old["ca.crt"]), nil
	}
	for i, want := range []string{"published", "switched"} {
		err := waitFor(ctx, s.rotationTimeout, 100*time.Millisecond, "CA rotation phase "+want, func() error {
			p, _, err := phase()
			if err != nil {
				return err
			}
			if p != want {
				return fmt.Errorf("phase %q", p)
			}
			return nil
		})
		if err != nil {
			s.t.Note("leader not killed in CA phase %s: %v", want, err)
			continue
		}
		s.killLeader(ctx, i == 0, "in CA rotation phase "+want)
	}
	err = waitFor(ctx, s.rotationTimeout, 250*time.Millisecond, "CA rotation finished", func() error {
		p, changed, err := phase()
		if err != nil {
			return err
		}
		if p != "" || !changed {
			return fmt.Errorf("phase %q, CA changed %v", p, changed)
		}
		return nil
	})
	if err != nil {
		s.t.Error("%v", err)
	}
}

// deletions deletes the serving Secret, the CA Secret and the webhook configuration, one at a
// time, and waits for the leader to put each back.
func (s *scenario) deletions(ctx context.Context) {
	del := func(kind, name string, remove func() error, exists func() error) {
		if err := remove(); err != nil && !apierrors.IsNotFound(err) {
			s.t.Error("delete %s %s: %v", kind, name, err)
			return
		}
		s.t.Fault("delete-"+kind, name)
		if err := waitFor(ctx, s.rotationTimeout, 200*time.Millisecond, kind+" "+name+" recreated", exists); err != nil {
			s.t.Error("%v", err)
			return
		}
		if err := s.waitAllReady(ctx); err != nil && ctx.Err() == nil {
			s.t.Error("after deleting %s: %v", kind, err)
		}
		sleepCtx(ctx, 3*time.Second)
	}
	secrets := s.client.CoreV1().Secrets(s.n.Namespace)
	for _, name := range []string{s.n.ServingSecret, s.n.CASecret} {
		del("secret", name,
			func() error { return secrets.Delete(ctx, name, metav1.DeleteOptions{}) },
			func() error { _, err := secrets.Get(ctx, name, metav1.GetOptions{}); return err })
	}
	mwc := s.client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	del("webhookconfiguration", s.n.WebhookConfig,
		func() error { return mwc.Delete(ctx, s.n.WebhookConfig, metav1.DeleteOptions{}) },
		func() error { _, err := mwc.Get(ctx, s.n.WebhookConfig, metav1.GetOptions{}); return err })
}

func leaseHolder(ctx context.Context, client kubernetes.Interface, n names) string {
	l, err := client.CoordinationV1().Leases(n.Namespace).Get(ctx, n.Lease, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	if l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil &&
		time.Since(l.Spec.RenewTime.Time) > time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second {
		return ""
	}
	return *l.Spec.HolderIdentity
}
