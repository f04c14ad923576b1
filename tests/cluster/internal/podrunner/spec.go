package podrunner

// The pure part of the pod runner: how a pod spec written for a cluster becomes a local process.
// No I/O here; table tests beside it (spec_test.go).
//
//   - Ports: every containerPort gets its own free 127.0.0.1 port (the pod's "IP" is 127.0.0.1
//     and all pods share it, so container ports cannot be kept). In args and env values,
//     "HOST:PORT" with HOST one of 0.0.0.0, 127.0.0.1, localhost, [::], [::1] or empty
//     (":8443") becomes 127.0.0.1:HOSTPORT, and a value that is only the port number (the whole
//     value, or the value of --flag=PORT) becomes HOSTPORT. Probes and Service targetPorts are
//     resolved through the same map. A port that is not declared in the spec cannot be found and
//     is left alone; a bind address 0.0.0.0 left over after the rewrite refuses the start.
//   - Volume mounts: each mountPath becomes a per-pod directory; a path in args or env that is
//     the mountPath or under it is rewritten (at path boundaries only).

import (
	"fmt"
	"net"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"
)

// LocalIP is the address of every pod: processes listen on it, and the downward API's
// status.podIP and status.hostIP name it.
const LocalIP = "127.0.0.1"

// Rewriter maps what a container's spec names to what this machine gives it.
type Rewriter struct {
	// Ports maps a containerPort to its 127.0.0.1 port.
	Ports map[int32]int32
	// Mounts maps a mountPath to the local directory that stands in for it.
	Mounts map[string]string
}

var hostPortRE = regexp.MustCompile(`(0\.0\.0\.0|127\.0\.0\.1|localhost|\[::\]|\[::1\])?:([0-9]{1,5})`)

// Rewrite applies the port and mount rules to one argument or env value.
func (r Rewriter) Rewrite(s string) string {
	return r.rewriteMounts(r.rewritePorts(s))
}

func (r Rewriter) rewritePorts(s string) string {
	if len(r.Ports) == 0 {
		return s
	}
	// A value that is only a port number: the whole value, or that of --flag=PORT.
	if p, ok := r.port(s); ok {
		return strconv.Itoa(int(p))
	}
	if k, v, ok := strings.Cut(s, "="); ok && strings.HasPrefix(k, "-") {
		if p, ok := r.port(v); ok {
			return k + "=" + strconv.Itoa(int(p))
		}
	}
	var b strings.Builder
	last := 0
	for _, m := range hostPortRE.FindAllStringSubmatchIndex(s, -1) {
		start, end := m[0], m[1]
		hostGiven := m[2] >= 0
		if !hostGiven && start > 0 && isHostChar(s[start-1]) {
			continue // "myhost:8443", "10.0.0.1:8443": not this pod
		}
		if hostGiven && start > 0 && isHostChar(s[start-1]) {
			continue // "10.0.0.0.0:..." or "xlocalhost:..."
		}
		if end < len(s) && s[end] >= '0' && s[end] <= '9' {
			continue
		}
		p, ok := r.port(s[m[4]:m[5]])
		if !ok {
			continue
		}
		b.WriteString(s[last:start])
		b.WriteString(net.JoinHostPort(LocalIP, strconv.Itoa(int(p))))
		last = end
	}
	b.WriteString(s[last:])
	return b.String()
}

