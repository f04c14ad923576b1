package podrunner

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"kube-overcommit/tests/cluster/internal/fakenode"
	"kube-overcommit/tests/cluster/internal/secretvolume"
	"kube-overcommit/tests/cluster/internal/services"
	"kube-overcommit/tests/cluster/internal/spawn"
)

// podWorker plays the kubelet for one pod (by UID): one goroutine owns all its state.
type podWorker struct {
	r   *runner
	uid types.UID
	key string // namespace/name, for logs

	mu      sync.Mutex
	latest  *corev1.Pod
	updated chan struct{}
	gone    chan struct{}
	goneOne sync.Once

	// Owned by the run goroutine.
	dir         string
	logf        *os.File
	ports       map[int32]int32
	containers  []*container
	events      chan event
	terminating bool
	started     *metav1.Time
	registered  []Registration
	tokenExpiry time.Time
	tokens      []tokenVolume // projected service account token volumes
	prepErr     string
	syncing     map[string]bool // secret volumes whose sync loop runs
}

// container is one container's process, restarted in place.
type container struct {
	idx       int
	spec      corev1.Container
	binary    string
	args, env []string
	readyURL  string
	liveURL   string

	cmd       *exec.Cmd
	done      chan struct{}
	gen       int // process generation: probe results of an older one are ignored
	startedAt metav1.Time
	running   bool
	ready     bool
	restarts  int32
	killing   bool // a liveness kill is under way
	nextStart time.Time
	backoff   time.Duration
	lastTerm  *corev1.ContainerStateTerminated
	stopProbe context.CancelFunc
	readyOK   int
	readyBad  int
	liveBad   int
	exitedAt  time.Time
}

type event struct {
	c    *container
	gen  int
	kind string // "exit", "readiness", "liveness"
	ok   bool
	err  error
}

func newPodWorker(r *runner, pod *corev1.Pod) *podWorker {
	return &podWorker{r: r, uid: pod.UID, key: pod.Namespace + "/" + pod.Name, latest: pod,
		updated: make(chan struct{}, 1), gone: make(chan struct{}), events: make(chan event, 64)}
}

func (w *podWorker) update(pod *corev1.Pod) {
	w.mu.Lock()
	w.latest = pod
	w.mu.Unlock()
	select {
	case w.updated <- struct{}{}:
	default:
	}
}

func (w *podWorker) pod() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.latest
}

// markGone: the object is gone from the API server (a force delete, or our final delete).
func (w *podWorker) markGone() { w.goneOne.Do(func() { close(w.gone) }) }

func (w *podWorker) isGone() bool {
	select {
	case <-w.gone:
		return true
	default:
		return false
	}
}

func (w *podWorker) logln(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	log.Printf("pod %s: %s", w.key, msg)
	if w.logf != nil {
		fmt.Fprintf(w.logf, "---- pod runner %s: %s\n", time.Now().UTC().Format(time.RFC3339Nano), msg)
	}
}

func (w *podWorker) run(ctx context.Context) {
	pod := w.pod()
	w.dir = w.r.podDir(pod)
	if f, err := os.OpenFile(w.r.logPath(pod), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		w.logf = f
		defer f.Close()
	}
	// Volumes, probes and process waiters live as long as this worker.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer func() { _ = os.RemoveAll(w.dir) }()

	if pod.DeletionTimestamp != nil {
		w.confirmDeletion(ctx, pod)
		return
	}
	for {
		err := w.prepare(ctx, pod)
		if err == nil {
			break
		}
		w.prepErr = err.Error()
		w.logln("cannot start: %v", err)
		w.writeStatus(ctx)
		select {
		case <-ctx.Done():
			return
		case <-w.gone:
			return
		case <-w.updated:
			if pod = w.pod(); pod.DeletionTimestamp != nil {
				w.confirmDeletion(ctx, pod)
				return
			}
		case <-time.After(2 * time.Second):
		}
	}
	w.prepErr = ""
	for _, c := range w.containers {
		w.startContainer(ctx, c)
	}
	w.writeStatus(ctx)
	resync := time.NewTicker(time.Second)
	defer resync.Stop()
	for {
		select {
		case <-ctx.Done():
			w.shutdown()
			return
		case <-w.gone:
			w.logln("object gone (force delete): killing at once")
			w.killAll()
			w.syncBackends()
			return
		case <-w.updated:
			if pod = w.pod(); pod.DeletionTimestamp != nil {
				w.terminate(ctx, pod)
				return
			}
			w.syncBackends()
		case ev := <-w.events:
			w.handle(ctx, ev)
		case <-resync.C:
			for _, c := range w.containers {
				if !c.running && !c.nextStart.IsZero() && time.Now().After(c.nextStart) {
					w.startContainer(ctx, c)
				}
			}
			if w.tokenDue() {
				if err := w.writeTokens(ctx, w.pod()); err != nil {
					w.logln("token refresh: %v", err)
				}
			}
			w.syncBackends()
			w.writeStatus(ctx)
		}
	}
}

