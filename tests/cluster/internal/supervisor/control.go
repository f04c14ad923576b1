package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kube-overcommit/tests/cluster/internal/runfiles"
)

// Up starts the supervisor in its own session and returns once the control plane is ready.
func Up(opts Options, out io.Writer) error {
	run := opts.Run
	if _, err := os.Stat(run.Ready()); err == nil {
		if pid, err := run.ReadPid("supervisor"); err == nil && runfiles.Alive(pid) {
			if err := Ready(run); err == nil {
				fmt.Fprintf(out, "kcp: already up (supervisor pid %d); kubeconfig %s\n", pid, run.Kubeconfig())
				return nil
			}
		}
	}
	// Whatever is left of an earlier run (a crashed supervisor's children, a stale standalone
	// process) goes first.
	if err := Down(run, io.Discard); err != nil {
		return err
	}
	for _, d := range []string{"logs", "pids"} {
		if err := os.MkdirAll(run.Path(d), 0o755); err != nil {
			return err
		}
	}
	_ = os.Remove(run.Kubeconfig())
	_ = os.Remove(run.Ready())
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{"supervise", "--run-dir=" + string(run), "--nodes=" + strconv.Itoa(opts.Nodes),
		"--ready-timeout=" + opts.ReadyTimeout.String()}
	if opts.KeepData {
		args = append(args, "--keep-data")
	}
	if opts.ExitWithPID > 0 {
		args = append(args, "--exit-with-pid="+strconv.Itoa(opts.ExitWithPID))
	}
	if opts.MaxLifetime > 0 {
		args = append(args, "--max-lifetime="+opts.MaxLifetime.String())
	}
	for _, a := range opts.FakeNodeArgs {
		args = append(args, "--fake-node-arg="+a)
	}
	for _, a := range opts.APIServerArgs {
		args = append(args, "--apiserver-arg="+a)
	}
	logf, err := os.OpenFile(run.Log("supervisor"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "KCP_RUN_DIR="+string(run))
	// Own session: survives the caller's terminal and is the leader of its process group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(opts.ReadyTimeout + 30*time.Second)
	nextNote := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(run.Ready()); err == nil {
			fmt.Fprintf(out, "kcp: control plane up in %.1fs; kubeconfig %s\n", time.Since(start).Seconds(), run.Kubeconfig())
			return nil
		}
		select {
		case err := <-exited:
			return fmt.Errorf("supervisor exited before ready (%v); last lines of %s:\n%s", err, run.Log("supervisor"), tail(run.Log("supervisor"), 20))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = Down(run, io.Discard)
			return fmt.Errorf("control plane not ready after %v; see %s", time.Since(start), run.Path("logs"))
		}
		if time.Now().After(nextNote) {
			fmt.Fprintf(out, "kcp: waiting for the control plane (%.0fs): %s\n", time.Since(start).Seconds(), lastLine(run.Log("supervisor")))
			nextNote = time.Now().Add(10 * time.Second)
		}
	}
}

