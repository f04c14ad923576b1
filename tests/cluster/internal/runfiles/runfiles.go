// Package runfiles names the files of a run directory and finds the processes that belong to it.
//
//	<run>/kubeconfig        admin kubeconfig (written once the API server is ready)
//	<run>/state.json        ports and pids of the running control plane
//	<run>/ready             exists while the control plane is up and ready
//	<run>/pki/              CA, serving and client certificates, service-account keys
//	<run>/etcd/             etcd data
//	<run>/logs/<name>.log   one log per component
//	<run>/pids/<name>.pid   pid of each supervised component
//	<run>/hold/<name>       while present, the supervisor does not restart <name>
//	<run>/services/<ns>/<svc>  webhook backend registry (package services)
//	<run>/stats/<prefix>.json  fake-node status-write statistics
//	<run>/pods/<prefix>/...    pod-runner pods' directories (package podrunner)
//	<run>/hollow/<node>/       a hollow kubelet's root dir, pod logs, fake runtime socket (package hollowkubelet)
package runfiles

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Resolve returns the run directory: the flag value, else $KCP_RUN_DIR, else
// $KCP_DEFAULT_RUN_DIR (kcp.sh sets it to tests/cluster/.run).
func Resolve(flagValue string) (Dir, error) {
	p := flagValue
	if p == "" {
		p = os.Getenv("KCP_RUN_DIR")
	}
	if p == "" {
		p = os.Getenv("KCP_DEFAULT_RUN_DIR")
	}
	return Abs(p)
}

// Dir is an absolute run directory.
type Dir string

// Abs makes a Dir from a possibly relative path.
func Abs(p string) (Dir, error) {
	if p == "" {
		return "", fmt.Errorf("no run directory: pass --run-dir or set KCP_RUN_DIR")
	}
	a, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	return Dir(a), nil
}

func (d Dir) Path(parts ...string) string {
	return filepath.Join(append([]string{string(d)}, parts...)...)
}
func (d Dir) Kubeconfig() string         { return d.Path("kubeconfig") }
func (d Dir) State() string              { return d.Path("state.json") }
func (d Dir) Ready() string              { return d.Path("ready") }
func (d Dir) PKI() string                { return d.Path("pki") }
func (d Dir) Etcd() string               { return d.Path("etcd") }
func (d Dir) Log(name string) string     { return d.Path("logs", name+".log") }
func (d Dir) Pid(name string) string     { return d.Path("pids", name+".pid") }
func (d Dir) Hold(name string) string    { return d.Path("hold", name) }
func (d Dir) Services() string           { return d.Path("services") }
func (d Dir) Stats(prefix string) string { return d.Path("stats", prefix+".json") }

// State is what the supervisor publishes about the running control plane.
type State struct {
	SupervisorPID     int    `json:"supervisorPID"`
	EtcdClientPort    int    `json:"etcdClientPort"`
	EtcdPeerPort      int    `json:"etcdPeerPort"`
	APIServerPort     int    `json:"apiServerPort"`
	SchedulerPort     int    `json:"schedulerPort"`
	ControllerMgrPort int    `json:"controllerManagerPort"`
	Server            string `json:"server"`
	Nodes             int    `json:"nodes"`
}

func WriteJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.tmp.%d", path, os.Getpid())
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (d Dir) ReadState() (State, error) {
	var s State
	data, err := os.ReadFile(d.State())
	if err != nil {
		return s, err
	}
	return s, json.Unmarshal(data, &s)
}

func (d Dir) WritePid(name string, pid int) error {
	if err := os.MkdirAll(d.Path("pids"), 0o755); err != nil {
		return err
	}
	return os.WriteFile(d.Pid(name), []byte(strconv.Itoa(pid)+"\n"), 0o644)
}

func (d Dir) ReadPid(name string) (int, error) {
	data, err := os.ReadFile(d.Pid(name))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

// LongRunning are the subcommands that stay up; only these are ever killed by Processes' callers.
var LongRunning = map[string]bool{
	"supervise": true, "etcd": true, "apiserver": true, "scheduler": true,
	"controller-manager": true, "fake-nodes": true, "secret-volume": true, "pod-runner": true,
	"metrics-server": true, "hollow-nodes": true, "hollow-node": true,
}

// Proc is a process of this run directory.
type Proc struct {
	PID        int
	Subcommand string
}

// Processes lists the live kcp processes running a long-running subcommand for this run
// directory (by --run-dir=, else KCP_RUN_DIR, else KCP_DEFAULT_RUN_DIR), and whose executable
// is a kcp binary. The caller is excluded.
func (d Dir) Processes() []Proc {
	var out []Proc
	entries, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil || !strings.HasPrefix(filepath.Base(exe), "kcp") {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if len(args) < 2 || !LongRunning[args[1]] {
			continue
		}
		// Same precedence as the binary resolves its run directory: flag, KCP_RUN_DIR,
		// KCP_DEFAULT_RUN_DIR (set by kcp.sh).
		runDir := ""
		for _, a := range args[2:] {
			if v, ok := strings.CutPrefix(a, "--run-dir="); ok {
				runDir = v
			}
		}
		if runDir == "" {
			env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
			var explicit, def string
			for _, kv := range bytes.Split(env, []byte{0}) {
				if v, ok := strings.CutPrefix(string(kv), "KCP_RUN_DIR="); ok {
					explicit = v
				}
				if v, ok := strings.CutPrefix(string(kv), "KCP_DEFAULT_RUN_DIR="); ok {
					def = v
				}
			}
			runDir = explicit
			if runDir == "" {
				runDir = def
			}
		}
		match := runDir != "" && filepath.Clean(runDir) == string(d)
		if match {
			out = append(out, Proc{PID: pid, Subcommand: args[1]})
		}
	}
	return out
}

// Alive reports whether pid exists and is not a zombie.
func Alive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// Field 3 (after "pid (comm)") is the state; Z is a zombie.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