// prepare is the kubelet's pod setup: directories, ports, volumes, token, command lines.
func (w *podWorker) prepare(ctx context.Context, pod *corev1.Pod) error {
	if len(pod.Spec.InitContainers) > 0 {
		return errors.New("init containers are not supported")
	}
	if w.ports == nil {
		ports, err := AssignPorts(pod, freePort)
		if err != nil {
			return err
		}
		w.ports = ports
	}
	mounts, err := w.setupVolumes(ctx, pod)
	if err != nil {
		return err
	}
	// The token reaches the pod only through a projected volume: the kube-api-access-* one the
	// ServiceAccount admission plugin adds (automountServiceAccountToken not false), or one of
	// the pod's own. KUBECONFIG stands in for the in-cluster configuration when a container
	// mounts one at the standard path.
	if err := w.writeTokens(ctx, pod); err != nil {
		return err
	}
	kubeconfig := ""
	if w.inClusterToken(pod) != "" {
		kubeconfig = filepath.Join(w.dir, "kubeconfig")
	}
	rw := Rewriter{Ports: w.ports, Mounts: mounts}
	lookup := func(kind, ns, name, key string) (string, bool, error) {
		switch kind {
		case "Secret":
			s, err := w.r.cfg.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return "", false, nil
			}
			if err != nil {
				return "", false, err
			}
			v, ok := s.Data[key]
			return string(v), ok, nil
		default:
			cm, err := w.r.cfg.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return "", false, nil
			}
			if err != nil {
				return "", false, err
			}
			v, ok := cm.Data[key]
			return v, ok, nil
		}
	}
	var cs []*container
	for i, spec := range pod.Spec.Containers {
		bin, ok := MatchImage(w.r.cfg.Images, spec.Image)
		if !ok {
			return fmt.Errorf("container %s: no local binary for image %q (pod-runner --image PATTERN=BINARY)", spec.Name, spec.Image)
		}
		for _, m := range spec.VolumeMounts {
			if m.SubPath != "" || m.SubPathExpr != "" {
				return fmt.Errorf("container %s: volume mount subPath is not supported", spec.Name)
			}
		}
		env, err := ContainerEnv(pod, &spec, lookup, rw)
		if err != nil {
			return fmt.Errorf("container %s: %w", spec.Name, err)
		}
		args := CommandLine(&spec, env, rw)
		if err := LeftoverWildcard(append(append([]string{}, args...), env...)); err != nil {
			return fmt.Errorf("container %s: %w", spec.Name, err)
		}
		base := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + w.dir, "HOSTNAME=" + pod.Name}
		if kubeconfig != "" {
			base = append(base, "KUBECONFIG="+kubeconfig)
		}
		c := &container{idx: i, spec: spec, binary: bin, args: args, env: append(base, env...), backoff: w.r.cfg.RestartBackoff}
		if spec.ReadinessProbe != nil {
			if c.readyURL, err = ProbeURL(pod, w.ports, spec.ReadinessProbe); err != nil {
				return fmt.Errorf("container %s readiness: %w", spec.Name, err)
			}
		}
		if spec.LivenessProbe != nil {
			if c.liveURL, err = ProbeURL(pod, w.ports, spec.LivenessProbe); err != nil {
				return fmt.Errorf("container %s liveness: %w", spec.Name, err)
			}
		}
		if spec.StartupProbe != nil {
			return fmt.Errorf("container %s: startup probes are not supported", spec.Name)
		}
		cs = append(cs, c)
	}
	w.containers = cs
	return nil
}

