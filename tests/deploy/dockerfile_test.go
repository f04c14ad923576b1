package deploytest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// There is no container engine on the test machines, so the image is not built here; this checks
// the Dockerfile's promises instead: every base image (and the BuildKit frontend) pinned by
// digest, a build stage that checks the binary needs no library beyond glibc and libgcc, a final
// stage on distroless/cc (those and nothing else) with no RUN (it has no shell), a numeric
// non-root USER, and an exec-form ENTRYPOINT. `make image-check` runs the binary in a root
// holding only those libraries.
func TestStaticDockerfile(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	// Join continuation lines, drop comments.
	text := regexp.MustCompile(`\\\n`).ReplaceAllString(string(b), " ")
	type stage struct {
		from  string
		instr []string
	}
	var stages []stage
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		word := strings.ToUpper(strings.Fields(line)[0])
		if word == "FROM" {
			stages = append(stages, stage{from: line})
			continue
		}
		if len(stages) > 0 {
			stages[len(stages)-1].instr = append(stages[len(stages)-1].instr, line)
		}
	}
	if len(stages) < 2 {
		t.Fatalf("%d stages: want a multi-stage build", len(stages))
	}
	// Supply chain: every base image, and the BuildKit frontend named by the syntax directive,
	// pinned by digest (a tag can be moved to other bytes; a digest cannot).
	digest := regexp.MustCompile(`@sha256:[0-9a-f]{64}(\s|$)`)
	for _, s := range stages {
		if !digest.MatchString(s.from) {
			t.Errorf("%q: base image not pinned by digest (want image:tag@sha256:<64 hex>)", s.from)
		}
	}
	if first, _, _ := strings.Cut(string(b), "\n"); strings.HasPrefix(first, "# syntax=") && !digest.MatchString(first) {
		t.Errorf("%q: BuildKit frontend not pinned by digest", first)
	}
	// Cache mounts: an id of this project's own (the default id is the target path, shared with
	// every other build on the builder that mounts the same path) and locked sharing.
	mounts := regexp.MustCompile(`--mount=(\S+)`).FindAllStringSubmatch(text, -1)
	caches := 0
	for _, m := range mounts {
		opts := map[string]string{}
		for _, kv := range strings.Split(m[1], ",") {
			k, v, _ := strings.Cut(kv, "=")
			opts[k] = v
		}
		if opts["type"] != "cache" {
			continue
		}
		caches++
		if !strings.HasPrefix(opts["id"], "kube-overcommit-") || opts["sharing"] != "locked" {
			t.Errorf("cache mount %q: want id=kube-overcommit-... and sharing=locked (a cache shared with other builds could be poisoned by them)", m[1])
		}
	}
	if caches == 0 {
		t.Error("no cache mount found: the check above saw nothing")
	}
	build, final := stages[0], stages[len(stages)-1]
	if !strings.Contains(build.from, " AS build") {
		t.Errorf("first stage %q is not the build stage", build.from)
	}
	joined := strings.Join(build.instr, "\n")
	if !strings.Contains(joined, "cargo build --release --locked") || !strings.Contains(joined, "ldd /kube-overcommit") {
		t.Errorf("build stage lacks the locked release build or the shared-library check:\n%s", joined)
	}
	if !strings.Contains(final.from, "distroless/cc-debian12") || !strings.Contains(build.from, "bookworm") {
		t.Errorf("stages %q and %q: want a Debian 12 build for distroless/cc-debian12 (glibc 2.36 both, no shell)",
			build.from, final.from)
	}
	var user, entry string
	for _, in := range final.instr {
		f := strings.Fields(in)
		switch strings.ToUpper(f[0]) {
		case "RUN":
			t.Errorf("final stage runs %q: it has no shell", in)
		case "USER":
			user = f[1]
		case "ENTRYPOINT":
			entry = strings.TrimSpace(strings.TrimPrefix(in, f[0]))
		}
	}
	if !regexp.MustCompile(`^[1-9][0-9]*:[1-9][0-9]*$`).MatchString(user) {
		t.Errorf("USER %q: want numeric uid:gid, not root (runAsNonRoot checks it without /etc/passwd)", user)
	}
	var argv []string
	if err := json.Unmarshal([]byte(entry), &argv); err != nil || len(argv) == 0 {
		t.Errorf("ENTRYPOINT %q: want exec form (no shell)", entry)
	}
	// The Deployment's securityContext runs the same uid.
	if user != "" && !strings.HasPrefix(user, "65532:") {
		t.Errorf("USER %s differs from the manifests' runAsUser 65532", user)
	}
	ignore, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, must := range []string{"target", ".git"} {
		if !strings.Contains(string(ignore), must) {
			t.Errorf(".dockerignore does not exclude %s", must)
		}
	}
}
