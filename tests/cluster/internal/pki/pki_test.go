package pki

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
)

func TestEnsureIssuesAChainAndKeepsIt(t *testing.T) {
	dir := t.TempDir()
	f, err := Ensure(dir)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(f.CACert)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("CA does not parse")
	}
	for _, c := range []struct {
		cert, key string
		usage     x509.ExtKeyUsage
		dns       string
	}{
		{f.ServingCert, f.ServingKey, x509.ExtKeyUsageServerAuth, "localhost"},
		{f.AdminCert, f.AdminKey, x509.ExtKeyUsageClientAuth, ""},
		{f.FrontProxyCert, f.FrontProxyKey, x509.ExtKeyUsageClientAuth, ""},
		{f.MetricsServerCert, f.MetricsServerKey, x509.ExtKeyUsageServerAuth, MetricsServerDNS},
		{f.MetricsServerCert, f.MetricsServerKey, x509.ExtKeyUsageServerAuth, "127.0.0.1"},
	} {
		pair, err := tls.LoadX509KeyPair(c.cert, c.key)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: c.dns, KeyUsages: []x509.ExtKeyUsage{c.usage}}); err != nil {
			t.Errorf("%s does not verify: %v", c.cert, err)
		}
	}
	before, _ := os.ReadFile(f.AdminCert)
	if _, err := Ensure(dir); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(f.AdminCert)
	if string(before) != string(after) {
		t.Error("a second Ensure replaced existing certificates")
	}
	if err := WriteKubeconfig(dir+"/kubeconfig", "https://127.0.0.1:1", f); err != nil {
		t.Fatal(err)
	}
}

// A PKI made before the front-proxy and metrics-server certificates existed gets them from its
// own CA; the existing files stay. IssueServing signs with the same CA.
func TestEnsureAddsMissingCertificatesWithTheExistingCA(t *testing.T) {
	dir := t.TempDir()
	f, err := Ensure(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{f.FrontProxyCert, f.FrontProxyKey, f.MetricsServerCert, f.MetricsServerKey} {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	ca, _ := os.ReadFile(f.CACert)
	if _, err := Ensure(dir); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(f.CACert); string(after) != string(ca) {
		t.Fatal("the CA changed")
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	verify := func(what string, der []byte, name string, usage x509.ExtKeyUsage) {
		t.Helper()
		leaf, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	pair, err := tls.LoadX509KeyPair(f.FrontProxyCert, f.FrontProxyKey)
	if err != nil {
		t.Fatal(err)
	}
	verify("front proxy", pair.Certificate[0], "", x509.ExtKeyUsageClientAuth)
	kubelet, err := IssueServing(f, "node-0", "node-0")
	if err != nil {
		t.Fatal(err)
	}
	verify("kubelet", kubelet.Certificate[0], "127.0.0.1", x509.ExtKeyUsageServerAuth)
	verify("kubelet", kubelet.Certificate[0], "node-0", x509.ExtKeyUsageServerAuth)
}
