// Package podrunner_test checks `kcp pod-runner` (internal/podrunner) on a real API server of
// its own: graceful deletion honours preStop and the grace period, a force delete kills at
// once, readiness drives the Ready condition and the Service's backends in the API server's
// resolver, a failing liveness probe restarts the container, and env (downward API), volumes
// (emptyDir, a Secret kept in sync) and the ServiceAccount token reach the process.
package podrunner_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"kube-overcommit/tests/cluster/harness"
	"kube-overcommit/tests/cluster/internal/runfiles"
)

const ns = "podrun"

func start(t *testing.T) *harness.Cluster {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 (the HTTP server these pods run): %v", err)
	}
	c := harness.Start(t, harness.Options{Nodes: 0})
	ctx := harness.Context(t, time.Minute)
	if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The ServiceAccount controller creates "default" in the namespace; the runner needs it
	// for the pods' tokens.
	if err := harness.Eventually(30*time.Second, 100*time.Millisecond, func() error {
		_, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	r, err := c.StartPodRunner(harness.PodRunnerOptions{Count: 1, Selector: "podrun=yes",
		Images: []string{"example/sh=/bin/sh", "example/python=" + python}, Args: []string{"--restart-backoff=500ms"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Stop(); err != nil {
			t.Errorf("stop pod runner: %v", err)
		}
	})
	return c
}

func pod(name, image string, args []string, mutate func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"podrun": "yes", "app": name}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: image, Command: []string{"entrypoint"}, Args: args}}},
	}
	if mutate != nil {
		mutate(p)
	}
	return p
}

