package e2e

// A CA change under --cert-source=cert-manager (issue 38), as deploy/README.md describes it: the
// CA Certificate renewed (a new key), then the serving Certificate renewed from the new CA.

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"kube-overcommit/tests/cluster/harness"
)

// caChange re-keys the CA while fake kubelets write status every second. cainjector reads the
// CA's own Secret and merges (cert-manager >= 1.21, CAInjectorMerging): both caBundles hold the
// old and the new CA before any leaf comes from the new one, and every replica keeps serving the
// old leaf, trusted and ready. The serving Certificate is then renewed from the new CA. The old
// CA stays in the caBundles (cainjector drops a CA only once it has expired). Over the whole
// change: no failed write, no failed webhook call, no x509 error, every stored status mutated.
func caChange(t *testing.T, ctx context.Context, certs dynamic.ResourceInterface, rs *replicaSet, nodes *harness.FakeNodes, m *mutationWatch) {
	t.Helper()
	w := startWindow(t, ctx, nodes)
	oldCA := caCertificate(t, ctx, rs.ns, nil)
	triggerIssuing(t, ctx, certs, "kube-overcommit-ca")
	newCA := caCertificate(t, ctx, rs.ns, oldCA)
	both := append(append([]byte{}, oldCA...), newCA...)
	err := harness.Eventually(time.Minute, 250*time.Millisecond, func() error {
		return bundleInjected(ctx, rs.ns, cmInjectAnnotation, rs.ns+"/"+cmCASecret, both)
	})
	if err != nil {
		t.Fatalf("the new CA is not trusted beside the old one: %v", err)
	}
	if err := rs.in.WaitReady(3, 30*time.Second); err != nil {
		t.Fatalf("replicas serving the old CA's leaf with both CAs trusted: %v", err)
	}
	writesGoOn(t, nodes)

	leaf := forceRenewal(t, ctx, certs, rs)
	serving := secretCert(t, ctx, rs.ns, koServingName)
	if err := chainsTo(serving, newCA); err != nil {
		t.Fatalf("the leaf %.12s after the CA change: %v", leaf, err)
	}
	if err := rs.in.WaitReady(3, 30*time.Second); err != nil {
		t.Fatalf("replicas serving the new CA's leaf: %v", err)
	}
	writesGoOn(t, nodes)
	w.seamless(fmt.Sprintf("CA change (leaf %.12s from the new CA)", leaf), m)
	if err := bundleInjected(ctx, rs.ns, cmInjectAnnotation, rs.ns+"/"+cmCASecret, both); err != nil {
		t.Fatalf("after the CA change: %v", err)
	}
}

// caCertificate waits until the CA's Secret holds a certificate other than old and returns it
// (PEM).
func caCertificate(t *testing.T, ctx context.Context, ns string, old []byte) []byte {
	t.Helper()
	var cert []byte
	err := harness.Eventually(2*time.Minute, 250*time.Millisecond, func() error {
		cert = secretCert(t, ctx, ns, cmCASecret)
		if cert == nil || bytes.Equal(cert, old) {
			return errors.New("no new CA certificate in the CA's Secret yet")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// secretCert: tls.crt of the Secret (nil while it has none).
func secretCert(t *testing.T, ctx context.Context, ns, name string) []byte {
	t.Helper()
	s, err := shared.Client.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || len(pemCerts(s.Data["tls.crt"])) == 0 {
		return nil
	}
	return s.Data["tls.crt"]
}

// chainsTo: the first certificate of leafPEM is signed by the CA in caPEM.
func chainsTo(leafPEM, caPEM []byte) error {
	leaf, cas := pemCerts(leafPEM), pemCerts(caPEM)
	if len(leaf) == 0 || len(cas) == 0 {
		return errors.New("no certificate")
	}
	pool := x509.NewCertPool()
	pool.AddCert(cas[0])
	_, err := leaf[0].Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}