// setupVolumes materialises the pod's volumes under <pod dir>/volumes and returns
// mountPath -> directory for every mount of every container.
func (w *podWorker) setupVolumes(ctx context.Context, pod *corev1.Pod) (map[string]string, error) {
	dirs := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		dir := filepath.Join(w.dir, "volumes", v.Name)
		switch {
		case v.Secret != nil:
			if len(v.Secret.Items) > 0 {
				return nil, fmt.Errorf("volume %s: secret items are not supported", v.Name)
			}
			mode := int32(0o644)
			if v.Secret.DefaultMode != nil {
				mode = *v.Secret.DefaultMode
			}
			if w.syncing[v.Name] {
				break // set up by an earlier try of a start that failed later
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
			s, err := w.r.cfg.Client.CoreV1().Secrets(pod.Namespace).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err) && v.Secret.Optional != nil && *v.Secret.Optional:
				// An optional Secret that does not exist yet: an empty volume, filled once it appears.
			case err != nil:
				return nil, fmt.Errorf("volume %s: secret %s: %w", v.Name, v.Secret.SecretName, err)
			default:
				if err := secretvolume.Write(dir, s, mode); err != nil {
					return nil, fmt.Errorf("volume %s: %w", v.Name, err)
				}
			}
			// Kept in sync like the kubelet does, SecretDelay after each change; one writer per
			// volume.
			if w.syncing == nil {
				w.syncing = map[string]bool{}
			}
			w.syncing[v.Name] = true
			go func() {
				err := secretvolume.Run(ctx, secretvolume.Config{Client: w.r.cfg.Client, Namespace: pod.Namespace,
					Name: v.Secret.SecretName, Dir: dir, Delay: w.r.cfg.SecretDelay, Mode: mode})
				if err != nil && ctx.Err() == nil {
					w.logln("volume %s: %v", v.Name, err)
				}
			}()
		case v.EmptyDir != nil:
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
		case v.Projected != nil && serviceAccountProjection(v.Projected):
			// A service account token projection (the kube-api-access-* volume the
			// ServiceAccount admission plugin adds, or the pod's own): the token, the cluster CA
			// and the namespace, written by writeTokens.
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, err
			}
			if !slices.ContainsFunc(w.tokens, func(t tokenVolume) bool { return t.name == v.Name }) {
				w.tokens = append(w.tokens, tokenVolume{name: v.Name, dir: dir, source: v.Projected})
			}
		default:
			return nil, fmt.Errorf("volume %s: only secret, emptyDir and the service account projection are supported", v.Name)
		}
		dirs[v.Name] = dir
	}
	mounts := map[string]string{}
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			d, ok := dirs[m.Name]
			if !ok {
				return nil, fmt.Errorf("container %s mounts unknown volume %s", c.Name, m.Name)
			}
			mounts[m.MountPath] = d
		}
	}
	return mounts, nil
}

func serviceAccountProjection(p *corev1.ProjectedVolumeSource) bool {
	for _, s := range p.Sources {
		switch {
		case s.ServiceAccountToken != nil:
		case s.ConfigMap != nil && s.ConfigMap.Name == "kube-root-ca.crt":
		case s.DownwardAPI != nil:
		default:
			return false
		}
	}
	return true
}

// InClusterTokenDir is where the in-cluster configuration reads the token and CA.
const InClusterTokenDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// tokenVolume is a projected volume with a service account token.
type tokenVolume struct {
	name, dir string
	source    *corev1.ProjectedVolumeSource
}

