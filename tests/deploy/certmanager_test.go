package deploytest

import (
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The objects components/cert-manager (and Helm certSource=cert-manager) add to the base.
var certManagerObjects = []string{
	"Issuer/kube-overcommit/kube-overcommit-selfsigned",
	"Certificate/kube-overcommit/kube-overcommit-ca",
	"Issuer/kube-overcommit/kube-overcommit-ca",
	"Certificate/kube-overcommit/kube-overcommit",
	"ValidatingAdmissionPolicy//kube-overcommit-cabundle-guard",
	"ValidatingAdmissionPolicyBinding//kube-overcommit-cabundle-guard",
}

func renderCertManager(t *testing.T) (kz, helm, base []*unstructured.Unstructured) {
	t.Helper()
	r := render(t)
	b, err := Kustomize(r.root, "tests/deploy/testdata/cert-manager")
	if err != nil {
		t.Fatal(err)
	}
	kz, err = Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	bin, err := HelmBinary(r.root)
	if err != nil {
		t.Fatal(err)
	}
	b, err = HelmTemplate(r.root, bin, ns, "--set", "certSource=cert-manager")
	if err != nil {
		t.Fatal(err)
	}
	helm, err = Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return kz, helm, r.kustomize
}

// components/cert-manager adds exactly the PKI and the caBundle guard; Helm's certSource adds the
// same objects with the same specs.
func TestStaticCertManagerObjects(t *testing.T) {
	kz, helm, base := renderCertManager(t)
	want := sorted(append(keys(base), certManagerObjects...))
	if got := keys(kz); !reflect.DeepEqual(got, want) {
		t.Errorf("deploy/ + components/cert-manager renders\n  %v\nwant\n  %v", got, want)
	}
	for _, key := range certManagerObjects {
		parts := strings.SplitN(key, "/", 3)
		k, h := mustFind(t, kz, parts[0], parts[2]), mustFind(t, helm, parts[0], parts[2])
		if !reflect.DeepEqual(k.Object["spec"], h.Object["spec"]) {
			t.Errorf("%s: spec differs (kustomize vs helm): %s", key, firstDifference(k.Object["spec"], h.Object["spec"]))
		}
	}
}

// The serving Certificate issues the Secret the Deployment mounts, for the names the API server
// dials (src/leader/ca.rs service_dns_names), from the CA Issuer, whose Secret is the one
// --cert-manager-ca-secret names in cert-manager.io/inject-ca-from-secret, which the caBundle guard
// pins.
func TestStaticCertManagerServingCertificate(t *testing.T) {
	kz, helm, _ := renderCertManager(t)
	for name, objs := range map[string][]*unstructured.Unstructured{"kustomize": kz, "helm": helm} {
		cert := mustFind(t, objs, "Certificate", "kube-overcommit")
		d := convert[appsv1.Deployment](t, mustFind(t, objs, "Deployment", "kube-overcommit"))
		var mounted []string
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Secret != nil {
				mounted = append(mounted, v.Secret.SecretName)
			}
		}
		secret, _, _ := unstructured.NestedString(cert.Object, "spec", "secretName")
		if !slices.Contains(mounted, secret) {
			t.Errorf("%s: the Certificate's Secret %q is not among the mounted %v", name, secret, mounted)
		}
		dns, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "dnsNames")
		sort.Strings(dns)
		wantDNS := sorted([]string{"kube-overcommit.kube-overcommit.svc", "kube-overcommit.kube-overcommit.svc.cluster.local",
			"kube-overcommit.kube-overcommit", "kube-overcommit"})
		if !reflect.DeepEqual(dns, wantDNS) {
			t.Errorf("%s: dnsNames %v, want %v", name, dns, wantDNS)
		}
		issuer, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "name")
		ca := mustFind(t, objs, "Issuer", issuer)
		caSecret, _, _ := unstructured.NestedString(ca.Object, "spec", "ca", "secretName")
		caCert := mustFind(t, objs, "Certificate", "kube-overcommit-ca")
		if s, _, _ := unstructured.NestedString(caCert.Object, "spec", "secretName"); s != caSecret || slices.Contains(mounted, s) {
			t.Errorf("%s: CA Issuer secret %q, CA Certificate secret %q (must match and never be mounted: %v)", name, caSecret, s, mounted)
		}
		// cainjector reads ca.crt of the CA's own Secret (a re-keyed CA is trusted before any leaf
		// from it): the Secret must allow it, and the guard pins exactly that source.
		direct, _, _ := unstructured.NestedString(caCert.Object, "spec", "secretTemplate", "annotations", "cert-manager.io/allow-direct-injection")
		if direct != "true" {
			t.Errorf("%s: the CA Certificate's Secret does not allow direct injection (%q)", name, direct)
		}
		guard := mustFind(t, objs, "ValidatingAdmissionPolicy", "kube-overcommit-cabundle-guard")
		if b, _ := guard.MarshalJSON(); !strings.Contains(string(b), "== 'kube-overcommit/"+caSecret+"'") {
			t.Errorf("%s: the caBundle guard does not pin inject-ca-from-secret to kube-overcommit/%s", name, caSecret)
		}
	}
}

// With cert-manager the container gets --cert-source=cert-manager and --cert-manager-ca-secret
// (the CA's Secret) and the ServiceAccount no grant
// on Secrets at all; without it neither changes.
func TestStaticCertManagerFlagAndRBAC(t *testing.T) {
	kz, helm, base := renderCertManager(t)
	r := render(t)
	for name, c := range map[string]struct {
		objs []*unstructured.Unstructured
		on   bool
	}{"kustomize": {base, false}, "helm": {r.helm, false}, "production": {r.production, false},
		"cert-manager": {kz, true}, "helm-cert-manager": {helm, true}} {
		d := convert[appsv1.Deployment](t, mustFind(t, c.objs, "Deployment", "kube-overcommit"))
		args := d.Spec.Template.Spec.Containers[0].Args
		var sources []string
		for _, a := range args {
			if strings.HasPrefix(a, "--cert-source") || strings.HasPrefix(a, "--cert-manager") {
				sources = append(sources, a)
			}
		}
		var want []string
		if c.on {
			want = []string{"--cert-source=cert-manager", "--cert-manager-ca-secret=kube-overcommit-cert-manager-ca"}
		}
		if !slices.Equal(sources, want) {
			t.Errorf("%s: %v in the args, want %v", name, sources, want)
		}
		role := convert[rbacv1.Role](t, mustFind(t, c.objs, "Role", "kube-overcommit"))
		secrets := false
		for _, rule := range role.Rules {
			secrets = secrets || slices.Contains(rule.Resources, "secrets")
		}
		if secrets == c.on {
			t.Errorf("%s: Role grants on secrets %v, want %v: %+v", name, secrets, !c.on, role.Rules)
		}
	}
}