func isHostChar(c byte) bool {
	return c == '.' || c == '-' || c == ']' || c == '_' ||
		(c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func (r Rewriter) port(s string) (int32, bool) {
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || strconv.FormatInt(n, 10) != s {
		return 0, false
	}
	p, ok := r.Ports[int32(n)]
	return p, ok
}

func (r Rewriter) rewriteMounts(s string) string {
	if len(r.Mounts) == 0 {
		return s
	}
	paths := make([]string, 0, len(r.Mounts))
	for p := range r.Mounts {
		paths = append(paths, p)
	}
	// Longest first: /etc/a/b wins over /etc/a.
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	var b strings.Builder
	for i := 0; i < len(s); {
		matched := false
		if i == 0 || isPathStart(s[i-1]) {
			for _, p := range paths {
				mp := strings.TrimRight(p, "/")
				if mp == "" || !strings.HasPrefix(s[i:], mp) {
					continue
				}
				end := i + len(mp)
				if end < len(s) && s[end] != '/' && isPathChar(s[end]) {
					continue // "/etc/tls2" is not under "/etc/tls"
				}
				b.WriteString(r.Mounts[p])
				i = end
				matched = true
				break
			}
		}
		if !matched {
			b.WriteByte(s[i])
			i++
		}
	}
	return b.String()
}

// isPathStart: a path may begin after these ("--tls-dir=/etc", "a:/etc", "x,/etc", " /etc").
func isPathStart(c byte) bool {
	return c == '=' || c == ':' || c == ',' || c == ' ' || c == '"' || c == '\'' || c == '\t'
}

func isPathChar(c byte) bool {
	return c == '.' || c == '-' || c == '_' || c == '/' ||
		(c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

// LeftoverWildcard reports an argument that would still bind every interface: the runner
// refuses to start such a process (everything listens on 127.0.0.1 only).
func LeftoverWildcard(values []string) error {
	for _, v := range values {
		if strings.Contains(v, "0.0.0.0") || strings.Contains(v, "[::]") {
			return fmt.Errorf("%q still names a wildcard address after the port rewrite (declare the port in the container's ports)", v)
		}
	}
	return nil
}

// ImageRule maps images to a local binary: Pattern is matched against the whole image
// reference, "*" matching any run of characters (also "/" and ":").
type ImageRule struct {
	Pattern, Binary string
}

// ParseImageRule parses "PATTERN=BINARY".
func ParseImageRule(s string) (ImageRule, error) {
	p, b, ok := strings.Cut(s, "=")
	if !ok || p == "" || b == "" {
		return ImageRule{}, fmt.Errorf("image rule %q: want PATTERN=BINARY, e.g. '*kube-overcommit*=/path/to/kube-overcommit'", s)
	}
	return ImageRule{Pattern: p, Binary: b}, nil
}

// MatchImage returns the binary of the first rule whose pattern matches image.
func MatchImage(rules []ImageRule, image string) (string, bool) {
	for _, r := range rules {
		re := "^" + strings.ReplaceAll(regexp.QuoteMeta(r.Pattern), `\*`, `.*`) + "$"
		if ok, _ := regexp.MatchString(re, image); ok {
			return r.Binary, true
		}
	}
	return "", false
}

// AssignPorts gives every declared containerPort of the pod a host port from next (called once
// per port, e.g. a free-port finder).
func AssignPorts(pod *corev1.Pod, next func() (int32, error)) (map[int32]int32, error) {
	out := map[int32]int32{}
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if _, done := out[p.ContainerPort]; done {
				continue
			}
			hp, err := next()
			if err != nil {
				return nil, err
			}
			out[p.ContainerPort] = hp
		}
	}
	return out, nil
}

// ResolvePort finds the host port of a port given by number or by name (a probe's port, a
// Service's targetPort) among the pod's containers.
func ResolvePort(pod *corev1.Pod, ports map[int32]int32, port intstr.IntOrString) (int32, error) {
	cp := int32(0)
	if port.Type == intstr.String {
		for _, c := range pod.Spec.Containers {
			for _, p := range c.Ports {
				if p.Name == port.StrVal {
					cp = p.ContainerPort
				}
			}
		}
		if cp == 0 {
			return 0, fmt.Errorf("no container port named %q", port.StrVal)
		}
	} else {
		cp = port.IntVal
	}
	hp, ok := ports[cp]
	if !ok {
		return 0, fmt.Errorf("container port %d is not declared in the pod's ports", cp)
	}
	return hp, nil
}

// ProbeURL is where an httpGet probe is sent.
func ProbeURL(pod *corev1.Pod, ports map[int32]int32, p *corev1.Probe) (string, error) {
	if p.HTTPGet == nil {
		return "", fmt.Errorf("only httpGet probes are supported")
	}
	hp, err := ResolvePort(pod, ports, p.HTTPGet.Port)
	if err != nil {
		return "", fmt.Errorf("probe port: %w", err)
	}
	scheme := "http"
	if p.HTTPGet.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	path := p.HTTPGet.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	return fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(LocalIP, strconv.Itoa(int(hp))), path), nil
}

// FieldValue is the downward API value of a fieldRef.
func FieldValue(pod *corev1.Pod, fieldPath string) (string, error) {
	switch fieldPath {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.podIP", "status.hostIP":
		return LocalIP, nil
	case "status.podIPs", "status.hostIPs":
		return LocalIP, nil
	}
	for _, m := range []struct {
		prefix string
		from   map[string]string
	}{{"metadata.labels", pod.Labels}, {"metadata.annotations", pod.Annotations}} {
		if rest, ok := strings.CutPrefix(fieldPath, m.prefix+"['"); ok {
			if key, ok := strings.CutSuffix(rest, "']"); ok {
				return m.from[key], nil
			}
		}
	}
	return "", fmt.Errorf("fieldRef %q is not supported", fieldPath)
}

// KeyLookup reads a key of a Secret or ConfigMap (kind "Secret" or "ConfigMap") for
// valueFrom; found false when the object or the key is missing.
type KeyLookup func(kind, namespace, name, key string) (value string, found bool, err error)

// ContainerEnv is the container's environment as the kubelet computes it: env in order,
// $(VAR) references to earlier variables expanded, valueFrom resolved (downward API fields,
// Secret and ConfigMap keys); then every value rewritten.
func ContainerEnv(pod *corev1.Pod, c *corev1.Container, lookup KeyLookup, rw Rewriter) ([]string, error) {
	vars := map[string]string{}
	var order []string
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom == nil:
			v = expansion.Expand(v, expansion.MappingFuncFor(vars))
		case e.ValueFrom.FieldRef != nil:
			fv, err := FieldValue(pod, e.ValueFrom.FieldRef.FieldPath)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			v = fv
		case e.ValueFrom.SecretKeyRef != nil || e.ValueFrom.ConfigMapKeyRef != nil:
			kind, name, key, optional := "Secret", "", "", false
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				name, key, optional = r.Name, r.Key, r.Optional != nil && *r.Optional
			} else {
				r := e.ValueFrom.ConfigMapKeyRef
				kind, name, key, optional = "ConfigMap", r.Name, r.Key, r.Optional != nil && *r.Optional
			}
			val, found, err := lookup(kind, pod.Namespace, name, key)
			if err != nil {
				return nil, fmt.Errorf("env %s: %s %s: %w", e.Name, kind, name, err)
			}
			if !found {
				if optional {
					continue
				}
				return nil, fmt.Errorf("env %s: %s %s/%s has no key %q", e.Name, kind, pod.Namespace, name, key)
			}
			v = val
		default:
			return nil, fmt.Errorf("env %s: only fieldRef, secretKeyRef and configMapKeyRef are supported", e.Name)
		}
		if _, seen := vars[e.Name]; !seen {
			order = append(order, e.Name)
		}
		vars[e.Name] = v
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+rw.Rewrite(vars[k]))
	}
	return out, nil
}