// inClusterToken is the token file of the projection a container mounts at InClusterTokenDir
// ("" when none does).
func (w *podWorker) inClusterToken(pod *corev1.Pod) string {
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if strings.TrimRight(m.MountPath, "/") != InClusterTokenDir {
				continue
			}
			for _, t := range w.tokens {
				if t.name != m.Name {
					continue
				}
				for _, src := range t.source.Sources {
					if src.ServiceAccountToken != nil {
						return filepath.Join(t.dir, src.ServiceAccountToken.Path)
					}
				}
			}
		}
	}
	return ""
}

// writeTokens fills every projected token volume as the kubelet does: a token of the pod's
// ServiceAccount bound to the pod, from the TokenRequest API, with the projection's
// expirationSeconds and audience; the cluster CA (ConfigMap kube-root-ca.crt) and downward API
// fields at their paths. Then a kubeconfig that reads the token file of the projection mounted
// at the in-cluster path (clients re-read it, so a renewed token is picked up). Tokens are
// renewed at 80% of the shortest lifetime, as the kubelet does.
func (w *podWorker) writeTokens(ctx context.Context, pod *corev1.Pod) error {
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	ca := w.r.cfg.RestConfig.CAData
	if len(ca) == 0 && w.r.cfg.RestConfig.CAFile != "" {
		var err error
		if ca, err = os.ReadFile(w.r.cfg.RestConfig.CAFile); err != nil {
			return err
		}
	}
	var shortest time.Duration
	for _, t := range w.tokens {
		files := map[string][]byte{}
		for _, src := range t.source.Sources {
			switch {
			case src.ServiceAccountToken != nil:
				ttl := w.r.cfg.TokenTTL
				if e := src.ServiceAccountToken.ExpirationSeconds; e != nil {
					ttl = time.Duration(*e) * time.Second
				}
				secs := int64(ttl / time.Second)
				spec := authenticationv1.TokenRequestSpec{
					ExpirationSeconds: &secs,
					BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
				}
				if a := src.ServiceAccountToken.Audience; a != "" {
					spec.Audiences = []string{a}
				}
				tr, err := w.r.cfg.Client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, sa,
					&authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
				if err != nil {
					return fmt.Errorf("volume %s: token for service account %s/%s: %w", t.name, pod.Namespace, sa, err)
				}
				files[src.ServiceAccountToken.Path] = []byte(tr.Status.Token)
				if shortest == 0 || ttl < shortest {
					shortest = ttl
				}
			case src.ConfigMap != nil:
				if len(src.ConfigMap.Items) == 0 {
					files["ca.crt"] = ca
				}
				for _, it := range src.ConfigMap.Items {
					if it.Key != "ca.crt" {
						return fmt.Errorf("volume %s: kube-root-ca.crt has no key %q", t.name, it.Key)
					}
					files[it.Path] = ca
				}
			case src.DownwardAPI != nil:
				for _, it := range src.DownwardAPI.Items {
					if it.FieldRef == nil {
						return fmt.Errorf("volume %s: downward API item %s: only fieldRef is supported", t.name, it.Path)
					}
					v, err := FieldValue(pod, it.FieldRef.FieldPath)
					if err != nil {
						return fmt.Errorf("volume %s: %w", t.name, err)
					}
					files[it.Path] = []byte(v)
				}
			}
		}
		for name, data := range files {
			path := filepath.Join(t.dir, name)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			if err := writeAtomic(path, data, 0o600); err != nil {
				return err
			}
		}
	}
	if token := w.inClusterToken(pod); token != "" {
		kc := clientcmdapi.NewConfig()
		kc.Clusters["cluster"] = &clientcmdapi.Cluster{Server: w.r.cfg.RestConfig.Host, CertificateAuthorityData: ca}
		kc.AuthInfos["serviceaccount"] = &clientcmdapi.AuthInfo{TokenFile: token}
		kc.Contexts["pod"] = &clientcmdapi.Context{Cluster: "cluster", AuthInfo: "serviceaccount", Namespace: pod.Namespace}
		kc.CurrentContext = "pod"
		if err := clientcmd.WriteToFile(*kc, filepath.Join(w.dir, "kubeconfig")); err != nil {
			return err
		}
	}
	if shortest > 0 {
		w.tokenExpiry = time.Now().Add(time.Duration(float64(shortest) * 0.8))
	}
	return nil
}