func create(t *testing.T, c *harness.Cluster, p *corev1.Pod) {
	t.Helper()
	ctx := harness.Context(t, time.Minute)
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitPod waits until cond holds for the pod and returns it.
func waitPod(t *testing.T, c *harness.Cluster, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var last *corev1.Pod
	err := harness.Eventually(timeout, 100*time.Millisecond, func() error {
		p, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		last = p
		if !cond(p) {
			return fmt.Errorf("%s: not %s (phase %s)", name, what, p.Status.Phase)
		}
		return nil
	})
	if err != nil {
		c.DumpLogs(t, 30)
		t.Fatalf("%v; status %+v", err, last.Status)
	}
	return last
}

func ready(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

func pid(t *testing.T, p *corev1.Pod) int {
	t.Helper()
	if len(p.Status.ContainerStatuses) == 0 {
		t.Fatalf("%s has no container status", p.Name)
	}
	n, err := strconv.Atoi(strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "podrunner://"))
	if err != nil {
		t.Fatalf("container ID %q: %v", p.Status.ContainerStatuses[0].ContainerID, err)
	}
	return n
}

// deleteAndTime deletes a pod (grace from its spec) and returns how long the object lived on.
func deleteAndTime(t *testing.T, c *harness.Cluster, name string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := harness.Eventually(timeout, 50*time.Millisecond, func() error {
		_, err := c.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("%s still there: %v", name, err)
	})
	if err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

func TestPodRunnerDeletion(t *testing.T) {
	c := start(t)
	preStop := func(h *corev1.LifecycleHandler) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: h} }
	}
	// Ignores SIGTERM (and so does its sleep): only SIGKILL at the end of the grace period ends it.
	stubborn := pod("stubborn", "example/sh", []string{"-c", "trap '' TERM; while :; do sleep 0.2; done"}, func(p *corev1.Pod) {
		p.Spec.TerminationGracePeriodSeconds = ptr.To(int64(4))
		preStop(&corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 1}})(p)
	})
	// Exits on SIGTERM: gone right after its preStop sleep, long before its 30 s grace period.
	polite := pod("polite", "example/sh", []string{"-c", "exec sleep 600"}, func(p *corev1.Pod) {
		p.Spec.TerminationGracePeriodSeconds = ptr.To(int64(30))
		preStop(&corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sleep", "2"}}})(p)
	})
	forced := pod("forced", "example/sh", []string{"-c", "trap '' TERM; while :; do sleep 0.2; done"}, func(p *corev1.Pod) {
		p.Spec.TerminationGracePeriodSeconds = ptr.To(int64(30))
	})
	for _, p := range []*corev1.Pod{stubborn, polite, forced} {
		create(t, c, p)
	}
	running := map[string]int{}
	for _, name := range []string{"stubborn", "polite", "forced"} {
		p := waitPod(t, c, name, time.Minute, "ready", ready)
		running[name] = pid(t, p)
		if !runfiles.Alive(running[name]) {
			t.Fatalf("%s: process %d not running", name, running[name])
		}
	}

	// Graceful, SIGTERM ignored: preStop 1 s, SIGTERM, SIGKILL at the end of the 4 s grace.
	if d := deleteAndTime(t, c, "stubborn", 20*time.Second); d < 3500*time.Millisecond || d > 10*time.Second {
		t.Errorf("stubborn pod (grace 4 s, SIGTERM ignored) was gone after %v: want about 4 s", d)
	} else {
		t.Logf("stubborn pod gone after %v (grace 4 s)", d)
	}
	if runfiles.Alive(running["stubborn"]) {
		t.Errorf("stubborn pod's process %d still alive after the final delete", running["stubborn"])
	}
	// Graceful, SIGTERM honoured: the preStop sleep (2 s), then gone.
	if d := deleteAndTime(t, c, "polite", 25*time.Second); d < 1800*time.Millisecond || d > 10*time.Second {
		t.Errorf("polite pod (preStop sleep 2 s, exits on SIGTERM) was gone after %v: want about 2 s", d)
	} else {
		t.Logf("polite pod gone after %v (preStop 2 s, grace 30 s)", d)
	}
	// Force delete: the object is gone at once, and so is the process (no grace).
	if err := c.Client.CoreV1().Pods(ns).Delete(context.Background(), "forced", metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}); err != nil {
		t.Fatal(err)
	}
	if err := harness.Eventually(3*time.Second, 20*time.Millisecond, func() error {
		if runfiles.Alive(running["forced"]) {
			return fmt.Errorf("process %d of the force-deleted pod still alive", running["forced"])
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

func TestPodRunnerProbesAndBackends(t *testing.T) {
	c := start(t)
	ctx := harness.Context(t, 2*time.Minute)
	web := pod("web", "example/python", []string{"-m", "http.server", "8080", "--bind", "127.0.0.1"}, func(p *corev1.Pod) {
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}
		p.Spec.Containers[0].ReadinessProbe = &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 1,
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromString("http")}}}
	})
	if _, err := c.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromString("http")}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	create(t, c, web)
	waitPod(t, c, "web", time.Minute, "ready", ready)

	// Its Service's backend is in the API server's resolver, on the pod's own port, and serves.
	if err := c.WaitBackendsReady(ns, "web", 1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	bs, err := c.ResolverState(ns, "web")
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 1 || bs[0].Port != 80 || !strings.HasPrefix(bs[0].Addr, "127.0.0.1:") || strings.HasSuffix(bs[0].Addr, ":8080") {
		t.Fatalf("backends %+v: want one 127.0.0.1 address (not the container port 8080) for Service port 80", bs)
	}
	resp, err := http.Get("http://" + bs[0].Addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET through the backend: %d", resp.StatusCode)
	}

	// A failing liveness probe (404) restarts the container; the pod reports the restarts.
	sick := pod("sick", "example/python", []string{"-m", "http.server", "8081", "--bind", "127.0.0.1"}, func(p *corev1.Pod) {
		p.Spec.TerminationGracePeriodSeconds = ptr.To(int64(2))
		p.Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 8081}}
		p.Spec.Containers[0].LivenessProbe = &corev1.Probe{PeriodSeconds: 1, FailureThreshold: 2, InitialDelaySeconds: 1,
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/nope", Port: intstr.FromInt32(8081)}}}
	})
	create(t, c, sick)
	waitPod(t, c, "sick", time.Minute, "restarted twice", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 2
	})

	// Deleting the ready pod takes its backend away at once (a terminating endpoint).
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitBackendsReady(ns, "web", 0, 5*time.Second); err != nil {
		t.Error(err)
	}
}

