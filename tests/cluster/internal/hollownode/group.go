package hollownode

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"kube-overcommit/tests/cluster/internal/spawn"
)

// Group is one process per hollow kubelet, children of the caller.
type Group struct {
	// Binary and Args start one node's process: Args(name) are its arguments.
	Binary string
	Args   func(name string) []string
	Names  []string
	// LogDir gets one <prefix><name>.log per node, appended over restarts.
	LogDir, LogPrefix string
	// Env of the children (os.Environ() when nil).
	Env []string
}

// Run starts every node and keeps it running (a node whose process exits is started again
// after a second, as a kubelet restarted by systemd) until ctx ends; then each gets SIGTERM,
// and SIGKILL after 5 s. Children die with the caller (Pdeathsig), also when it is killed.
func (g Group) Run(ctx context.Context) error {
	if err := os.MkdirAll(g.LogDir, 0o755); err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(g.Names))
	for _, name := range g.Names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.keep(ctx, name); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	return nil
}

// keep runs one node's process until ctx ends, restarting it when it exits.
func (g Group) keep(ctx context.Context, name string) error {
	for {
		cmd, err := g.start(name)
		if err != nil {
			return fmt.Errorf("hollow node %s: %w", name, err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			log.Printf("hollow node %s: process %d exited (%v); starting it again in 1s", name, cmd.Process.Pid, err)
		case <-ctx.Done():
			stop(cmd, done)
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

func (g Group) start(name string) (*exec.Cmd, error) {
	logf, err := os.OpenFile(filepath.Join(g.LogDir, g.LogPrefix+name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(g.Binary, g.Args(name)...)
	cmd.Stdout, cmd.Stderr, cmd.Env = logf, logf, g.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := spawn.Start(cmd); err != nil {
		return nil, err
	}
	log.Printf("hollow node %s: pid %d", name, cmd.Process.Pid)
	return cmd, nil
}

func stop(cmd *exec.Cmd, done chan error) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// WithoutFlags drops the flags named in drop (--f=v, or --f v for non-boolean ones) from args:
// what a group passes on to each node's process.
func WithoutFlags(args []string, drop []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		dropped := false
		for _, d := range drop {
			if args[i] == "--"+d {
				i++ // its value is the next argument
				dropped = true
			} else if strings.HasPrefix(args[i], "--"+d+"=") {
				dropped = true
			}
		}
		if !dropped {
			out = append(out, args[i])
		}
	}
	return out
}