func (w *podWorker) tokenDue() bool {
	return !w.tokenExpiry.IsZero() && time.Now().After(w.tokenExpiry)
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func (w *podWorker) startContainer(ctx context.Context, c *container) {
	c.nextStart = time.Time{}
	cmd := exec.Command(c.binary, c.args...)
	cmd.Dir = w.dir
	cmd.Env = c.env
	if w.logf != nil {
		cmd.Stdout, cmd.Stderr = w.logf, w.logf
	}
	// Own process group (a Ctrl-C reaches the runner, which stops the processes in order);
	// killed by the kernel if the runner dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	w.logln("container %s: starting %s %s", c.spec.Name, c.binary, strings.Join(c.args, " "))
	if err := spawn.Start(cmd); err != nil {
		w.logln("container %s: start: %v", c.spec.Name, err)
		c.lastTerm = &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: err.Error(),
			FinishedAt: nowSeconds()}
		w.scheduleRestart(c)
		return
	}
	c.gen++
	c.cmd, c.done, c.running, c.ready, c.killing = cmd, make(chan struct{}), true, false, false
	c.startedAt = nowSeconds()
	c.readyOK, c.readyBad, c.liveBad = 0, 0, 0
	if w.started == nil {
		w.started = ptr.To(nowSeconds())
	}
	gen, done := c.gen, c.done
	go func() {
		err := cmd.Wait()
		close(done)
		w.send(ctx, event{c: c, gen: gen, kind: "exit", err: err})
	}()
	pctx, cancel := context.WithCancel(ctx)
	c.stopProbe = cancel
	if c.readyURL != "" {
		go w.probe(pctx, c, gen, "readiness", c.readyURL, c.spec.ReadinessProbe)
	}
	if c.liveURL != "" {
		go w.probe(pctx, c, gen, "liveness", c.liveURL, c.spec.LivenessProbe)
	}
}

func (w *podWorker) send(ctx context.Context, ev event) {
	select {
	case w.events <- ev:
	case <-ctx.Done():
	}
}

// probe runs one httpGet probe of one process, as the kubelet's prober: initial delay, then
// every period, each try bounded by the timeout; a 2xx/3xx answer is a success.
func (w *podWorker) probe(ctx context.Context, c *container, gen int, kind, url string, p *corev1.Probe) {
	period := time.Duration(max(p.PeriodSeconds, 1)) * time.Second
	timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
	client := &http.Client{Timeout: timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	select {
	case <-ctx.Done():
		return
	case <-time.After(time.Duration(p.InitialDelaySeconds) * time.Second):
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		ok := false
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			ok = resp.StatusCode >= 200 && resp.StatusCode < 400
		}
		w.send(ctx, event{c: c, gen: gen, kind: kind, ok: ok})
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func threshold(v int32, def int32) int {
	if v <= 0 {
		return int(def)
	}
	return int(v)
}

func (w *podWorker) handle(ctx context.Context, ev event) {
	c := ev.c
	if ev.gen != c.gen {
		return // an older process of the container
	}
	switch ev.kind {
	case "exit":
		c.running, c.ready = false, false
		c.stopProbe()
		code, reason := int32(0), "Completed"
		if ev.err != nil {
			code, reason = 1, "Error"
			var ee *exec.ExitError
			if errors.As(ev.err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					code = 128 + int32(ws.Signal())
				} else {
					code = int32(ee.ExitCode())
				}
			}
		}
		c.exitedAt = time.Now()
		c.lastTerm = &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, StartedAt: c.startedAt,
			FinishedAt: nowSeconds(), ContainerID: containerID(c)}
		w.logln("container %s exited: %s (exit code %d)", c.spec.Name, exitText(ev.err), code)
		if !w.terminating {
			policy := w.pod().Spec.RestartPolicy
			if policy == corev1.RestartPolicyAlways || policy == "" || (policy == corev1.RestartPolicyOnFailure && code != 0) {
				w.scheduleRestart(c)
			}
		}
		w.syncBackends()
		w.writeStatus(ctx)
	case "readiness":
		if !c.running || c.killing || w.terminating {
			return
		}
		was := c.ready
		if ev.ok {
			c.readyOK, c.readyBad = c.readyOK+1, 0
			if c.readyOK >= threshold(c.spec.ReadinessProbe.SuccessThreshold, 1) {
				c.ready = true
			}
		} else {
			c.readyOK, c.readyBad = 0, c.readyBad+1
			if c.readyBad >= threshold(c.spec.ReadinessProbe.FailureThreshold, 3) {
				c.ready = false
			}
		}
		if was != c.ready {
			w.logln("container %s ready=%v", c.spec.Name, c.ready)
			w.syncBackends()
			w.writeStatus(ctx)
		}
	case "liveness":
		if !c.running || c.killing {
			return
		}
		if ev.ok {
			c.liveBad = 0
			return
		}
		c.liveBad++
		if c.liveBad < threshold(c.spec.LivenessProbe.FailureThreshold, 3) {
			return
		}
		// The kubelet kills a container that fails its liveness probe (preStop, SIGTERM, grace,
		// SIGKILL) and restarts it.
		w.logln("container %s failed its liveness probe %d times: restarting it", c.spec.Name, c.liveBad)
		c.killing, c.ready = true, false
		w.syncBackends()
		w.writeStatus(ctx)
		grace := w.podGrace(w.pod())
		go w.kill(c, grace, nil)
	}
}