// CommandLine is the binary's argument list: the container's command after its first word
// (the image's entrypoint is the mapped binary itself) followed by its args, with $(VAR)
// expanded from env (KEY=VALUE) and rewritten.
func CommandLine(c *corev1.Container, env []string, rw Rewriter) []string {
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	var words []string
	if len(c.Command) > 1 {
		words = append(words, c.Command[1:]...)
	}
	words = append(words, c.Args...)
	out := make([]string, 0, len(words))
	for _, w := range words {
		out = append(out, rw.Rewrite(expansion.Expand(w, expansion.MappingFuncFor(vars))))
	}
	return out
}

// PreStopWait is how long a preStop hook keeps the container running before SIGTERM: the
// sleep action, or an exec of `sleep N` (what images with a shell use); ok false when the hook
// is of another kind (the runner then logs that it skips it).
func PreStopWait(c *corev1.Container) (d time.Duration, ok bool) {
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil {
		return 0, true
	}
	h := c.Lifecycle.PreStop
	if h.Sleep != nil {
		return time.Duration(h.Sleep.Seconds) * time.Second, true
	}
	if h.Exec != nil {
		cmd := h.Exec.Command
		if len(cmd) == 3 && (cmd[0] == "sh" || cmd[0] == "/bin/sh") && cmd[1] == "-c" {
			cmd = strings.Fields(cmd[2])
		}
		if len(cmd) == 2 && (cmd[0] == "sleep" || strings.HasSuffix(cmd[0], "/sleep")) {
			if secs, err := strconv.ParseFloat(cmd[1], 64); err == nil && secs >= 0 {
				return time.Duration(secs * float64(time.Second)), true
			}
		}
	}
	return 0, false
}

// MinKillGrace is the kubelet's minimumGracePeriodInSeconds: SIGTERM always gets at least this
// long before SIGKILL, even when the preStop hook used up the grace period.
const MinKillGrace = 2 * time.Second

// KillPlan splits a grace period as the kubelet's killContainer does: the preStop hook runs for
// at most the grace period, and what is left (at least MinKillGrace) is the time between
// SIGTERM and SIGKILL.
func KillPlan(grace, preStop time.Duration) (hook, term time.Duration) {
	hook = min(preStop, grace)
	if grace <= 0 {
		hook = 0
	}
	return hook, max(grace-hook, MinKillGrace)
}

// Registration is one webhook backend of a Service in the resolver's registry.
type Registration struct {
	Namespace, Service string
	Port               int32 // the Service port
	Addr               string
}

// ServiceBackends lists the backends a ready pod gives the Services that select it: one per
// Service port whose targetPort the pod declares (like the endpoints of an EndpointSlice).
func ServiceBackends(pod *corev1.Pod, ports map[int32]int32, svcs []*corev1.Service) []Registration {
	var out []Registration
	for _, s := range svcs {
		if s.Namespace != pod.Namespace || len(s.Spec.Selector) == 0 ||
			!labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			continue
		}
		for _, sp := range s.Spec.Ports {
			target := sp.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(sp.Port)
			}
			hp, err := ResolvePort(pod, ports, target)
			if err != nil {
				continue
			}
			out = append(out, Registration{Namespace: s.Namespace, Service: s.Name, Port: sp.Port,
				Addr: net.JoinHostPort(LocalIP, strconv.Itoa(int(hp)))})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].key() < out[j].key() })
	return out
}

func (r Registration) key() string {
	return fmt.Sprintf("%s/%s/%05d/%s", r.Namespace, r.Service, r.Port, r.Addr)
}
