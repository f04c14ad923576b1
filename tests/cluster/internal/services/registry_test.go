package services

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestParseLine(t *testing.T) {
	cases := []struct {
		line    string
		want    Backend
		wantErr bool
	}{
		{line: "127.0.0.1:8443", want: Backend{Addr: "127.0.0.1:8443"}},
		{line: "127.0.0.1:8443 port=443 ready=http://127.0.0.1:8080/readyz", want: Backend{Addr: "127.0.0.1:8443", Port: 443, ReadyURL: "http://127.0.0.1:8080/readyz"}},
		{line: "127.0.0.1", wantErr: true},
		{line: "127.0.0.1:1 port=x", wantErr: true},
		{line: "127.0.0.1:1 port=70000", wantErr: true},
		{line: "127.0.0.1:1 ready=ftp://x", wantErr: true},
		{line: "127.0.0.1:1 colour=blue", wantErr: true},
		{line: "127.0.0.1:1 port", wantErr: true},
	}
	for _, c := range cases {
		got, err := ParseLine(c.line)
		if (err != nil) != c.wantErr {
			t.Errorf("%q: err %v, wantErr %v", c.line, err, c.wantErr)
			continue
		}
		if err == nil && got != c.want {
			t.Errorf("%q: got %+v want %+v", c.line, got, c.want)
		}
		if err == nil {
			if again, err := ParseLine(got.line()); err != nil || again != got {
				t.Errorf("%q: line() does not round-trip: %q", c.line, got.line())
			}
		}
	}
}

func TestAddRemoveList(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(Add(dir, "ns", "svc", Backend{Addr: "127.0.0.1:1", Port: 443}))
	must(Add(dir, "ns", "svc", Backend{Addr: "127.0.0.1:2"}))
	must(Add(dir, "ns", "svc", Backend{Addr: "127.0.0.1:1", Port: 443, ReadyURL: "http://127.0.0.1:9/r"}))
	bs, err := List(dir, "ns", "svc")
	must(err)
	if len(bs) != 2 || bs[1].ReadyURL != "http://127.0.0.1:9/r" {
		t.Fatalf("re-adding replaces the line: %+v", bs)
	}
	must(Remove(dir, "ns", "svc", "127.0.0.1:1", 0))
	bs, err = List(dir, "ns", "svc")
	must(err)
	if len(bs) != 1 || bs[0].Addr != "127.0.0.1:2" {
		t.Fatalf("after remove: %+v", bs)
	}
	if err := Add(dir, "../x", "svc", Backend{Addr: "127.0.0.1:1"}); err == nil {
		t.Fatal("path traversal in namespace accepted")
	}
}

func TestResolverRoundRobinOverReadyBackends(t *testing.T) {
	dir := t.TempDir()
	ready := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer ready.Close()
	unready := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) }))
	defer unready.Close()
	for _, b := range []Backend{
		{Addr: "127.0.0.1:1", ReadyURL: ready.URL},
		{Addr: "127.0.0.1:2", ReadyURL: unready.URL},
		{Addr: "127.0.0.1:3"},
		{Addr: "127.0.0.1:4", Port: 8443},
	} {
		if err := Add(dir, "ns", "svc", b); err != nil {
			t.Fatal(err)
		}
	}
	r := NewResolver(dir, time.Hour)
	r.refresh(context.Background())
	seen := map[string]int{}
	for i := 0; i < 10; i++ {
		u, err := r.ResolveEndpoint("ns", "svc", 443)
		if err != nil {
			t.Fatal(err)
		}
		seen[u.Host]++
	}
	if len(seen) != 2 || seen["127.0.0.1:1"] != 5 || seen["127.0.0.1:3"] != 5 {
		t.Fatalf("want round robin over the two ready backends of port 443, got %v", seen)
	}
	if _, err := r.ResolveEndpoint("ns", "other", 443); err == nil {
		t.Fatal("unknown service resolved")
	}
	st, err := ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(st["ns/svc"]) != 4 {
		t.Fatalf("published state: %+v", st)
	}
}
