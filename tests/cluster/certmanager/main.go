// Command cert-manager runs cert-manager's own controllers and cainjector, built from the
// github.com/cert-manager/cert-manager module, against a test API server.
//
// The module proxy does not serve cert-manager's cmd/* modules (they are separate, untagged Go
// modules), so this main wires the same exported packages those commands wire: the controller
// ContextFactory with the registered control loops, and cainjector's RegisterAllInjectors on a
// controller-runtime manager. Only the controllers a CA/self-signed Issuer needs are started.
//
//	cert-manager controller --kubeconfig K --namespace NS
//	cert-manager cainjector --kubeconfig K --namespace NS
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	apiext "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	apireg "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"

	// Control loops register themselves in init.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// controllers are the control loops an Issuer of type selfSigned or ca needs, by their registered names.
var controllers = []string{
	"issuers",
	"certificaterequests-approver",
	"certificaterequests-issuer-ca",
	"certificaterequests-issuer-selfsigned",
	"certificates-trigger",
	"certificates-issuing",
	"certificates-key-manager",
	"certificates-readiness",
	"certificates-request-manager",
	"certificates-revision-manager",
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: cert-manager controller|cainjector --kubeconfig K --namespace NS")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the API server")
	namespace := fs.String("namespace", "", "namespace to watch (all when empty)")
	verbose := fs.Int("v", 0, "log verbosity")
	_ = fs.Parse(os.Args[2:])

	log := funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) },
		funcr.Options{Verbosity: *verbose})
	klog.SetLogger(log)
	ctrl.SetLogger(log)
	logf.Log = log

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logr.NewContext(ctx, log)

	var err error
	switch os.Args[1] {
	case "controller":
		err = runController(ctx, *kubeconfig, *namespace)
	case "cainjector":
		err = runCAInjector(ctx, *kubeconfig, *namespace)
	default:
		err = fmt.Errorf("unknown component %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cert-manager:", err)
		os.Exit(1)
	}
}

func runController(ctx context.Context, kubeconfig, namespace string) error {
	factory, err := controllerpkg.NewContextFactory(ctx, controllerpkg.ContextOptions{
		Kubeconfig: kubeconfig,
		Namespace:  namespace,
		IssuerOptions: controllerpkg.IssuerOptions{
			ClusterResourceNamespace: namespace,
		},
	})
	if err != nil {
		return fmt.Errorf("controller context: %w", err)
	}
	known := controllerpkg.Known()
	var wg sync.WaitGroup
	errs := make(chan error, len(controllers))
	for _, name := range controllers {
		construct, ok := known[name]
		if !ok {
			return fmt.Errorf("controller %q is not registered", name)
		}
		iface, err := construct(factory)
		if err != nil {
			return fmt.Errorf("controller %q: %w", name, err)
		}
		wg.Add(1)
		go func(name string, c controllerpkg.Interface) {
			defer wg.Done()
			if err := c.Run(2, ctx); err != nil {
				errs <- fmt.Errorf("controller %q: %w", name, err)
			}
		}(name, iface)
	}
	// The informer factories are shared: start them once every control loop has asked for its informers.
	base, err := factory.Build()
	if err != nil {
		return err
	}
	base.SharedInformerFactory.Start(ctx.Done())
	base.KubeSharedInformerFactory.Start(ctx.Done())
	base.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	wg.Wait()
	close(errs)
	return <-errs
}

func runCAInjector(ctx context.Context, kubeconfig, namespace string) error {
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	// The user agent names cainjector's field manager (as in cert-manager's own cainjector).
	restConfig = util.RestConfigWithUserAgent(restConfig, "cainjector")
	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme))
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	utilruntime.Must(apiext.AddToScheme(scheme))
	utilruntime.Must(apireg.AddToScheme(scheme))
	var namespaces map[string]cache.Config
	if namespace != "" {
		namespaces = map[string]cache.Config{namespace: {}}
	}
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:  scheme,
		Cache:   cache.Options{ReaderFailOnMissingInformer: true, DefaultNamespaces: namespaces},
		Client:  client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}},
		Metrics: metricsserver.Options{BindAddress: "0"},
	})
	if err != nil {
		return fmt.Errorf("manager: %w", err)
	}
	err = cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		Namespace:                    namespace,
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   true,
			cainjector.ValidatingWebhookConfigurationName: true,
		},
	})
	if err != nil {
		return fmt.Errorf("injectors: %w", err)
	}
	return mgr.Start(ctx)
}
