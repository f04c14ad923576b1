package podrunner

import (
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func TestRewrite(t *testing.T) {
	rw := Rewriter{
		Ports:  map[int32]int32{8443: 40001, 8080: 40002},
		Mounts: map[string]string{"/etc/kube-overcommit/tls": "/run/p/volumes/tls", "/etc/kube-overcommit": "/run/p/volumes/conf"},
	}
	for _, tc := range []struct{ in, want string }{
		{"--listen=0.0.0.0:8443", "--listen=127.0.0.1:40001"},
		{"--probe-listen=0.0.0.0:8080", "--probe-listen=127.0.0.1:40002"},
		{"--listen=:8443", "--listen=127.0.0.1:40001"},
		{"localhost:8080", "127.0.0.1:40002"},
		{"[::]:8443", "127.0.0.1:40001"},
		{"127.0.0.1:8080,0.0.0.0:8443", "127.0.0.1:40002,127.0.0.1:40001"},
		{"http://0.0.0.0:8080/readyz", "http://127.0.0.1:40002/readyz"},
		{"--port=8443", "--port=40001"},
		{"8080", "40002"},
		// Not this pod's ports or addresses: left alone.
		{"--listen=0.0.0.0:9090", "--listen=0.0.0.0:9090"},
		{"myhost:8443", "myhost:8443"},
		{"10.0.0.1:8443", "10.0.0.1:8443"},
		{"0.0.0.0:84430", "0.0.0.0:84430"},
		{"--replicas=80800", "--replicas=80800"},
		{"serve", "serve"},
		// Mounts: at path boundaries, longest first.
		{"--tls-dir=/etc/kube-overcommit/tls", "--tls-dir=/run/p/volumes/tls"},
		{"/etc/kube-overcommit/tls/tls.crt", "/run/p/volumes/tls/tls.crt"},
		{"/etc/kube-overcommit/policy.yaml", "/run/p/volumes/conf/policy.yaml"},
		{"/etc/kube-overcommit-other", "/etc/kube-overcommit-other"},
		{"/etc/kube-overcommit/tlsx", "/run/p/volumes/conf/tlsx"},
		{"x/etc/kube-overcommit", "x/etc/kube-overcommit"},
		{"a:/etc/kube-overcommit/tls", "a:/run/p/volumes/tls"},
	} {
		if got := rw.Rewrite(tc.in); got != tc.want {
			t.Errorf("Rewrite(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestLeftoverWildcard(t *testing.T) {
	if err := LeftoverWildcard([]string{"--listen=127.0.0.1:1", "X=y"}); err != nil {
		t.Errorf("unexpected: %v", err)
	}
	for _, bad := range []string{"--listen=0.0.0.0:9090", "[::]:1"} {
		if err := LeftoverWildcard([]string{bad}); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestMatchImage(t *testing.T) {
	rules := []ImageRule{{"*kube-overcommit*", "/bin/ko"}, {"registry.k8s.io/pause:*", "/bin/pause"}}
	for _, tc := range []struct {
		image, want string
		ok          bool
	}{
		{"kube-overcommit", "/bin/ko", true},
		{"ghcr.io/x/kube-overcommit:v1.2", "/bin/ko", true},
		{"registry.k8s.io/pause:3.10", "/bin/pause", true},
		{"registry.k8s.io/pausex", "", false},
		{"nginx", "", false},
	} {
		got, ok := MatchImage(rules, tc.image)
		if got != tc.want || ok != tc.ok {
			t.Errorf("MatchImage(%q) = %q, %v; want %q, %v", tc.image, got, ok, tc.want, tc.ok)
		}
	}
	for _, bad := range []string{"", "x", "=y", "x="} {
		if _, err := ParseImageRule(bad); err == nil {
			t.Errorf("ParseImageRule(%q): no error", bad)
		}
	}
}

func testPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ko-abc", Namespace: "kube-overcommit", UID: "u-1",
			Labels: map[string]string{"app": "ko", "tier": "webhook"}, Annotations: map[string]string{"a": "b"}},
		Spec: corev1.PodSpec{NodeName: "runner-1", ServiceAccountName: "ko", Containers: []corev1.Container{{
			Name:  "ko",
			Image: "kube-overcommit",
			Ports: []corev1.ContainerPort{{Name: "https", ContainerPort: 8443}, {Name: "probes", ContainerPort: 8080}},
			Env: []corev1.EnvVar{
				{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
				{Name: "NODE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
				{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
				{Name: "TIER", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['tier']"}}},
				{Name: "LISTEN", Value: "$(POD_IP):8443"},
				{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "token"}}},
				{Name: "OPT", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{
					LocalObjectReference: corev1.LocalObjectReference{Name: "missing"}, Key: "k", Optional: ptr.To(true)}}},
				{Name: "DIR", Value: "/etc/tls"},
			},
			Command: []string{"/kube-overcommit"},
			Args:    []string{"serve", "--listen=0.0.0.0:8443", "--tls-dir=/etc/tls", "--identity=$(POD_NAME)", "$(UNKNOWN)"},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "/readyz", Port: intstr.FromString("probes")}}},
			LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: "healthz", Port: intstr.FromInt32(8080), Scheme: corev1.URISchemeHTTPS}}},
		}}},
	}
}

