// Package components runs the Kubernetes components inside the kcp binary: embedded etcd and
// the upstream commands of kube-apiserver (with the file-registry service resolver),
// kube-scheduler, kube-controller-manager and kubectl.
package components

import (
	"context"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserverapp "k8s.io/kubernetes/cmd/kube-apiserver/app"
	cmapp "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	schedulerapp "k8s.io/kubernetes/cmd/kube-scheduler/app"
	metricsserverapp "sigs.k8s.io/metrics-server/cmd/metrics-server/app"

	"kube-overcommit/tests/cluster/internal/runfiles"
	"kube-overcommit/tests/cluster/internal/services"
)

// StripRunDir removes the kcp-only --run-dir flag from a component's arguments.
func StripRunDir(args []string) (rest []string, runDir string) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--run-dir="); ok {
			runDir = v
			continue
		}
		rest = append(rest, a)
	}
	return rest, runDir
}

// Etcd runs an embedded single-member etcd on 127.0.0.1 until SIGTERM.
func Etcd(dataDir string, clientPort, peerPort int) error {
	cfg := embed.NewConfig()
	cfg.Name = "kcp"
	cfg.Dir = dataDir
	cu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", clientPort))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", peerPort))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	// Test data on a shared 2-core machine: fsync costs latency and protects nothing we need.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		log.Printf("etcd ready on %s", cu)
	case <-time.After(60 * time.Second):
		return fmt.Errorf("etcd not ready after 60s")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	select {
	case <-ctx.Done():
		return nil
	case err := <-e.Err():
		return err
	}
}

// APIServer runs kube-apiserver; webhook Services resolve through the run directory's registry.
func APIServer(args []string) int {
	rest, runDir := StripRunDir(args)
	run, err := runfiles.Resolve(runDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	resolver := services.NewResolver(run.Services(), 400*time.Millisecond)
	started := make(chan struct{})
	go resolver.Run(context.Background(), started)
	<-started
	// Must be set before the API server builds its admission chain.
	apiserverapp.SetServiceResolverForTests(resolver)
	cmd := apiserverapp.NewAPIServerCommand()
	cmd.SetArgs(rest)
	return cli.Run(cmd)
}

// Scheduler runs kube-scheduler.
func Scheduler(args []string) int {
	rest, _ := StripRunDir(args)
	cmd := schedulerapp.NewSchedulerCommand()
	cmd.SetArgs(rest)
	return cli.Run(cmd)
}

// ControllerManager runs kube-controller-manager.
func ControllerManager(args []string) int {
	rest, _ := StripRunDir(args)
	cmd := cmapp.NewControllerManagerCommand()
	cmd.SetArgs(rest)
	return cli.Run(cmd)
}

// MetricsServer runs metrics-server (sigs.k8s.io/metrics-server's own command) until SIGTERM.
func MetricsServer(args []string) int {
	rest, _ := StripRunDir(args)
	cmd := metricsserverapp.NewMetricsServerCommand(genericapiserver.SetupSignalHandler())
	cmd.SetArgs(rest)
	return cli.Run(cmd)
}

// Kubectl runs kubectl with args; KUBECONFIG defaults to the run directory's kubeconfig.
func Kubectl(args []string) int {
	if os.Getenv("KUBECONFIG") == "" {
		if run, err := runfiles.Resolve(""); err == nil {
			os.Setenv("KUBECONFIG", run.Kubeconfig())
		}
	}
	os.Args = append([]string{"kubectl"}, args...)
	_, _ = logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args))
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}