func TestPodRunnerVolumesEnvAndToken(t *testing.T) {
	c := start(t)
	ctx := harness.Context(t, 2*time.Minute)
	// The container writes its environment into an emptyDir and waits; its Secret volume is
	// optional and the Secret does not exist yet.
	p := pod("env", "example/sh", []string{"-c", `echo "$POD_NAME $POD_NAMESPACE $NODE $POD_IP $CONF" > /out/env; exec sleep 600`}, func(p *corev1.Pod) {
		ctr := &p.Spec.Containers[0]
		field := func(path string) *corev1.EnvVarSource {
			return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
		}
		ctr.Env = []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: field("metadata.name")}, {Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
			{Name: "NODE", ValueFrom: field("spec.nodeName")}, {Name: "POD_IP", ValueFrom: field("status.podIP")}, {Name: "CONF", Value: "/etc/conf/key"}}
		ctr.VolumeMounts = []corev1.VolumeMount{{Name: "out", MountPath: "/out"}, {Name: "conf", MountPath: "/etc/conf"}}
		p.Spec.Volumes = []corev1.Volume{
			{Name: "out", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "conf", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "conf", Optional: ptr.To(true)}}},
		}
	})
	dir, env := runAndReadEnv(t, c, p)
	want := fmt.Sprintf("env %s runner-0 127.0.0.1 %s", ns, filepath.Join(dir, "volumes", "conf", "key"))
	if env != want {
		t.Errorf("container environment %q, want %q", env, want)
	}

	// The Secret appears, then changes: the volume follows (AtomicWriter, ..data swapped).
	key := filepath.Join(dir, "volumes", "conf", "key")
	secrets := c.Client.CoreV1().Secrets(ns)
	if _, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "conf"}, Data: map[string][]byte{"key": []byte("one")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"one", "two"} {
		if v == "two" {
			if _, err := secrets.Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "conf"}, Data: map[string][]byte{"key": []byte("two")}}, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		if err := harness.Eventually(20*time.Second, 100*time.Millisecond, func() error {
			b, err := os.ReadFile(key)
			if err != nil || string(b) != v {
				return fmt.Errorf("%s: %q, %v; want %q", key, b, err, v)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	if target, err := os.Readlink(filepath.Join(dir, "volumes", "conf", "key")); err != nil || target != "..data/key" {
		t.Errorf("key is not the kubelet's ..data symlink: %q, %v", target, err)
	}

	// The identity: a bound token of the ServiceAccount "default", in the kubeconfig it was given.
	user := whoAmI(t, ctx, filepath.Join(dir, "kubeconfig"))
	if u := user.Username; u != "system:serviceaccount:"+ns+":default" {
		t.Errorf("the pod's kubeconfig authenticates as %q", u)
	}
	if pods := user.Extra["authentication.kubernetes.io/pod-name"]; len(pods) != 1 || pods[0] != "env" {
		t.Errorf("token not bound to the pod: extra %v", user.Extra)
	}

	// automountServiceAccountToken: false and the pod's own projection at the in-cluster path
	// (deploy/'s Deployment): the token comes from the TokenRequest API with the projection's
	// expirationSeconds, beside the CA and the namespace; without a projection, no identity.
	projected := func(p *corev1.Pod) {
		p.Spec.AutomountServiceAccountToken = ptr.To(false)
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "out", MountPath: "/out"},
			{Name: "api-token", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}}
		p.Spec.Volumes = []corev1.Volume{
			{Name: "out", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "api-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To(int64(3600))}},
				{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
					Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
					{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}}}},
			}}}},
		}
	}
	none := func(p *corev1.Pod) {
		p.Spec.AutomountServiceAccountToken = ptr.To(false)
		p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "out", MountPath: "/out"}}
		p.Spec.Volumes = []corev1.Volume{{Name: "out", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
	}
	for name, mutate := range map[string]func(*corev1.Pod){"projected": projected, "none": none} {
		dir, env := runAndReadEnv(t, c, pod(name, "example/sh", []string{"-c", `echo "kubeconfig=$KUBECONFIG" > /out/env; exec sleep 600`}, mutate))
		if name == "none" {
			if env != "kubeconfig=" {
				t.Errorf("pod without a token projection was given %q", env)
			}
			if _, err := os.Stat(filepath.Join(dir, "kubeconfig")); err == nil {
				t.Error("pod without a token projection has a kubeconfig")
			}
			continue
		}
		if env != "kubeconfig="+filepath.Join(dir, "kubeconfig") {
			t.Errorf("projected: environment %q", env)
		}
		for file, want := range map[string]string{"namespace": ns, "ca.crt": "-----BEGIN CERTIFICATE-----"} {
			b, err := os.ReadFile(filepath.Join(dir, "volumes", "api-token", file))
			if err != nil || !strings.HasPrefix(string(b), want) {
				t.Errorf("projected %s: %q, %v", file, b, err)
			}
		}
		token, err := os.ReadFile(filepath.Join(dir, "volumes", "api-token", "token"))
		if err != nil {
			t.Fatal(err)
		}
		if life, err := tokenLifetime(string(token)); err != nil || life != time.Hour {
			t.Errorf("projected token lifetime %v (%v), want expirationSeconds 3600", life, err)
		}
		kc, err := clientcmd.LoadFromFile(filepath.Join(dir, "kubeconfig"))
		if err != nil {
			t.Fatal(err)
		}
		if ai := kc.AuthInfos["serviceaccount"]; ai == nil || ai.TokenFile != filepath.Join(dir, "volumes", "api-token", "token") {
			t.Errorf("kubeconfig does not read the projected token file: %+v", ai)
		}
		user := whoAmI(t, ctx, filepath.Join(dir, "kubeconfig"))
		if pods := user.Extra["authentication.kubernetes.io/pod-name"]; user.Username != "system:serviceaccount:"+ns+":default" || len(pods) != 1 || pods[0] != name {
			t.Errorf("projected token authenticates as %+v", user)
		}
	}
}