// Down stops every kcp process of the run directory: SIGTERM to the supervisor (ordered stop),
// then to the rest, then SIGKILL to the supervisor's process group and to any survivor.
func Down(run runfiles.Dir, out io.Writer) error {
	procs := run.Processes()
	_ = os.Remove(run.Ready())
	if len(procs) == 0 {
		fmt.Fprintln(out, "kcp: nothing running")
		cleanPids(run)
		return nil
	}
	var supervisors []int
	var supervisorProcs []runfiles.Proc
	for _, p := range procs {
		if p.Subcommand == "supervise" {
			supervisors = append(supervisors, p.PID)
			supervisorProcs = append(supervisorProcs, p)
			_ = syscall.Kill(p.PID, syscall.SIGTERM)
		}
	}
	// The supervisor exits once its components have stopped; processes it does not own
	// (fake-nodes, hollow-nodes, ... started by others) get their SIGTERM below.
	waitGone(supervisorProcs, 20*time.Second)
	for _, p := range procs {
		if runfiles.Alive(p.PID) {
			_ = syscall.Kill(p.PID, syscall.SIGTERM)
		}
	}
	waitGone(procs, 5*time.Second)
	for _, pid := range supervisors {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	for _, p := range run.Processes() {
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
	waitGone(append(procs, run.Processes()...), 5*time.Second)
	left := run.Processes()
	cleanPids(run)
	_ = os.Remove(run.Kubeconfig())
	_ = os.Remove(run.State())
	if len(left) > 0 {
		return fmt.Errorf("processes still running after SIGKILL: %v", left)
	}
	fmt.Fprintf(out, "kcp: stopped %d processes\n", len(procs))
	return nil
}

func waitGone(procs []runfiles.Proc, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		alive := false
		for _, p := range procs {
			if runfiles.Alive(p.PID) {
				alive = true
			}
		}
		if !alive {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func cleanPids(run runfiles.Dir) {
	entries, _ := os.ReadDir(run.Path("pids"))
	for _, e := range entries {
		_ = os.Remove(run.Path("pids", e.Name()))
	}
	entries, _ = os.ReadDir(run.Path("hold"))
	for _, e := range entries {
		_ = os.Remove(run.Path("hold", e.Name()))
	}
}

// Ready checks /readyz of the run's API server.
func Ready(run runfiles.Dir) error {
	st, err := run.ReadState()
	if err != nil {
		return err
	}
	c, err := AdminHTTPClient(run)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	return httpOK(ctx, c, st.Server+"/readyz")
}

// Components are the names kcp restart accepts.
var Components = []string{"etcd", "apiserver", "scheduler", "controller-manager", "fake-nodes"}

// Status prints the state of every component; it fails when the control plane is not ready.
func Status(run runfiles.Dir, out io.Writer) error {
	st, err := run.ReadState()
	if err != nil {
		fmt.Fprintf(out, "kcp: not running (no %s)\n", run.State())
		return errors.New("not running")
	}
	fmt.Fprintf(out, "run dir:    %s\nserver:     %s\nkubeconfig: %s\n", run, st.Server, run.Kubeconfig())
	for _, name := range append([]string{"supervisor"}, Components...) {
		pid, err := run.ReadPid(name)
		switch {
		case err != nil:
			fmt.Fprintf(out, "%-19s not running\n", name)
		case runfiles.Alive(pid):
			fmt.Fprintf(out, "%-19s pid %d\n", name, pid)
		default:
			fmt.Fprintf(out, "%-19s dead (pid %d)\n", name, pid)
		}
	}
	if err := Ready(run); err != nil {
		fmt.Fprintf(out, "readyz:     %v\n", err)
		return err
	}
	fmt.Fprintln(out, "readyz:     ok")
	return nil
}

// Restart stops a supervised component with sig and waits for the supervisor to start it again
// (after downFor, during which the hold file keeps it down), then for it to be ready.
func Restart(run runfiles.Dir, name string, sig syscall.Signal, downFor, timeout time.Duration, out io.Writer) error {
	known := false
	for _, c := range Components {
		known = known || c == name
	}
	if !known {
		return fmt.Errorf("unknown component %q (one of %s)", name, strings.Join(Components, ", "))
	}
	pid, err := run.ReadPid(name)
	if err != nil || !runfiles.Alive(pid) {
		return fmt.Errorf("%s is not running", name)
	}
	if downFor > 0 {
		if err := os.MkdirAll(run.Path("hold"), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(run.Hold(name), nil, 0o644); err != nil {
			return err
		}
		defer os.Remove(run.Hold(name))
	}
	start := time.Now()
	if err := syscall.Kill(pid, sig); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for runfiles.Alive(pid) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (pid %d) did not exit after %v", name, pid, sig)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Fprintf(out, "kcp: %s (pid %d) stopped after %v\n", name, pid, time.Since(start).Round(time.Millisecond))
	if downFor > 0 {
		// The caller asked for this much downtime.
		time.Sleep(downFor)
		_ = os.Remove(run.Hold(name))
	}
	deadline = time.Now().Add(timeout)
	for {
		npid, err := run.ReadPid(name)
		if err == nil && npid != pid && runfiles.Alive(npid) {
			if name != "apiserver" || Ready(run) == nil {
				fmt.Fprintf(out, "kcp: %s back as pid %d after %v\n", name, npid, time.Since(start).Round(time.Millisecond))
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not back after %v", name, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

func lastLine(path string) string { return tail(path, 1) }
