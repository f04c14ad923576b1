package install_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
)

// fastLeader: failovers within seconds.
var fastLeader = []string{"--lease-ttl=4s", "--lease-renew=1s", "--check-interval=1s", "--shutdown-grace=5s"}

// An installation on an empty control plane bootstraps (leader, Secrets, webhook
// configuration, 3 ready backends); the leader killed gives way to another and starts again
// under its name; a replica restarts after SIGTERM; a stopped replica leaves the Service; Stop leaves no process and no backend.
func TestInstallLifecycle(t *testing.T) {
	c := harness.Start(t, harness.Options{})
	ctx := harness.Context(t, 5*time.Minute)
	in, err := install.Install(ctx, c, install.Options{Replicas: 3, CRD: install.DefaultCRD(), SecretDelay: time.Second, Args: fastLeader})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = in.Stop()
		}
	})
	if err := in.WaitBootstrapped(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.CoreV1().Namespaces().Get(ctx, install.DefaultNamespace, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	leader := in.Leader(ctx)
	if leader == nil {
		t.Fatalf("lease holder %q is none of %v", in.LeaderIdentity(ctx), in.Summary())
	}
	// Killed: another replica takes the Lease once it expires. (Restarted at once with the same
	// identity, as a container in the same pod, it may legitimately take its own Lease back.)
	id := leader.Identity()
	if err := leader.Kill(); err != nil {
		t.Fatal(err)
	}
	var next string
	if err := harness.Eventually(60*time.Second, 200*time.Millisecond, func() error {
		next = in.LeaderIdentity(ctx)
		if next == "" || next == id {
			return fmt.Errorf("lease holder %q", next)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	if leader.Identity() != id || leader.Starts() != 2 {
		t.Fatalf("a container restart keeps the identity: %s", in.Summary())
	}
	// Restart with SIGTERM: the ordered shutdown, then the same identity again.
	if err := in.Replica(2).Restart(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := in.WaitReady(3, time.Minute); err != nil {
		t.Fatal(err)
	}

	r := in.Replica(0)
	pids := map[int]bool{}
	for _, x := range in.Replicas() {
		pids[x.PID()] = true
	}
	if err := r.Stop(); err != nil {
		t.Fatal(err)
	}
	if r.Alive() || r.Ready() {
		t.Fatal("stopped replica still alive or ready")
	}
	if err := c.WaitBackendsReady(in.Namespace, in.Service, 2, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(); err != nil {
		t.Fatal(err)
	}
	if err := in.WaitReady(3, time.Minute); err != nil {
		t.Fatal(err)
	}
	pids[r.PID()] = true

	stopped = true
	if err := in.Uninstall(ctx, false); err != nil {
		t.Fatal(err)
	}
	for pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("replica process %d still runs after Stop", pid)
		}
	}
	// The resolver publishes what it reads every 400 ms.
	if err := harness.Eventually(5*time.Second, 200*time.Millisecond, func() error {
		st, err := c.ResolverState(in.Namespace, in.Service)
		if err != nil || len(st) > 0 {
			return fmt.Errorf("backends still registered: %v %v", st, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, in.WebhookConfig, metav1.GetOptions{}); err == nil {
		t.Fatal("Uninstall left the webhook configuration")
	}
}

// With Replace, a killed replica comes back as a new pod would: a new identity, same ports.
func TestInstallReplace(t *testing.T) {
	c := harness.Start(t, harness.Options{})
	ctx := harness.Context(t, 4*time.Minute)
	in, err := install.Install(ctx, c, install.Options{Namespace: "ko-replace", Replicas: 2, CRD: install.DefaultCRD(),
		Replace: true, RestartDelay: 500 * time.Millisecond, Args: fastLeader})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = in.Stop() })
	if err := in.WaitBootstrapped(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	r := in.Replica(1)
	old, listen := r.Identity(), r.Listen
	if _, err := r.Signal(syscall.SIGKILL, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := harness.Eventually(30*time.Second, 100*time.Millisecond, func() error {
		if !r.Alive() || r.Identity() == old {
			return fmt.Errorf("not replaced yet: %s", in.Summary())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if r.Generation() != 2 || r.Identity() != "ko-replace-1-g2" || r.Listen != listen {
		t.Fatalf("replacement: generation %d identity %s listen %s", r.Generation(), r.Identity(), r.Listen)
	}
	if err := in.WaitReady(2, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := in.Stop(); err != nil {
		t.Fatal(err)
	}
	if r.Alive() {
		t.Fatal("Stop left a replica (or its replacement) running")
	}
}