func (w *podWorker) scheduleRestart(c *container) {
	// Backoff doubles after each restart, reset when the process had run for a while.
	if !c.startedAt.IsZero() && c.exitedAt.Sub(c.startedAt.Time) > 2*w.r.cfg.MaxRestartBackoff {
		c.backoff = w.r.cfg.RestartBackoff
	}
	c.nextStart = time.Now().Add(c.backoff)
	c.restarts++
	c.backoff = min(2*c.backoff, w.r.cfg.MaxRestartBackoff)
}

func exitText(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

func containerID(c *container) string {
	if c.cmd == nil || c.cmd.Process == nil {
		return ""
	}
	return fmt.Sprintf("podrunner://%d", c.cmd.Process.Pid)
}

// podGrace is the grace period of a deletion (or of a liveness kill): the deletion's own, else
// the pod's terminationGracePeriodSeconds, else 30 s.
func (w *podWorker) podGrace(pod *corev1.Pod) time.Duration {
	switch {
	case pod.DeletionGracePeriodSeconds != nil:
		return time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
	case pod.Spec.TerminationGracePeriodSeconds != nil:
		return time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return 30 * time.Second
}

// kill ends one process as the kubelet's killContainer: the preStop hook (a sleep is honoured,
// bounded by the grace period), SIGTERM, what is left of the grace period (at least 2 s), then
// SIGKILL. A close of abort (the pod object is gone: a force delete) kills at once.
func (w *podWorker) kill(c *container, grace time.Duration, abort <-chan struct{}) {
	cmd, done := c.cmd, c.done
	if cmd == nil || done == nil {
		return
	}
	defer func() {
		_ = cmd.Process.Kill() // no-op once it exited
		<-done
	}()
	if grace <= 0 {
		return // a deletion with grace 0: no hook, no SIGTERM
	}
	hookWait, ok := PreStopWait(&c.spec)
	if !ok {
		w.logln("container %s: preStop hook of an unsupported kind skipped", c.spec.Name)
	}
	hook, term := KillPlan(grace, hookWait)
	// wait returns true when the process may keep running: it waited d and neither the
	// process ended nor abort came.
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-done:
		case <-abort:
		}
		return false
	}
	if hook > 0 {
		w.logln("container %s: preStop sleep %v (grace %v)", c.spec.Name, hook, grace)
		if !wait(hook) {
			return
		}
	}
	w.logln("container %s: SIGTERM, SIGKILL in %v", c.spec.Name, term)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if wait(term) {
		w.logln("container %s: SIGKILL at the end of the grace period", c.spec.Name)
	}
}