func TestContainerEnvAndCommandLine(t *testing.T) {
	pod := testPod()
	c := &pod.Spec.Containers[0]
	rw := Rewriter{Ports: map[int32]int32{8443: 40001, 8080: 40002}, Mounts: map[string]string{"/etc/tls": "/p/tls"}}
	lookup := func(kind, ns, name, key string) (string, bool, error) {
		if kind == "Secret" && ns == "kube-overcommit" && name == "s" && key == "token" {
			return "t0k", true, nil
		}
		return "", false, nil
	}
	env, err := ContainerEnv(pod, c, lookup, rw)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"POD_NAME=ko-abc", "POD_NAMESPACE=kube-overcommit", "NODE=runner-1", "POD_IP=127.0.0.1",
		"TIER=webhook", "LISTEN=127.0.0.1:40001", "TOKEN=t0k", "DIR=/p/tls"}
	if !reflect.DeepEqual(env, want) {
		t.Errorf("env = %v\nwant  %v", env, want)
	}
	args := CommandLine(c, env, rw)
	wantArgs := []string{"serve", "--listen=127.0.0.1:40001", "--tls-dir=/p/tls", "--identity=ko-abc", "$(UNKNOWN)"}
	if !reflect.DeepEqual(args, wantArgs) {
		t.Errorf("args = %v\nwant   %v", args, wantArgs)
	}
	// A required key that is missing, and an unsupported source, are clear errors.
	c.Env = append(c.Env, corev1.EnvVar{Name: "REQ", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "nope"}}})
	if _, err := ContainerEnv(pod, c, lookup, rw); err == nil {
		t.Error("missing required secret key: no error")
	}
	c.Env = []corev1.EnvVar{{Name: "CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.cpu"}}}}
	if _, err := ContainerEnv(pod, c, lookup, rw); err == nil {
		t.Error("resourceFieldRef: no error")
	}
}

func TestProbeURLAndPorts(t *testing.T) {
	pod := testPod()
	n := int32(50000)
	ports, err := AssignPorts(pod, func() (int32, error) { n++; return n, nil })
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ports, map[int32]int32{8443: 50001, 8080: 50002}) {
		t.Fatalf("ports = %v", ports)
	}
	c := &pod.Spec.Containers[0]
	if u, err := ProbeURL(pod, ports, c.ReadinessProbe); err != nil || u != "http://127.0.0.1:50002/readyz" {
		t.Errorf("readiness URL %q, %v", u, err)
	}
	if u, err := ProbeURL(pod, ports, c.LivenessProbe); err != nil || u != "https://127.0.0.1:50002/healthz" {
		t.Errorf("liveness URL %q, %v", u, err)
	}
	for _, p := range []*corev1.Probe{
		{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromString("nope")}}},
		{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Port: intstr.FromInt32(9999)}}},
		{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}},
	} {
		if _, err := ProbeURL(pod, ports, p); err == nil {
			t.Errorf("probe %+v: no error", p.ProbeHandler)
		}
	}
}

