// Package spawn starts child processes from one OS thread that never exits. Pdeathsig (the
// signal a child gets when its parent dies) is tied to the thread that forked the child, not
// to the process, and the Go runtime may retire any other thread at any time: a child forked
// from such a thread would be killed early, or, with SIGKILL as the death signal, never.
package spawn

import (
	"os/exec"
	"runtime"
	"sync"
)

type request struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	once     sync.Once
	requests chan request
)

// Start starts cmd (cmd.Start) from the dedicated locked thread.
func Start(cmd *exec.Cmd) error {
	once.Do(func() {
		requests = make(chan request)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives as long as the process
			for r := range requests {
				r.done <- r.cmd.Start()
			}
		}()
	})
	done := make(chan error, 1)
	requests <- request{cmd: cmd, done: done}
	return <-done
}
