package runfiles

import (
	"os"
	"os/exec"
	"testing"
)

func TestResolvePrecedence(t *testing.T) {
	t.Setenv("KCP_RUN_DIR", "/tmp/explicit")
	t.Setenv("KCP_DEFAULT_RUN_DIR", "/tmp/default")
	if d, _ := Resolve("/tmp/flag"); d != "/tmp/flag" {
		t.Errorf("flag: %s", d)
	}
	if d, _ := Resolve(""); d != "/tmp/explicit" {
		t.Errorf("env: %s", d)
	}
	os.Unsetenv("KCP_RUN_DIR")
	if d, _ := Resolve(""); d != "/tmp/default" {
		t.Errorf("default: %s", d)
	}
	os.Unsetenv("KCP_DEFAULT_RUN_DIR")
	if _, err := Resolve(""); err == nil {
		t.Error("no run dir accepted")
	}
}

// Processes only matches kcp executables: a shell whose command line names the run dir is not
// one of ours, so `kcp down` can never kill the script that called it.
func TestProcessesIgnoresOtherExecutables(t *testing.T) {
	dir := t.TempDir()
	// argv = [sh, supervise, --run-dir=<dir>]: everything matches but the executable.
	if err := os.WriteFile(dir+"/supervise", []byte("sleep 30\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "supervise", "--run-dir="+dir)
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if got := Dir(dir).Processes(); len(got) != 0 {
		t.Fatalf("matched a non-kcp process: %v", got)
	}
	if !Alive(cmd.Process.Pid) || Alive(1<<30) {
		t.Fatal("Alive is wrong")
	}
}
