// Command demo shows kube-overcommit on the local control plane of tests/cluster (`make demo`,
// through tests/cluster/demo.sh, which builds everything first):
//
//  1. a control plane with 3 fake nodes of 4 CPU / 8 GiB;
//  2. 3 replicas of the real binary (package install): the leader bootstraps the CA, the serving
//     Secret and the MutatingWebhookConfiguration;
//  3. a Deployment whose pods request 1 CPU each, more than fit: count the scheduled pods;
//  4. the policy (policy.yaml: cpu x2 on nodes labelled overcommit.dev/demo=true, two of the
//     three) applied: the next status writes of those nodes carry the inflated allocatable and
//     the scheduler places the pending pods; count again;
//  5. the policy deleted: the next status writes carry the kubelet's raw value again.
//
// Every wait is bounded. At the end everything stops and nothing is left running; with --keep
// (DEMO_KEEP=1, `make demo KEEP=1`) the control plane runs on in tests/cluster/.run with the
// replicas kept by a small detached process (`demo keep`) until `make cluster-down`.
//
//	demo run [--keep] [--nodes 3] [--cpu 4] [--memory 8Gi] [--pods 24] [--timeout 10m]
//	demo keep --run-dir DIR    (internal: keeps the replicas of a kept cluster; demo.sh down, which
//	                           make cluster-down calls, stops it)
package main

import (
	"fmt"
	"os"
)

const usage = `demo: kube-overcommit on the local control plane (make demo).

  demo run [--keep] [flags]   the demo; "demo run --help" for the flags
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var code int
	switch os.Args[1] {
	case "run":
		code = runDemo(os.Args[2:])
	case "keep":
		code = runKeeper(os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "demo: unknown command %q\n\n%s", os.Args[1], usage)
		code = 2
	}
	os.Exit(code)
}