func TestPreStopAndKillPlan(t *testing.T) {
	hook := func(h *corev1.LifecycleHandler) *corev1.Container {
		return &corev1.Container{Lifecycle: &corev1.Lifecycle{PreStop: h}}
	}
	for _, tc := range []struct {
		name string
		c    *corev1.Container
		want time.Duration
		ok   bool
	}{
		{"none", &corev1.Container{}, 0, true},
		{"sleep action", hook(&corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 10}}), 10 * time.Second, true},
		{"exec sleep", hook(&corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/bin/sleep", "3"}}}), 3 * time.Second, true},
		{"sh -c sleep", hook(&corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "sleep 1.5"}}}), 1500 * time.Millisecond, true},
		{"other exec", hook(&corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"/drain"}}}), 0, false},
	} {
		got, ok := PreStopWait(tc.c)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: PreStopWait = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	for _, tc := range []struct{ grace, pre, hook, term time.Duration }{
		{30 * time.Second, 10 * time.Second, 10 * time.Second, 20 * time.Second},
		{5 * time.Second, 10 * time.Second, 5 * time.Second, MinKillGrace},
		{30 * time.Second, 0, 0, 30 * time.Second},
		{time.Second, 0, 0, MinKillGrace},
	} {
		hook, term := KillPlan(tc.grace, tc.pre)
		if hook != tc.hook || term != tc.term {
			t.Errorf("KillPlan(%v, %v) = %v, %v; want %v, %v", tc.grace, tc.pre, hook, term, tc.hook, tc.term)
		}
	}
}

func TestServiceBackends(t *testing.T) {
	pod := testPod()
	ports := map[int32]int32{8443: 40001, 8080: 40002}
	svc := func(ns, name string, sel map[string]string, ps ...corev1.ServicePort) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.ServiceSpec{Selector: sel, Ports: ps}}
	}
	got := ServiceBackends(pod, ports, []*corev1.Service{
		svc("kube-overcommit", "webhook", map[string]string{"app": "ko"},
			corev1.ServicePort{Port: 443, TargetPort: intstr.FromString("https")},
			corev1.ServicePort{Port: 8080}, // targetPort defaults to the port
			corev1.ServicePort{Port: 9000, TargetPort: intstr.FromString("undeclared")}),
		svc("kube-overcommit", "other-app", map[string]string{"app": "other"}, corev1.ServicePort{Port: 443}),
		svc("kube-overcommit", "no-selector", nil, corev1.ServicePort{Port: 443}),
		svc("elsewhere", "webhook", map[string]string{"app": "ko"}, corev1.ServicePort{Port: 443}),
	})
	want := []Registration{
		{Namespace: "kube-overcommit", Service: "webhook", Port: 443, Addr: "127.0.0.1:40001"},
		{Namespace: "kube-overcommit", Service: "webhook", Port: 8080, Addr: "127.0.0.1:40002"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ServiceBackends = %+v\nwant %+v", got, want)
	}
}

func TestFieldValue(t *testing.T) {
	pod := testPod()
	for path, want := range map[string]string{
		"metadata.name": "ko-abc", "metadata.uid": "u-1", "spec.serviceAccountName": "ko",
		"status.hostIP": "127.0.0.1", "metadata.annotations['a']": "b", "metadata.labels['none']": "",
	} {
		if got, err := FieldValue(pod, path); err != nil || got != want {
			t.Errorf("FieldValue(%s) = %q, %v; want %q", path, got, err, want)
		}
	}
	if _, err := FieldValue(pod, "spec.hostname"); err == nil {
		t.Error("unsupported field: no error")
	}
}
