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
