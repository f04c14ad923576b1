package e2e

// `kubectl overcommit status` (issue 17, "a person's view"), checked inside TestOvercommit on
// its inflated pool: the real kubectl (kcp kubectl) finds the binary as a plugin by its name
// `kubectl-overcommit` on the PATH, and the binary lists nodes, pods and policies from the
// real API server.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
)

// statusRow is one row of `status -o json`.
type statusRow struct {
	Node   string `json:"node"`
	Policy string `json:"policy"`
	Path   string `json:"path"`
	// The policy generation the node's applied annotation carries, and its policy's now.
	Generation       *int64 `json:"generation"`
	PolicyGeneration *int64 `json:"policyGeneration"`
	Resources        map[string]struct {
		Unit        string   `json:"unit"`
		Raw         *int64   `json:"raw"`
		Allocatable *int64   `json:"allocatable"`
		Requested   int64    `json:"requested"`
		Usage       *int64   `json:"usage"`
		ReqPercent  *float64 `json:"requestedPercentOfRaw"`
		Ratio       *float64 `json:"ratio"`
		UsageDriven bool     `json:"usageDriven"`
	} `json:"resources"`
}

// statusJSON runs `kube-overcommit status -o json` with args against the control plane: the
// rows, and what it printed on stderr.
func statusJSON(c *harness.Cluster, args ...string) ([]statusRow, string, error) {
	bin, err := install.Binary()
	if err != nil {
		return nil, "", err
	}
	cmd := exec.Command(bin, append([]string{"status", "-o", "json", "--kubeconfig", c.Kubeconfig}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, stderr.String(), fmt.Errorf("kube-overcommit status: %v\n%s", err, stderr.String())
	}
	var rows []statusRow
	if err := json.Unmarshal(out, &rows); err != nil {
		return nil, stderr.String(), fmt.Errorf("status JSON: %v\n%s", err, out)
	}
	return rows, stderr.String(), nil
}

// checkStatus runs `kubectl overcommit status -o json` and `kube-overcommit status` against
// the pool: each node's policy, raw and written cpu (millicores), and the requested sum of the
// 1-CPU pods bound to it (boundPerNode); no usage, since this control plane has no
// metrics.k8s.io, and the table says the same in its columns.
func checkStatus(t *testing.T, c *harness.Cluster, nodes []string, boundPerNode map[string]int, policy string, rawCPU, inflatedCPU int64) error {
	t.Helper()
	bin, err := install.Binary()
	if err != nil {
		return err
	}
	plugins := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(plugins, "kubectl-overcommit")); err != nil {
		return err
	}
	// kubectl takes no flags before a plugin's name: the kubeconfig comes from KUBECONFIG.
	kcp, err := harness.Binary()
	if err != nil {
		return err
	}
	plugin := exec.Command(kcp, "kubectl", "overcommit", "status", "-o", "json")
	plugin.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig,
		"PATH="+plugins+string(os.PathListSeparator)+os.Getenv("PATH"))
	combined, err := plugin.CombinedOutput()
	out := string(combined)
	if err != nil {
		return fmt.Errorf("kubectl overcommit status: %v\n%s", err, out)
	}
	// kubectl passes the plugin's stderr through: the JSON is the line "[" and what follows.
	at := strings.Index("\n"+out, "\n[\n")
	if at < 0 {
		return fmt.Errorf("no JSON in:\n%s", out)
	}
	if !strings.Contains(out[:at], "note: no usage: metrics.k8s.io is not served") {
		return fmt.Errorf("no note that usage is unavailable before the JSON:\n%s", out)
	}
	var rows []statusRow
	if err := json.Unmarshal([]byte(out[at:]), &rows); err != nil {
		return fmt.Errorf("status JSON: %v\n%s", err, out)
	}
	byNode := map[string]statusRow{}
	for _, r := range rows {
		byNode[r.Node] = r
	}
	for _, n := range nodes {
		r, ok := byNode[n]
		if !ok {
			return fmt.Errorf("no row for node %s in %s", n, out[at:])
		}
		cpu := r.Resources["cpu"]
		wantReq := int64(boundPerNode[n]) * 1000
		switch {
		case r.Policy != policy:
			return fmt.Errorf("%s: policy %q, want %q", n, r.Policy, policy)
		case r.Path != "webhook":
			return fmt.Errorf("%s: path %q, want webhook", n, r.Path)
		case cpu.Unit != "millicores" || cpu.Raw == nil || *cpu.Raw != rawCPU*1000:
			return fmt.Errorf("%s: cpu raw %v %s, want %d millicores", n, cpu.Raw, cpu.Unit, rawCPU*1000)
		case cpu.Allocatable == nil || *cpu.Allocatable != inflatedCPU*1000:
			return fmt.Errorf("%s: cpu allocatable %v, want %d", n, cpu.Allocatable, inflatedCPU*1000)
		case cpu.Requested != wantReq:
			return fmt.Errorf("%s: cpu requested %d, want %d (%d pods of 1 cpu bound)", n, cpu.Requested, wantReq, boundPerNode[n])
		case cpu.Usage != nil:
			return fmt.Errorf("%s: usage %d without a metrics API", n, *cpu.Usage)
		case cpu.ReqPercent == nil || *cpu.ReqPercent != float64(wantReq)*100/float64(rawCPU*1000):
			return fmt.Errorf("%s: requested share of raw %v", n, cpu.ReqPercent)
		case cpu.Ratio == nil || *cpu.Ratio != float64(inflatedCPU)/float64(rawCPU) || cpu.UsageDriven:
			return fmt.Errorf("%s: cpu ratio %v (usage-driven %v), want %d/%d from nodeRatios", n, cpu.Ratio, cpu.UsageDriven, inflatedCPU, rawCPU)
		case r.Generation == nil || r.PolicyGeneration == nil || *r.Generation != *r.PolicyGeneration:
			return fmt.Errorf("%s: carries generation %v of policy generation %v, want the same", n, r.Generation, r.PolicyGeneration)
		}
	}
	// The table, from the binary itself with an explicit kubeconfig.
	cmd := exec.Command(bin, "status", "--kubeconfig", c.Kubeconfig)
	table, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("kube-overcommit status: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(table)), "\n")
	if len(lines) < 1+len(nodes) || !strings.HasPrefix(lines[0], "NODE") {
		return fmt.Errorf("status table:\n%s", table)
	}
	for _, n := range nodes {
		found := false
		for _, l := range lines[1:] {
			f := strings.Fields(l)
			if len(f) > 6 && f[0] == n {
				ratio := "x" + strconv.FormatFloat(float64(inflatedCPU)/float64(rawCPU), 'f', -1, 64)
				gen := fmt.Sprint(*byNode[n].Generation)
				found = f[1] == policy && f[2] == "webhook" && f[3] == gen && f[4] == fmt.Sprint(rawCPU) && f[5] == fmt.Sprint(inflatedCPU) && f[6] == ratio
			}
		}
		if !found {
			return fmt.Errorf("node %s: no row with policy %s, path webhook, its generation, cpu %d -> %d and the ratio in:\n%s", n, policy, rawCPU, inflatedCPU, table)
		}
	}
	t.Logf("kubectl overcommit status (plugin): %d rows; table:\n%s", len(rows), table)
	return nil
}
