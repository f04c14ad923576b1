// Package e2e holds the end-to-end tests of the control plane itself (issue 2's done
// criteria). Other issues add their e2e tests beside these, using package harness.
//
// The tests mostly wait (kubelet periods, leases, timers), so they run in parallel: every test
// calls onShared or ownControlPlane first. Tests on the shared control plane run one at a time
// (they share its global objects: webhook configurations, policies, APIServices, the API server
// itself), beside the tests that start control planes of their own, of which at most
// `go test -parallel N` run at once (default 3). `-parallel 1` runs every test alone, as before.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"

	"kube-overcommit/tests/cluster/harness"
)

// shared is one control plane with 3 fake nodes for the tests of this package that can share
// it (each uses its own namespace / node prefix).
var shared *harness.Cluster

// defaultControlPlanes: own control planes at once when -parallel is not given. Measured on 2
// cores (tests/cluster/README.md): 3 cut the package's time most without moving the timing
// assertions' figures near their bounds.
const defaultControlPlanes = 3

var (
	// sharedTurn is held by a test for its whole run: one test at a time on the shared control
	// plane (and, with -parallel 1 or $KCP_KUBECONFIG, one test at a time in all).
	sharedTurn sync.Mutex
	// controlPlanes holds a token per own control plane running.
	controlPlanes chan struct{}
	// alone: -parallel 1, or every test on one external control plane ($KCP_KUBECONFIG).
	alone bool
)

func TestMain(m *testing.M) {
	if err := setParallel(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	c, err := harness.New(harness.Options{Nodes: 3})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared = c
	code := m.Run()
	if err := c.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	if !c.External {
		_ = os.RemoveAll(c.RunDir)
	}
	os.Exit(code)
}

// setParallel takes -parallel as the number of own control planes at once and raises the
// testing package's own bound above the number of tests: a test waiting for its turn on the
// shared control plane must not hold one of its slots.
func setParallel() error {
	flag.Parse()
	n := defaultControlPlanes
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if set {
		v, err := strconv.Atoi(flag.Lookup("test.parallel").Value.String())
		if err != nil || v < 1 {
			return fmt.Errorf("-parallel %q: want a positive number", flag.Lookup("test.parallel").Value)
		}
		n = v
	}
	alone = n == 1 || os.Getenv("KCP_KUBECONFIG") != ""
	controlPlanes = make(chan struct{}, n)
	return flag.Set("test.parallel", "1000")
}

// onShared: the test uses the shared control plane; it runs when no other test uses it.
func onShared(t *testing.T) {
	t.Parallel()
	takeSharedTurn(t)
}

// takeSharedTurn waits until no other test uses the shared control plane and holds it until
// the test ends. For a parallel test that first waits for something of its own.
func takeSharedTurn(t *testing.T) {
	sharedTurn.Lock()
	t.Cleanup(sharedTurn.Unlock)
}

// ownControlPlane: the test starts a control plane of its own (harness.Start); it runs when one
// of the -parallel slots is free. With $KCP_KUBECONFIG harness.Start connects to that one
// control plane instead, so the test then runs alone like those on the shared one.
func ownControlPlane(t *testing.T) {
	t.Parallel()
	if alone {
		takeSharedTurn(t)
		return
	}
	controlPlanes <- struct{}{}
	// Registered before harness.Start's cleanup, so run after it: the slot is free once the
	// control plane has stopped.
	t.Cleanup(func() { <-controlPlanes })
}

// longestOwnControlPlane: ownControlPlane for the longest test (TestQuietHeartbeats: 7.5 minutes
// of waiting on 3 fake kubelets and 2 replicas), which takes no slot, so that it starts at once
// and the others run in its shadow.
func longestOwnControlPlane(t *testing.T) {
	t.Parallel()
	if alone {
		takeSharedTurn(t)
	}
}
