package services

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Resolver implements k8s.io/apiserver/pkg/util/webhook.ServiceResolver over the file registry.
// The API server calls ResolveEndpoint on every new connection to a webhook Service, so each dial
// gets one ready backend, round robin, like kube-proxy picking an endpoint per connection.
type Resolver struct {
	dir      string
	interval time.Duration
	client   *http.Client

	mu       sync.RWMutex
	services map[string][]Backend // "ns/name" -> registered backends
	ready    map[string]bool      // ready URL -> last probe result
	rr       sync.Map             // "ns/name" -> *atomic.Uint64

	lastPublished []byte // only touched by the refresh loop
}

// NewResolver reads dir every interval and probes every ready URL with that period.
func NewResolver(dir string, interval time.Duration) *Resolver {
	return &Resolver{
		dir:      dir,
		interval: interval,
		client:   &http.Client{Timeout: interval},
		services: map[string][]Backend{},
		ready:    map[string]bool{},
	}
}

// Run refreshes until ctx ends. The first refresh completes before Run returns control to
// the caller's goroutine via the started channel, if given.
func (r *Resolver) Run(ctx context.Context, started chan<- struct{}) {
	r.refresh(ctx)
	if started != nil {
		close(started)
	}
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.refresh(ctx)
		}
	}
}

func (r *Resolver) refresh(ctx context.Context) {
	services := map[string][]Backend{}
	nsDirs, _ := os.ReadDir(r.dir)
	for _, ns := range nsDirs {
		if !ns.IsDir() {
			continue
		}
		files, _ := os.ReadDir(filepath.Join(r.dir, ns.Name()))
		for _, f := range files {
			if f.IsDir() || strings.Contains(f.Name(), ".tmp.") {
				continue
			}
			bs, err := List(r.dir, ns.Name(), f.Name())
			if err != nil {
				log.Printf("service registry %s/%s: %v", ns.Name(), f.Name(), err)
			}
			services[ns.Name()+"/"+f.Name()] = bs
		}
	}
	urls := map[string]bool{}
	for _, bs := range services {
		for _, b := range bs {
			if b.ReadyURL != "" {
				urls[b.ReadyURL] = true
			}
		}
	}
	results := make(map[string]bool, len(urls))
	var wg sync.WaitGroup
	var rmu sync.Mutex
	for u := range urls {
		wg.Add(1)
		go func(u string) {
			defer wg.Done()
			ok := r.probe(ctx, u)
			rmu.Lock()
			results[u] = ok
			rmu.Unlock()
		}(u)
	}
	wg.Wait()
	r.mu.Lock()
	for u, ok := range results {
		if prev, seen := r.ready[u]; !seen || prev != ok {
			log.Printf("service resolver: backend ready URL %s ready=%v", u, ok)
		}
	}
	r.services = services
	r.ready = results
	r.mu.Unlock()
	r.publish()
}

// StateFile is where the resolver publishes what it sees, for tests and scripts that must wait
// until the API server's view of a Service has caught up.
func StateFile(dir string) string { return filepath.Join(dir, ".resolver.json") }

// BackendState is one backend as the resolver last saw it.
type BackendState struct {
	Addr  string `json:"addr"`
	Port  int32  `json:"port,omitempty"`
	Ready bool   `json:"ready"`
}

func (r *Resolver) publish() {
	r.mu.RLock()
	state := map[string][]BackendState{}
	for svc, bs := range r.services {
		for _, b := range bs {
			state[svc] = append(state[svc], BackendState{Addr: b.Addr, Port: b.Port, Ready: b.ReadyURL == "" || r.ready[b.ReadyURL]})
		}
	}
	r.mu.RUnlock()
	data, err := json.Marshal(state)
	if err != nil || bytes.Equal(data, r.lastPublished) {
		return
	}
	tmp := StateFile(r.dir) + ".tmp"
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return
	}
	if os.WriteFile(tmp, data, 0o644) == nil && os.Rename(tmp, StateFile(r.dir)) == nil {
		r.lastPublished = data
	}
}

// ReadState reads what the resolver last published: "namespace/service" -> backends.
func ReadState(dir string) (map[string][]BackendState, error) {
	data, err := os.ReadFile(StateFile(dir))
	if err != nil {
		return nil, err
	}
	var out map[string][]BackendState
	return out, json.Unmarshal(data, &out)
}

func (r *Resolver) probe(ctx context.Context, u string) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return false
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// ReadyBackends returns the backends of a service port that passed their last probe.
func (r *Resolver) ReadyBackends(namespace, name string, port int32) []Backend {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []Backend
	for _, b := range r.services[namespace+"/"+name] {
		if b.Port != 0 && b.Port != port {
			continue
		}
		if b.ReadyURL != "" && !r.ready[b.ReadyURL] {
			continue
		}
		out = append(out, b)
	}
	return out
}

// ResolveEndpoint picks the next ready backend. With none ready it fails, as a Service without
// ready endpoints does; the API server then applies the webhook's failurePolicy.
func (r *Resolver) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	bs := r.ReadyBackends(namespace, name, port)
	if len(bs) == 0 {
		return nil, fmt.Errorf("service %s/%s port %d has no ready backends", namespace, name, port)
	}
	c, _ := r.rr.LoadOrStore(namespace+"/"+name, new(atomic.Uint64))
	i := c.(*atomic.Uint64).Add(1) - 1
	return &url.URL{Scheme: "https", Host: bs[i%uint64(len(bs))].Addr}, nil
}
