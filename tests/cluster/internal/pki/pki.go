// Package pki creates the certificates of a local control plane: one CA, the API server's
// serving certificate for 127.0.0.1/localhost, an admin client certificate (system:masters),
// the aggregator's front-proxy client certificate, metrics-server's serving certificate, the
// service-account signing key pair, and the admin kubeconfig. IssueServing signs more serving
// certificates (the fake kubelets') with the same CA.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Files are the paths of everything Ensure writes, relative to nothing: absolute paths under dir.
type Files struct {
	CACert, CAKey           string
	ServingCert, ServingKey string
	AdminCert, AdminKey     string
	SAKey, SAPub            string
	// FrontProxyCert/Key: the aggregator's client certificate (--proxy-client-cert-file), CN
	// FrontProxyCN, trusted through --requestheader-client-ca-file (the same CA).
	FrontProxyCert, FrontProxyKey string
	// MetricsServerCert/Key: metrics-server's serving certificate for MetricsServerDNS and
	// 127.0.0.1 (the aggregator verifies it with the APIService's caBundle = CACert).
	MetricsServerCert, MetricsServerKey string
}

// FrontProxyCN is the front-proxy client certificate's name (--requestheader-allowed-names).
const FrontProxyCN = "kcp-front-proxy"

// MetricsServerDNS is the name the aggregator expects on metrics-server's certificate: the
// TLS ServerName of Service kube-system/metrics-server.
const MetricsServerDNS = "metrics-server.kube-system.svc"

// FilesIn names the files under dir.
func FilesIn(dir string) Files {
	p := func(n string) string { return filepath.Join(dir, n) }
	return Files{
		CACert: p("ca.crt"), CAKey: p("ca.key"),
		ServingCert: p("apiserver.crt"), ServingKey: p("apiserver.key"),
		AdminCert: p("admin.crt"), AdminKey: p("admin.key"),
		SAKey: p("sa.key"), SAPub: p("sa.pub"),
		FrontProxyCert: p("front-proxy-client.crt"), FrontProxyKey: p("front-proxy-client.key"),
		MetricsServerCert: p("metrics-server.crt"), MetricsServerKey: p("metrics-server.key"),
	}
}

// Ensure creates the files under dir unless the CA already exists (a restart keeps the PKI,
// so existing kubeconfigs and tokens stay valid); certificates added since (front proxy,
// metrics-server) are issued by the existing CA when missing.
func Ensure(dir string) (Files, error) {
	f := FilesIn(dir)
	if _, err := os.Stat(f.AdminKey); err == nil {
		return f, ensureExtra(f)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return f, err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return f, err
	}
	now := time.Now().Add(-time.Hour)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kcp-local-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return f, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return f, err
	}
	if err := writeCertKey(f.CACert, f.CAKey, caDER, caKey); err != nil {
		return f, err
	}
	issue := func(serial int64, tmpl *x509.Certificate, certPath, keyPath string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore = now
		tmpl.NotAfter = now.Add(10 * 365 * 24 * time.Hour)
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		return writeCertKey(certPath, keyPath, der, key)
	}
	if err := issue(2, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kube-apiserver"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("10.0.0.1")},
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"},
	}, f.ServingCert, f.ServingKey); err != nil {
		return f, err
	}
	if err := issue(3, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "kcp-admin", Organization: []string{"system:masters"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, f.AdminCert, f.AdminKey); err != nil {
		return f, err
	}
	if err := ensureExtra(f); err != nil {
		return f, err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return f, err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return f, err
	}
	if err := os.WriteFile(f.SAKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}), 0o600); err != nil {
		return f, err
	}
	if err := os.WriteFile(f.SAPub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}), 0o644); err != nil {
		return f, err
	}
	return f, nil
}

// ensureExtra issues the front-proxy client and metrics-server serving certificates if missing.
func ensureExtra(f Files) error {
	ca, err := loadCA(f)
	if err != nil {
		return err
	}
	if _, err := os.Stat(f.FrontProxyKey); err != nil {
		der, key, err := ca.sign(&x509.Certificate{
			Subject:     pkix.Name{CommonName: FrontProxyCN},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		})
		if err != nil {
			return err
		}
		if err := writeCertKey(f.FrontProxyCert, f.FrontProxyKey, der, key); err != nil {
			return err
		}
	}
	if _, err := os.Stat(f.MetricsServerKey); err != nil {
		der, key, err := ca.sign(servingTemplate("metrics-server", MetricsServerDNS))
		if err != nil {
			return err
		}
		if err := writeCertKey(f.MetricsServerCert, f.MetricsServerKey, der, key); err != nil {
			return err
		}
	}
	return nil
}

type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func loadCA(f Files) (*authority, error) {
	pair, err := tls.LoadX509KeyPair(f.CACert, f.CAKey)
	if err != nil {
		return nil, fmt.Errorf("load CA: %w", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("parse CA: %w", err)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key %s cannot sign", f.CAKey)
	}
	return &authority{cert: cert, key: key}, nil
}

func (a *authority) sign(tmpl *x509.Certificate) ([]byte, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now().Add(-time.Hour)
	tmpl.SerialNumber = serial.Add(serial, big.NewInt(100))
	tmpl.NotBefore = now
	tmpl.NotAfter = now.Add(10 * 365 * 24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	return der, key, err
}

func servingTemplate(cn string, dns ...string) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		DNSNames:    dns,
	}
}

// IssueServing signs, with the CA of f, an in-memory serving certificate for 127.0.0.1 and
// dns (a fake kubelet's: clients verify it with CACert).
func IssueServing(f Files, cn string, dns ...string) (tls.Certificate, error) {
	ca, err := loadCA(f)
	if err != nil {
		return tls.Certificate{}, err
	}
	der, key, err := ca.sign(servingTemplate(cn, dns...))
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

func writeCertKey(certPath, keyPath string, der []byte, key crypto.Signer) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

// WriteKubeconfig writes an admin kubeconfig for server with the certificates embedded, via a
// temporary file and rename so that readers never see half a file.
func WriteKubeconfig(path, server string, f Files) error {
	ca, err := os.ReadFile(f.CACert)
	if err != nil {
		return err
	}
	cert, err := os.ReadFile(f.AdminCert)
	if err != nil {
		return err
	}
	key, err := os.ReadFile(f.AdminKey)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kcp"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["kcp-admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["kcp"] = &clientcmdapi.Context{Cluster: "kcp", AuthInfo: "kcp-admin", Namespace: "default"}
	cfg.CurrentContext = "kcp"
	tmp := path + ".tmp"
	if err := clientcmd.WriteToFile(*cfg, tmp); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return os.Rename(tmp, path)
}
