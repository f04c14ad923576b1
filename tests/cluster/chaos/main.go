// Command chaos injects faults into kube-overcommit while fake nodes keep writing their status
// and pods keep being created, and checks the rules of docs/architecture.md §3 the whole time:
//
//	chaos local   [flags]   the local control plane of tests/cluster: replicas are processes of
//	                        the real binary; faults are SIGTERM/SIGKILL, the leader killed during
//	                        leaf and CA rotations, corrupted certificate files, deleted Secrets and
//	                        webhook configuration, an API server restart
//	chaos cluster [flags]   a real cluster with kube-overcommit installed (deploy/): faults are pod
//	                        deletions (graceful and forced) through kubectl and Secret /
//	                        configuration deletions; needs --kubeconfig, --context and --confirm
//	chaos cluster-local     chaos cluster against the local control plane, whose `kcp pod-runner`
//	                        kubelets run deploy/'s pods as processes of the release binary
//
// Each run ends with a table per phase (faults, status writes, failures, slow writes, mutated
// and not mutated writes, fail-open reviews, x509 errors, pods) and exits 1 when an invariant
// broke. See chaos/README.md.
package main

import (
	"fmt"
	"os"
)

const usage = `chaos: fault injection for kube-overcommit with invariant checks.

Usage:
  chaos local   [flags]   local control plane (tests/cluster), replicas as processes
  chaos cluster [flags]   a real cluster through kubectl (destructive: needs --confirm)
  chaos cluster-local [flags]
                          chaos cluster end to end on this machine: the local control plane
                          with kcp pod-runner as kubelets and deploy/ installed as pods

Run "chaos local --help" or "chaos cluster --help" for the flags.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var code int
	switch os.Args[1] {
	case "local":
		code = runLocal(os.Args[2:])
	case "cluster":
		code = runCluster(os.Args[2:])
	case "cluster-local":
		code = runClusterLocal(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "chaos: unknown mode %q\n\n%s", os.Args[1], usage)
		code = 2
	}
	os.Exit(code)
}

// verdict prints the end of a run and returns its exit status: 1 when the run could not be
// done (err) or an invariant broke, 0 when every invariant held.
func verdict(mode string, broken []string, err error) int {
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos %s: %v\n", mode, err)
		return 1
	}
	if len(broken) > 0 {
		fmt.Println("\nINVARIANTS BROKEN:")
		for _, b := range broken {
			fmt.Println("  - " + b)
		}
		return 1
	}
	fmt.Println("\nall invariants held")
	return 0
}