// runAndReadEnv creates the pod, waits until it is ready and returns its directory and what its
// container wrote into /out/env (an emptyDir named "out").
func runAndReadEnv(t *testing.T, c *harness.Cluster, p *corev1.Pod) (dir, env string) {
	t.Helper()
	create(t, c, p)
	got := waitPod(t, c, p.Name, time.Minute, "ready", ready)
	dir = filepath.Join(c.RunDir, "pods", "runner", fmt.Sprintf("%s_%s_%s", ns, got.Name, got.UID))
	if err := harness.Eventually(10*time.Second, 100*time.Millisecond, func() error {
		b, err := os.ReadFile(filepath.Join(dir, "volumes", "out", "env"))
		env = strings.TrimSpace(string(b))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return dir, env
}

// whoAmI is the API server's view of the identity in a kubeconfig (SelfSubjectReview).
func whoAmI(t *testing.T, ctx context.Context, kubeconfig string) authenticationv1.UserInfo {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*kc, nil).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	review, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return review.Status.UserInfo
}

// tokenLifetime is exp - iat of a JWT (its claims read without checking the signature: the API
// server checked it above).
func tokenLifetime(jwt string) (time.Duration, error) {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return 0, fmt.Errorf("not a JWT")
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return 0, err
	}
	var claims struct{ Exp, Iat int64 }
	if err := json.Unmarshal(b, &claims); err != nil {
		return 0, err
	}
	return time.Duration(claims.Exp-claims.Iat) * time.Second, nil
}
