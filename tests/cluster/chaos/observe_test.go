package main

import "testing"

func TestX509Matchers(t *testing.T) {
	api := []struct {
		line string
		want bool
	}{
		{`W1121 22:01:02.123456   17608 dispatcher.go:210] Failed calling webhook, failing open nodes.overcommit.dev: failed calling webhook "nodes.overcommit.dev": failed to call webhook: Post "https://kube-overcommit.kube-overcommit.svc:443/mutate?timeout=2s": tls: failed to verify certificate: x509: certificate signed by unknown authority`, true},
		{`W1121 22:01:02.123456   17608 dispatcher.go:210] Failed calling webhook, failing open nodes.overcommit.dev: failed calling webhook "nodes.overcommit.dev": failed to call webhook: Post "https://kube-overcommit.kube-overcommit.svc:443/mutate?timeout=2s": dial tcp 127.0.0.1:4000: connect: connection refused`, false},
		{`I1121 22:01:02.123456   17608 controller.go:1] loaded client CA x509 bundle`, false},
	}
	for _, c := range api {
		if got := x509InAPIServerLog(c.line); got != c.want {
			t.Errorf("x509InAPIServerLog(%q) = %v, want %v", c.line, got, c.want)
		}
	}
	replica := []struct {
		line string
		want bool
	}{
		{`2026-11-21T21:45:41Z DEBUG kube_overcommit::server: TLS handshake failed peer=127.0.0.1:5000 error=received fatal alert: BadCertificate`, true},
		{`2026-11-21T21:45:41Z DEBUG kube_overcommit::server: TLS handshake failed peer=127.0.0.1:5000 error=unexpected end of file`, false},
		{`2026-11-21T21:45:41Z INFO kube_overcommit::server::certs: serving certificate loaded`, false},
	}
	for _, c := range replica {
		if got := x509InReplicaLog(c.line); got != c.want {
			t.Errorf("x509InReplicaLog(%q) = %v, want %v", c.line, got, c.want)
		}
	}
}

func TestParseWebhookMetrics(t *testing.T) {
	text := `# HELP apiserver_admission_webhook_fail_open_count [ALPHA] Admission webhook fail open count
# TYPE apiserver_admission_webhook_fail_open_count counter
apiserver_admission_webhook_fail_open_count{name="nodes.overcommit.dev",type="admit"} 3
apiserver_admission_webhook_fail_open_count{name="pods.overcommit.dev",type="admit"} 2
apiserver_admission_webhook_fail_open_count{name="other.example.com",type="admit"} 7
apiserver_admission_webhook_fail_open_count{name="bindings.cap.overcommit.dev",type="validating"} 4
apiserver_admission_webhook_rejection_count{error_type="calling_webhook_error",name="nodes.overcommit.dev",operation="UPDATE",rejection_code="0",type="admit"} 1
apiserver_admission_webhook_request_total{code="200",name="nodes.overcommit.dev",operation="UPDATE",rejected="false",type="admit"} 100
`
	m := parseWebhookMetrics(text, webhookNameSuffix)
	if m.failOpen != 5 || m.rejected != 1 || m.capFailOpen != 4 {
		t.Fatalf("got %+v, want failOpen 5, rejected 1, capFailOpen 4", m)
	}
}

func TestPhaseCheck(t *testing.T) {
	ok := &Phase{Name: "sigterm", AllMutated: true, Writes: 10, Mutated: 10}
	if b := ok.check(); len(b) != 0 {
		t.Fatalf("unexpected: %v", b)
	}
	for _, p := range []*Phase{
		{Name: "sigterm", AllMutated: true, Writes: 10, Mutated: 9, NotMutated: 1},
		{Name: "sigterm", AllMutated: true, Writes: 10, Mutated: 10, FailOpen: 1},
		{Name: "sigkill", Writes: 10, Failed: 1},
		{Name: "sigkill", PodsFailed: 1},
		{Name: "apiserver", APIDown: true, WebhookErrs: 1},
		{Name: "baseline", AllMutated: true},
	} {
		if b := p.check(); len(b) == 0 {
			t.Errorf("%+v: no broken invariant reported", p)
		}
	}
	down := &Phase{Name: "apiserver", APIDown: true, Failed: 3, PodsFailed: 4}
	if b := down.check(); len(b) != 0 {
		t.Fatalf("failures while the API server is down are allowed: %v", b)
	}
}
