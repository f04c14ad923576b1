package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/install"
	"kube-overcommit/tests/cluster/internal/runfiles"
)

// The keeper of a kept demo (`demo run --keep`): a process in its own session that runs the 3
// replicas (and their Secret volumes) on the kept control plane, because the replicas of a
// local installation die with the process that started them. It stops them, and exits, on
// SIGTERM (demo.sh down, run by make cluster-down) or when the control plane is gone (kcp down,
// or its 12 h lifetime): nothing outlives the control plane.

func startKeeper(runDir string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	run := runfiles.Dir(runDir)
	_ = os.Remove(run.Path(keeperReadyTag))
	logf, err := os.OpenFile(run.Log("demo-keeper"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(exe, "keep", "--run-dir="+runDir)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start keeper: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	err = harness.Eventually(3*time.Minute, 200*time.Millisecond, func() error {
		select {
		case err := <-exited:
			return &permanent{fmt.Errorf("keeper exited: %v (log: %s)", err, run.Log("demo-keeper"))}
		default:
		}
		if _, err := os.Stat(run.Path(keeperReadyTag)); err != nil {
			return fmt.Errorf("keeper's replicas not ready yet (log: %s)", run.Log("demo-keeper"))
		}
		return nil
	})
	var p *permanent
	if errors.As(err, &p) {
		return p.err
	}
	if err != nil {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	return err
}

type permanent struct{ err error }

func (p *permanent) Error() string { return p.err.Error() }

func runKeeper(args []string) int {
	fs := pflag.NewFlagSet("demo keep", pflag.ContinueOnError)
	runDir := fs.String("run-dir", "", "run directory of the kept control plane")
	if err := fs.Parse(args); err != nil || *runDir == "" {
		fmt.Fprintln(os.Stderr, "demo keep: --run-dir is required")
		return 2
	}
	run, err := runfiles.Abs(*runDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := keep(run); err != nil {
		fmt.Fprintf(os.Stderr, "demo keep: %v\n", err)
		return 1
	}
	return 0
}

func keep(run runfiles.Dir) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	pidFile := run.Path(keeperPidFile)
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(pidFile)
	defer os.Remove(run.Path(keeperReadyTag))
	if err := os.Setenv("KCP_KUBECONFIG", run.Kubeconfig()); err != nil {
		return err
	}
	c, err := harness.New(harness.Options{})
	if err != nil {
		return err
	}
	if err := applyRBAC(ctx, c); err != nil {
		return err
	}
	in, err := install.Install(ctx, c, installOptions())
	if err != nil {
		return err
	}
	defer func() {
		if err := in.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "demo keep: stop replicas: %v\n", err)
		}
		fmt.Printf("%s demo keep: replicas stopped: %s\n", time.Now().UTC().Format(time.RFC3339), in.Summary())
	}()
	if err := in.WaitBootstrapped(ctx, 2*time.Minute); err != nil {
		return err
	}
	if err := os.WriteFile(run.Path(keeperReadyTag), nil, 0o644); err != nil {
		return err
	}
	fmt.Printf("%s demo keep: %d replicas ready; leader %s\n", time.Now().UTC().Format(time.RFC3339), len(in.ReadyReplicas()), in.LeaderIdentity(ctx))
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Printf("%s demo keep: signalled, stopping\n", time.Now().UTC().Format(time.RFC3339))
			return nil
		case <-tick.C:
			if !controlPlaneUp(run) {
				fmt.Printf("%s demo keep: the control plane is gone, stopping\n", time.Now().UTC().Format(time.RFC3339))
				return nil
			}
		}
	}
}

// controlPlaneUp: the supervisor named in state.json is a live kcp process of this run dir
// (a recycled pid is not).
func controlPlaneUp(run runfiles.Dir) bool {
	st, err := run.ReadState()
	if err != nil || st.SupervisorPID <= 0 {
		return false
	}
	for _, p := range run.Processes() {
		if p.PID == st.SupervisorPID {
			return true
		}
	}
	return false
}