// terminate is a graceful deletion: not ready (the backends go at once, as terminating
// endpoints do), every process killed within the grace period, then the final delete.
func (w *podWorker) terminate(ctx context.Context, pod *corev1.Pod) {
	grace := w.podGrace(pod)
	w.logln("deletion requested (grace %v)", grace)
	w.terminating = true
	for _, c := range w.containers {
		c.ready = false
		c.nextStart = time.Time{}
	}
	w.syncBackends()
	w.writeStatus(ctx)
	var wg sync.WaitGroup
	for _, c := range w.containers {
		if !c.running {
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); w.kill(c, grace, w.gone) }()
	}
	allDone := make(chan struct{})
	go func() { wg.Wait(); close(allDone) }()
	for waiting := true; waiting; {
		select {
		case <-allDone:
			waiting = false
		case ev := <-w.events:
			w.handle(ctx, ev)
		case <-ctx.Done():
			w.killAll()
			<-allDone
			return
		}
	}
	// Drain the exit events, so the last status names the processes' ends.
	for _, c := range w.containers {
		for c.running {
			select {
			case ev := <-w.events:
				w.handle(ctx, ev)
			case <-ctx.Done():
				return
			}
		}
	}
	w.confirmDeletion(ctx, pod)
}

// confirmDeletion is the kubelet's last word on a pod: delete with grace 0, for this UID only.
func (w *podWorker) confirmDeletion(ctx context.Context, pod *corev1.Pod) {
	if w.isGone() {
		return
	}
	err := w.r.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To(int64(0)),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		w.logln("final delete: %v", err)
		return
	}
	w.logln("deleted")
}

// killAll: SIGKILL to every process (a force delete), waiting for each.
func (w *podWorker) killAll() {
	w.terminating = true
	for _, c := range w.containers {
		c.ready = false
		if c.running {
			_ = c.cmd.Process.Kill()
			<-c.done
			c.running = false
		}
	}
}

// shutdown: the runner stops; SIGTERM every process, SIGKILL after StopGrace.
func (w *podWorker) shutdown() {
	w.terminating = true
	for _, c := range w.containers {
		c.ready = false
	}
	w.syncBackends()
	var wg sync.WaitGroup
	for _, c := range w.containers {
		if !c.running {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.done:
			case <-time.After(w.r.cfg.StopGrace):
				_ = c.cmd.Process.Kill()
				<-c.done
			}
		}()
	}
	wg.Wait()
}

func (w *podWorker) podReady() bool {
	if w.terminating || len(w.containers) == 0 {
		return false
	}
	for _, c := range w.containers {
		ready := c.running && !c.killing && (c.ready || c.readyURL == "")
		if !ready {
			return false
		}
	}
	return true
}

// syncBackends makes the resolver registry hold this pod's backends exactly while it is Ready:
// the Services that select it, each Service port whose targetPort it declares.
func (w *podWorker) syncBackends() {
	var want []Registration
	if w.podReady() && !w.isGone() {
		want = ServiceBackends(w.pod(), w.ports, w.r.servicesOf(w.pod().Namespace))
	}
	has := map[string]bool{}
	for _, g := range want {
		has[g.key()] = true
	}
	had := map[string]bool{}
	for _, g := range w.registered {
		had[g.key()] = true
		if !has[g.key()] {
			if err := services.Remove(w.r.cfg.ServicesDir, g.Namespace, g.Service, g.Addr, g.Port); err != nil {
				w.logln("unregister %s/%s %s: %v", g.Namespace, g.Service, g.Addr, err)
			} else {
				w.logln("unregistered backend %s of service %s/%s port %d", g.Addr, g.Namespace, g.Service, g.Port)
			}
		}
	}
	for _, g := range want {
		if !had[g.key()] {
			if err := services.Add(w.r.cfg.ServicesDir, g.Namespace, g.Service, services.Backend{Addr: g.Addr, Port: g.Port}); err != nil {
				w.logln("register %s/%s %s: %v", g.Namespace, g.Service, g.Addr, err)
				continue
			}
			w.logln("registered backend %s of service %s/%s port %d", g.Addr, g.Namespace, g.Service, g.Port)
		}
	}
	w.registered = want
}

