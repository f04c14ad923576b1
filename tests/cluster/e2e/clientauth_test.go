package e2e

// Client certificates from the API server to the webhook (issue 19, item 7): the API server's
// AdmissionConfiguration names a kubeconfig whose user for the webhook's service host carries a
// client certificate; replicas started with --client-ca-file require it. TestOvercommit runs its
// whole scenario this way (its reviews are answered: allocatable inflated), and checks with
// checkRefused that a client without a certificate, or with one from another CA, is refused in
// the TLS handshake.

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// webhookClientAuth is a client CA, the API server's client certificate signed by it, and the
// files that configure both sides.
type webhookClientAuth struct {
	// CAFile is the replicas' --client-ca-file.
	CAFile string
	// APIServerArgs point the API server at the AdmissionConfiguration.
	APIServerArgs []string
	// Good is the API server's client certificate; Foreign one from another CA.
	Good, Foreign tls.Certificate
}

// newWebhookClientAuth writes, under a temporary directory: the client CA, a kubeconfig whose
// user for serviceHost (`<service>.<namespace>.svc`, the name the API server looks up for a
// Service on port 443) holds the client certificate, and the AdmissionConfiguration that makes
// both webhook admission plugins use that kubeconfig.
func newWebhookClientAuth(t *testing.T, serviceHost string) *webhookClientAuth {
	t.Helper()
	dir := t.TempDir()
	caPEM, good := clientCertFromNewCA(t, "kube-apiserver-webhook-client")
	_, foreign := clientCertFromNewCA(t, "someone-else")
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: good.Certificate[0]})
	keyDER, err := x509.MarshalECPrivateKey(good.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	files := map[string][]byte{
		"client-ca.crt": caPEM,
		"client.crt":    certPEM,
		"client.key":    keyPEM,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
users:
- name: %q
  user:
    client-certificate: %q
    client-key: %q
`, serviceHost, filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key"))
	admission := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]q
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: %[1]q
`, filepath.Join(dir, "webhook-kubeconfig.yaml"))
	for name, data := range map[string]string{"webhook-kubeconfig.yaml": kubeconfig, "admission.yaml": admission} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return &webhookClientAuth{
		CAFile:        filepath.Join(dir, "client-ca.crt"),
		APIServerArgs: []string{"--admission-control-config-file=" + filepath.Join(dir, "admission.yaml")},
		Good:          good,
		Foreign:       foreign,
	}
}

// clientCertFromNewCA makes a CA and a client certificate (clientAuth) signed by it.
func clientCertFromNewCA(t *testing.T, cn string) (caPEM []byte, cert tls.Certificate) {
	t.Helper()
	return caAndLeaf(t, cn+"-ca", &x509.Certificate{
		Subject: pkix.Name{CommonName: cn}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// exchange does a TLS handshake with addr presenting certs, then one HTTP/1.1 request; it
// returns the status line or the error (with TLS 1.3 the server's verdict on the client
// certificate arrives as an alert on the first read after the client's handshake).
func exchange(addr string, certs []tls.Certificate) (string, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	// The server's identity is not what is tested here.
	tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, Certificates: certs, NextProtos: []string{"http/1.1"}})
	if err := tc.Handshake(); err != nil {
		return "", err
	}
	if _, err := io.WriteString(tc, "GET /mutate HTTP/1.1\r\nHost: localhost\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	return resp.Status, nil
}

// checkRefused: with the API server's certificate the replica answers (405: only POST); without
// a certificate, or with one from another CA, the TLS handshake fails.
func (a *webhookClientAuth) checkRefused(addr string) error {
	if status, err := exchange(addr, []tls.Certificate{a.Good}); err != nil || !strings.HasPrefix(status, "405") {
		return fmt.Errorf("with the API server's client certificate: status %q, error %v", status, err)
	}
	for name, certs := range map[string][]tls.Certificate{"no certificate": nil, "another CA's certificate": {a.Foreign}} {
		status, err := exchange(addr, certs)
		if err == nil {
			return fmt.Errorf("%s: served (%s), want a refused handshake", name, status)
		}
		if !strings.Contains(err.Error(), "certificate") {
			return fmt.Errorf("%s: failed, but not for its certificate: %v", name, err)
		}
	}
	return nil
}
