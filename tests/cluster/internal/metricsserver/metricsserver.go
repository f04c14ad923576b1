// Package metricsserver runs the real metrics-server (sigs.k8s.io/metrics-server, its own
// command) against the local control plane: it serves on 127.0.0.1 with a certificate of the
// run's CA, is reached by the API server's aggregator through Service kube-system/
// metrics-server (a backend in the run's service registry, plus an EndpointSlice so that the
// aggregator's availability check finds an endpoint) and APIService v1beta1.metrics.k8s.io
// (caBundle = the run's CA), and scrapes the fake kubelets' /metrics/resource over TLS,
// verifying them with the same CA. It never selects hollow nodes (real kubelets that must not
// be dialled).
package metricsserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	apiregv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregator "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/ptr"

	"kube-overcommit/tests/cluster/internal/hollownode"
	"kube-overcommit/tests/cluster/internal/pki"
	"kube-overcommit/tests/cluster/internal/runfiles"
	"kube-overcommit/tests/cluster/internal/services"
)

const (
	// Namespace and Service of metrics-server, as in its own manifests.
	Namespace = "kube-system"
	Service   = "metrics-server"
	// APIService is the name of the registration of metrics.k8s.io/v1beta1.
	APIService = "v1beta1.metrics.k8s.io"
	// servicePort is the Service port the APIService names (its manifests use 443).
	servicePort = 443
	portName    = "https"
	// endpointIP is the EndpointSlice's address: the aggregator requires a ready endpoint but
	// dials through the service registry (127.0.0.1:port); EndpointSlice validation rejects
	// loopback addresses, so it is a made-up pod address.
	endpointIP = "10.128.0.2"
)

// Args are the upstream metrics-server flags for this run directory, serving on port.
// Flags the caller appends after them win (pflag keeps the last value).
func Args(run runfiles.Dir, files pki.Files, port int) []string {
	kc := run.Kubeconfig()
	return []string{
		"--kubeconfig=" + kc, "--authentication-kubeconfig=" + kc, "--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + files.MetricsServerCert, "--tls-private-key-file=" + files.MetricsServerKey,
		// The fake kubelets' serving certificates are issued by the run's CA for 127.0.0.1.
		"--kubelet-certificate-authority=" + files.CACert,
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-use-node-status-port",
		// The shortest resolution metrics-server accepts; it must exceed the kubelet request
		// timeout (default 10 s).
		"--metric-resolution=10s", "--kubelet-request-timeout=5s",
	}
}

// nodeSelector is metrics-server's --node-selector: the caller's selector (may be empty) and
// never a hollow node, whose kubelet must not be dialled (package hollownode).
func nodeSelector(sel string) string {
	if sel == "" {
		return hollownode.Selector
	}
	return sel + "," + hollownode.Selector
}

// ExcludeHollow rewrites metrics-server flags so that hollow nodes stay excluded: every
// --node-selector / -l (any form) goes, and one selector, the last one given combined with
// the exclusion, is appended (pflag keeps the last value).
func ExcludeHollow(args []string) []string {
	var out []string
	sel := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--node-selector" || a == "-l":
			if i+1 < len(args) {
				sel = args[i+1]
				i++
			}
		case strings.HasPrefix(a, "--node-selector="):
			sel = strings.TrimPrefix(a, "--node-selector=")
		case strings.HasPrefix(a, "-l"):
			sel = strings.TrimPrefix(strings.TrimPrefix(a, "-l"), "=")
		default:
			out = append(out, a)
		}
	}
	return append(out, "--node-selector="+nodeSelector(sel))
}

