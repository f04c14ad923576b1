// go-webhook: the Go peer of kube-overcommit for the benchmarks. A controller-runtime
// webhook server with two CustomDefaulters (Node and Pod), registered the way kubebuilder
// generates them, doing the same mutation as kube-overcommit from the same policy file.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func admissionRequestFrom(ctx context.Context) (admission.Request, error) {
	return admission.RequestFromContext(ctx)
}

func main() {
	host := flag.String("host", "127.0.0.1", "address to listen on")
	port := flag.Int("port", 9443, "port to listen on")
	tlsDir := flag.String("tls-dir", "", "directory holding tls.crt and tls.key")
	policyFile := flag.String("policy-file", "", "YAML file of OvercommitPolicy documents (the product's format)")
	ownNamespace := flag.String("own-namespace", "kube-overcommit", "the webhook's own namespace (its pods are never touched)")
	maxSeconds := flag.Int("max-seconds", 3600, "exit after this many seconds")
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseDevMode(false)))

	if err := run(*host, *port, *tlsDir, *policyFile, *ownNamespace, time.Duration(*maxSeconds)*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "go-webhook:", err)
		os.Exit(1)
	}
}

func run(host string, port int, tlsDir, policyFile, ownNamespace string, maxRun time.Duration) error {
	if tlsDir == "" || policyFile == "" {
		return fmt.Errorf("--tls-dir and --policy-file are required")
	}
	policies, err := loadPolicyFile(policyFile)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	server := webhook.NewServer(webhook.Options{
		Host:    host,
		Port:    port,
		CertDir: tlsDir,
		TLSOpts: []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }},
	})
	// Registered as kubebuilder's `ctrl.NewWebhookManagedBy(mgr).For(&corev1.Node{}).WithDefaulter(...)` does.
	server.Register("/mutate--v1-node", admission.WithCustomDefaulter(scheme, &corev1.Node{}, &NodeCustomDefaulter{Policies: policies}))                          //nolint:staticcheck
	server.Register("/mutate--v1-pod", admission.WithCustomDefaulter(scheme, &corev1.Pod{}, &PodCustomDefaulter{Policies: policies, OwnNamespace: ownNamespace})) //nolint:staticcheck

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, maxRun)
	defer cancel()
	return server.Start(ctx)
}
