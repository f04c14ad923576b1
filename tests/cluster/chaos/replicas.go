package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"
)

// replicaSet runs the webhook replicas as processes of the real binary and replaces each one
// that exits, as a Deployment replaces a pod: a new identity (POD_NAME), the same ports and
// Secret-volume directory, after a short delay.
type replicaSet struct {
	binary, runDir, kubeconfig, namespace string
	env                                   []string
	extraArgs                             []string
	restartDelay                          time.Duration

	mu       sync.Mutex
	slots    []*slot
	stopping bool
	wg       sync.WaitGroup
}

type slot struct {
	index         int
	listen, probe string
	tlsDir, log   string
	generation    int
	identity      string
	cmd           *exec.Cmd
	done          chan struct{}
	starts, exits int
	lastExit      string
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (rs *replicaSet) addSlot(i int) (*slot, error) {
	wp, err := freePort()
	if err != nil {
		return nil, err
	}
	pp, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(rs.runDir, "chaos", fmt.Sprintf("replica-%d", i))
	// The mount point exists before the container starts, as with a kubelet volume.
	if err := os.MkdirAll(filepath.Join(dir, "tls"), 0o755); err != nil {
		return nil, err
	}
	s := &slot{index: i, listen: fmt.Sprintf("127.0.0.1:%d", wp), probe: fmt.Sprintf("127.0.0.1:%d", pp),
		tlsDir: filepath.Join(dir, "tls"), log: filepath.Join(rs.runDir, "logs", fmt.Sprintf("replica-%d.log", i))}
	rs.mu.Lock()
	rs.slots = append(rs.slots, s)
	rs.mu.Unlock()
	return s, nil
}

// start launches the slot's next generation (caller holds no lock).
func (rs *replicaSet) start(s *slot) error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.stopping {
		return nil
	}
	s.generation++
	s.identity = fmt.Sprintf("kube-overcommit-r%d-g%d", s.index, s.generation)
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "---- chaos: starting %s (generation %d) at %s\n", s.identity, s.generation, time.Now().UTC().Format(time.RFC3339Nano))
	args := append([]string{"serve", "--listen=" + s.listen, "--probe-listen=" + s.probe, "--tls-dir=" + s.tlsDir}, rs.extraArgs...)
	cmd := exec.Command(rs.binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(append(os.Environ(), rs.env...),
		"KUBECONFIG="+rs.kubeconfig, "POD_NAME="+s.identity, "POD_NAMESPACE="+rs.namespace)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", rs.binary, err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	s.starts++
	done := s.done
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		err := cmd.Wait()
		rs.mu.Lock()
		s.exits++
		s.lastExit = fmt.Sprintf("%s: %v", s.identity, err)
		stopping := rs.stopping
		rs.mu.Unlock()
		close(done)
		if stopping {
			return
		}
		time.Sleep(rs.restartDelay)
		if err := rs.start(s); err != nil {
			progress("restart replica %d: %v", s.index, err)
		}
	}()
	return nil
}

// signal sends sig to the slot's current process and waits (up to timeout) for it to exit.
func (rs *replicaSet) signal(index int, sig syscall.Signal, timeout time.Duration) (string, error) {
	rs.mu.Lock()
	s := rs.slots[index]
	cmd, done, id := s.cmd, s.done, s.identity
	rs.mu.Unlock()
	if cmd == nil {
		return id, fmt.Errorf("replica %d not running", index)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return id, err
	}
	select {
	case <-done:
		return id, nil
	case <-time.After(timeout):
		return id, fmt.Errorf("%s did not exit within %v of %v", id, timeout, sig)
	}
}

// send sends sig to the slot's current process without waiting.
func (rs *replicaSet) send(index int, sig syscall.Signal) error {
	rs.mu.Lock()
	cmd := rs.slots[index].cmd
	rs.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("replica %d not running", index)
	}
	return cmd.Process.Signal(sig)
}

func (rs *replicaSet) ready(s *slot) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + s.probe + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// readySlots are the indexes whose /readyz answers 200.
func (rs *replicaSet) readySlots() []int {
	rs.mu.Lock()
	slots := append([]*slot(nil), rs.slots...)
	rs.mu.Unlock()
	var out []int
	for _, s := range slots {
		if rs.ready(s) {
			out = append(out, s.index)
		}
	}
	sort.Ints(out)
	return out
}

func (rs *replicaSet) byIdentity(id string) (int, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, s := range rs.slots {
		if s.identity == id {
			return s.index, true
		}
	}
	return 0, false
}

func (rs *replicaSet) randomReady() (int, bool) {
	r := rs.readySlots()
	if len(r) == 0 {
		return 0, false
	}
	return r[rand.IntN(len(r))], true
}

// stop ends every replica (SIGTERM, then SIGKILL after grace) and waits for them.
func (rs *replicaSet) stop(grace time.Duration) {
	rs.mu.Lock()
	rs.stopping = true
	slots := append([]*slot(nil), rs.slots...)
	rs.mu.Unlock()
	for _, s := range slots {
		if s.cmd != nil {
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	deadline := time.After(grace)
	for _, s := range slots {
		if s.cmd == nil {
			continue
		}
		select {
		case <-s.done:
		case <-deadline:
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	}
	rs.wg.Wait()
}

func (rs *replicaSet) summary() string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := ""
	for _, s := range rs.slots {
		out += fmt.Sprintf("replica %d: %d starts, %d exits (last: %s); ", s.index, s.starts, s.exits, s.lastExit)
	}
	return out
}
