package e2e

import (
	"errors"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// kubeletClient is a client acting as the kubelet of node `name` (system:node:NAME), as the
// Node authorizer and NodeRestriction see it.
func kubeletClient(t *testing.T, admin *rest.Config, name string) kubernetes.Interface {
	t.Helper()
	config := rest.CopyConfig(admin)
	config.Impersonate = rest.ImpersonationConfig{UserName: "system:node:" + name, Groups: []string{"system:nodes", "system:authenticated"}}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		t.Fatal(err)
	}
	return client
}