// RegisterWhenServing waits until metrics-server answers the aggregator's availability check
// on 127.0.0.1:port (GET /apis/metrics.k8s.io/v1beta1 with the front-proxy client certificate
// as system:kube-aggregator in system:masters; it fails until metrics-server has loaded the
// requestheader CA, and a failed check is retried by the aggregator only after a backoff of up
// to 30 s), then makes the aggregator route metrics.k8s.io/v1beta1 there: a registry backend (waiting until the
// API server's resolver has it), the Service, its EndpointSlice and the APIService (created or
// updated). The EndpointSlice is rewritten each time (registeredAt), so the aggregator re-checks
// the APIService's availability at once, with metrics-server already serving.
func RegisterWhenServing(ctx context.Context, cfg *rest.Config, run runfiles.Dir, files pki.Files, port int) error {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	client, err := frontProxyClient(files)
	if err != nil {
		return err
	}
	if err := until(ctx, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/apis/metrics.k8s.io/v1beta1", nil)
		if err != nil {
			return err
		}
		req.Header.Set("X-Remote-User", "system:kube-aggregator")
		req.Header.Set("X-Remote-Group", "system:masters")
		res, err := client.Do(req)
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("discovery: %s", res.Status)
		}
		return nil
	}); err != nil {
		return fmt.Errorf("metrics-server not serving on %s: %w", addr, err)
	}
	// One metrics-server: backends left by earlier ones (killed, so not unregistered) go.
	old, err := services.List(run.Services(), Namespace, Service)
	if err != nil {
		return fmt.Errorf("service registry: %w", err)
	}
	for _, b := range old {
		if b.Addr != addr {
			if err := services.Remove(run.Services(), Namespace, Service, b.Addr, b.Port); err != nil {
				return fmt.Errorf("service registry: %w", err)
			}
		}
	}
	if err := services.Add(run.Services(), Namespace, Service, services.Backend{Addr: addr, Port: servicePort}); err != nil {
		return fmt.Errorf("service registry: %w", err)
	}
	if err := until(ctx, func() error {
		st, err := services.ReadState(run.Services())
		if err != nil {
			return err
		}
		for _, b := range st[Namespace+"/"+Service] {
			if b.Addr == addr && b.Ready {
				return nil
			}
		}
		return fmt.Errorf("the API server's resolver does not have %s yet", addr)
	}); err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	agg, err := aggregator.NewForConfig(cfg)
	if err != nil {
		return err
	}
	caBundle, err := os.ReadFile(files.CACert)
	if err != nil {
		return err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: Service, Namespace: Namespace, Labels: map[string]string{"k8s-app": Service}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: portName, Port: servicePort, Protocol: corev1.ProtocolTCP,
		}}},
	}
	if _, err := kube.CoreV1().Services(Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("service: %w", err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: Service + "-kcp", Namespace: Namespace, Labels: map[string]string{
			discoveryv1.LabelServiceName: Service,
			discoveryv1.LabelManagedBy:   "kcp.overcommit.dev",
		}, Annotations: map[string]string{registeredAt: time.Now().UTC().Format(time.RFC3339Nano)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{endpointIP}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To(portName), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	slices := kube.DiscoveryV1().EndpointSlices(Namespace)
	if cur, err := slices.Get(ctx, slice.Name, metav1.GetOptions{}); err == nil {
		slice.ResourceVersion = cur.ResourceVersion
		_, err = slices.Update(ctx, slice, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("endpointslice: %w", err)
		}
	} else if _, err := slices.Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("endpointslice: %w", err)
	}
	api := &apiregv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: APIService, Labels: map[string]string{"k8s-app": Service}},
		Spec: apiregv1.APIServiceSpec{
			Service:              &apiregv1.ServiceReference{Namespace: Namespace, Name: Service, Port: ptr.To(int32(servicePort))},
			Group:                "metrics.k8s.io",
			Version:              "v1beta1",
			CABundle:             caBundle,
			GroupPriorityMinimum: 100,
			VersionPriority:      100,
		},
	}
	apis := agg.ApiregistrationV1().APIServices()
	if cur, err := apis.Get(ctx, api.Name, metav1.GetOptions{}); err == nil {
		api.ResourceVersion = cur.ResourceVersion
		_, err = apis.Update(ctx, api, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("apiservice: %w", err)
		}
	} else if _, err := apis.Create(ctx, api, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("apiservice: %w", err)
	}
	return nil
}

// frontProxyClient is an HTTPS client as the aggregator: the front-proxy client certificate,
// metrics-server's certificate verified with the run's CA for the Service's name.
func frontProxyClient(files pki.Files) (*http.Client, error) {
	cert, err := tls.LoadX509KeyPair(files.FrontProxyCert, files.FrontProxyKey)
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(files.CACert)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s: no certificate", files.CACert)
	}
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: pki.MetricsServerDNS, MinVersion: tls.VersionTLS12,
	}}}, nil
}

// registeredAt (on the EndpointSlice) is when metrics-server was last registered.
const registeredAt = "kcp.overcommit.dev/registered-at"

// until calls f every 100 ms until it succeeds or ctx ends.
func until(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Unregister removes the registry backend 127.0.0.1:port (the APIService stays: the API then
// answers 503 for metrics.k8s.io, as when a real metrics-server is down).
func Unregister(run runfiles.Dir, port int) error {
	return services.Remove(run.Services(), Namespace, Service, "127.0.0.1:"+strconv.Itoa(port), servicePort)
}
