// Package e2e holds the end-to-end tests of the control plane itself (issue 2's done
// criteria). Other issues add their e2e tests beside these, using package harness.
package e2e

import (
	"fmt"
	"os"
	"testing"

	"kube-overcommit/tests/cluster/harness"
)

// shared is one control plane with 3 fake nodes for the tests of this package that can share
// it (each uses its own namespace / node prefix).
var shared *harness.Cluster

func TestMain(m *testing.M) {
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
