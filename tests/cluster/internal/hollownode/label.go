// Package hollownode names the hollow nodes (real kubelets, package hollowkubelet) and runs
// them, one process per node (Group). It does not link the kubelet: the harness, metrics-server
// and tests import it for Label.
package hollownode

// Label marks every hollow node (value "true"). A hollow node must never be dialled: whatever
// scrapes or dials kubelets (metrics-server, the API server's logs/exec/proxy) skips nodes with
// it. They report no address either (see package hollowkubelet).
const Label = "kcp.overcommit.dev/hollow"

// Selector matches every node that is not hollow.
const Selector = Label + "!=true"