// status is the pod status this kubelet reports, on top of the stored one.
func (w *podWorker) status(cur *corev1.PodStatus) corev1.PodStatus {
	st := *cur.DeepCopy()
	ip := fakenode.PodIP(w.uid)
	st.HostIP, st.HostIPs = LocalIP, []corev1.HostIP{{IP: LocalIP}}
	st.PodIP, st.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	st.StartTime = w.started
	st.Phase = corev1.PodPending
	if w.started != nil {
		st.Phase = corev1.PodRunning
	}
	allReady := len(w.containers) > 0
	st.ContainerStatuses = nil
	pod := w.pod()
	for i, spec := range pod.Spec.Containers {
		cs := corev1.ContainerStatus{Name: spec.Name, Image: spec.Image}
		if i >= len(w.containers) {
			allReady = false
			reason := "ContainerCreating"
			if w.prepErr != "" {
				reason = "CreateContainerConfigError"
			}
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: w.prepErr}
			st.ContainerStatuses = append(st.ContainerStatuses, cs)
			continue
		}
		c := w.containers[i]
		cs.ImageID = "local://" + c.binary
		cs.RestartCount = c.restarts
		cs.Ready = c.running && !c.killing && !w.terminating && (c.ready || c.readyURL == "")
		cs.Started = ptr.To(c.running)
		if c.lastTerm != nil && c.running {
			cs.LastTerminationState.Terminated = c.lastTerm
		}
		switch {
		case c.running:
			cs.ContainerID = containerID(c)
			cs.State.Running = &corev1.ContainerStateRunning{StartedAt: c.startedAt}
		case c.lastTerm != nil && (w.terminating || c.nextStart.IsZero()):
			cs.State.Terminated = c.lastTerm
		case c.lastTerm != nil:
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
				Message: fmt.Sprintf("back-off restarting; last exit code %d", c.lastTerm.ExitCode)}
		default:
			cs.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
		}
		allReady = allReady && cs.Ready
		st.ContainerStatuses = append(st.ContainerStatuses, cs)
	}
	now := nowSeconds()
	set := func(t corev1.PodConditionType, ok bool) {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		for i := range st.Conditions {
			if st.Conditions[i].Type == t {
				if st.Conditions[i].Status != s {
					st.Conditions[i].Status, st.Conditions[i].LastTransitionTime = s, now
				}
				return
			}
		}
		st.Conditions = append(st.Conditions, corev1.PodCondition{Type: t, Status: s, LastTransitionTime: now})
	}
	set(corev1.PodReadyToStartContainers, w.containers != nil)
	set(corev1.PodInitialized, true)
	set(corev1.ContainersReady, allReady)
	set(corev1.PodReady, allReady && !w.terminating)
	return st
}

// writeStatus updates the pod's status when what this kubelet reports changed.
func (w *podWorker) writeStatus(ctx context.Context) {
	if w.isGone() || ctx.Err() != nil {
		return
	}
	pod := w.pod()
	pods := w.r.cfg.Client.CoreV1().Pods(pod.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != w.uid {
			return nil
		}
		st := w.status(&cur.Status)
		if apiequality.Semantic.DeepEqual(st, cur.Status) {
			return nil
		}
		cur.Status = st
		_, err = pods.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil && !apierrors.IsNotFound(err) && ctx.Err() == nil {
		w.logln("status update: %v", err)
	}
}

// nowSeconds is the current time as the API server stores it (RFC 3339, whole seconds), so
// that a status computed again compares equal to the stored one.
func nowSeconds() metav1.Time { return metav1.Unix(time.Now().Unix(), 0) }
