package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Phase is one stretch of a run with one kind of fault; everything observed while it is the
// current phase is counted in it.
type Phase struct {
	Name string
	// AllMutated: every status write of this phase must come back mutated (SIGTERM with 2 or
	// more replicas left, and the calm baseline).
	AllMutated bool
	// APIDown: the API server is restarted in this phase, so writes and pod creations may fail
	// for that reason alone; they are reported, and must not name a webhook or a certificate.
	APIDown bool

	Start, End time.Time
	Faults     map[string]int64

	Writes, Failed, Slow, WebhookErrs, ClientX509 int64
	Mutated, NotMutated                           int64
	FailOpen, Rejected                            int64
	X509APIServer, X509Replica                    int64
	PodsCreated, PodsFailed                       int64
	// Placements on capped nodes (pods/binding, and pods created with spec.nodeName): the
	// cap has room, so each must go through whether the cap webhook answers or not.
	PlacedOK, PlacedFailed int64
	// CapFailOpen: reviews of the cap's webhook that failed open (allowed; not in FailOpen).
	CapFailOpen int64
	Notes       []string
}

// Tally is the run's phases; the observers add to the current one.
type Tally struct {
	mu     sync.Mutex
	phases []*Phase
	cur    *Phase
	errs   []string
	// placements: the run places pods on capped nodes (its summary and invariant are printed).
	placements bool
}

func newTally() *Tally {
	t := &Tally{}
	t.Begin("setup", false, false)
	return t
}

// Begin ends the current phase and starts a new one.
func (t *Tally) Begin(name string, allMutated, apiDown bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if t.cur != nil {
		t.cur.End = now
	}
	t.cur = &Phase{Name: name, AllMutated: allMutated, APIDown: apiDown, Start: now, Faults: map[string]int64{}}
	t.phases = append(t.phases, t.cur)
	progress("phase %s", name)
}

// Current is a copy of the current phase.
func (t *Tally) Current() Phase {
	t.mu.Lock()
	defer t.mu.Unlock()
	return *t.cur
}

// Add changes the current phase.
func (t *Tally) Add(f func(p *Phase)) {
	t.mu.Lock()
	f(t.cur)
	t.mu.Unlock()
}

// Fault counts one injected fault of a kind.
func (t *Tally) Fault(kind, detail string) {
	t.Add(func(p *Phase) { p.Faults[kind]++ })
	progress("fault %-22s %s", kind, detail)
}

// Note records something the report should show under the table.
func (t *Tally) Note(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	t.Add(func(p *Phase) { p.Notes = append(p.Notes, msg) })
	progress("note: %s", msg)
}

// Error records a failure of the run itself (a fault that could not be injected, a repair
// that never came); it fails the run.
func (t *Tally) Error(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	t.mu.Lock()
	name := t.cur.Name
	t.errs = append(t.errs, name+": "+msg)
	t.mu.Unlock()
	progress("ERROR %s: %s", name, msg)
}

// Finish closes the last phase, prints the table and returns the broken invariants.
func (t *Tally) Finish(w io.Writer, timeoutSeconds int) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cur != nil && t.cur.End.IsZero() {
		t.cur.End = time.Now()
	}
	total := &Phase{Name: "TOTAL", Faults: map[string]int64{}}
	var broken []string
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "phase\tsecs\tfaults\twrites\tfailed\tslow>%ds\tmutated\tnot mutated\tfail-open\tx509\tpods ok\tpods failed\tplaced ok\tplaced failed\t\n", timeoutSeconds)
	row := func(p *Phase) {
		secs := p.End.Sub(p.Start).Seconds()
		if p.Name == "TOTAL" {
			secs = 0
			for _, q := range t.phases {
				secs += q.End.Sub(q.Start).Seconds()
			}
		}
		var faults int64
		for _, n := range p.Faults {
			faults += n
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", p.Name, secs, faults, p.Writes, p.Failed, p.Slow,
			p.Mutated, p.NotMutated, p.FailOpen, p.X509APIServer+p.X509Replica+p.ClientX509, p.PodsCreated, p.PodsFailed,
			p.PlacedOK, p.PlacedFailed)
	}
	for _, p := range t.phases {
		row(p)
		for k, n := range p.Faults {
			total.Faults[k] += n
		}
		total.Writes += p.Writes
		total.Failed += p.Failed
		total.Slow += p.Slow
		total.Mutated += p.Mutated
		total.NotMutated += p.NotMutated
		total.FailOpen += p.FailOpen
		total.CapFailOpen += p.CapFailOpen
		total.Rejected += p.Rejected
		total.X509APIServer += p.X509APIServer
		total.X509Replica += p.X509Replica
		total.ClientX509 += p.ClientX509
		total.PodsCreated += p.PodsCreated
		total.PodsFailed += p.PodsFailed
		total.PlacedOK += p.PlacedOK
		total.PlacedFailed += p.PlacedFailed
		broken = append(broken, p.check()...)
	}
	row(total)
	_ = tw.Flush()

	fmt.Fprintln(w, "\nfaults injected by kind:")
	kinds := make([]string, 0, len(total.Faults))
	for k := range total.Faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(w, "  %-24s %d\n", k, total.Faults[k])
	}
	fmt.Fprintf(w, "x509 errors: %d in API server logs, %d in replica logs (TLS alerts), %d in write errors; webhook rejections (API server metric): %d\n",
		total.X509APIServer, total.X509Replica, total.ClientX509, total.Rejected)
	if t.placements {
		var placedFailedUp int64
		for _, p := range t.phases {
			if !p.APIDown {
				placedFailedUp += p.PlacedFailed
			}
		}
		fmt.Fprintf(w, "placements on capped nodes (pods/binding and spec.nodeName, cap with room): %d ok, %d failed while the API server was up (must be 0: fail-open), %d failed in all; the cap webhook failed open %d times (allowed)\n",
			total.PlacedOK, placedFailedUp, total.PlacedFailed, total.CapFailOpen)
		if total.PlacedOK == 0 {
			broken = append(broken, "no placement on a capped node went through: the placement load did not run")
		}
	}
	for _, p := range t.phases {
		for _, n := range p.Notes {
			fmt.Fprintf(w, "note (%s): %s\n", p.Name, n)
		}
	}
	if total.X509APIServer+total.X509Replica+total.ClientX509 > 0 {
		broken = append(broken, fmt.Sprintf("x509 errors: %d (must be 0)", total.X509APIServer+total.X509Replica+total.ClientX509))
	}
	if total.Rejected > 0 {
		broken = append(broken, fmt.Sprintf("the API server rejected %d requests because of the webhook (failurePolicy must be Ignore)", total.Rejected))
	}
	if total.Writes == 0 {
		broken = append(broken, "no status write was attempted: the fake nodes did not run")
	}
	broken = append(broken, t.errs...)
	return broken
}

func (p *Phase) check() []string {
	var out []string
	if p.APIDown {
		if p.WebhookErrs > 0 {
			out = append(out, fmt.Sprintf("%s: %d status writes failed naming the webhook", p.Name, p.WebhookErrs))
		}
	} else {
		if p.Failed > 0 {
			out = append(out, fmt.Sprintf("%s: %d status writes failed (must be 0)", p.Name, p.Failed))
		}
		if p.PodsFailed > 0 {
			out = append(out, fmt.Sprintf("%s: %d pod creations failed (must be 0)", p.Name, p.PodsFailed))
		}
		if p.PlacedFailed > 0 {
			out = append(out, fmt.Sprintf("%s: %d placements on capped nodes failed (must be 0: the cap webhook fails open)", p.Name, p.PlacedFailed))
		}
	}
	if p.AllMutated && (p.NotMutated > 0 || p.FailOpen > 0) {
		out = append(out, fmt.Sprintf("%s: %d status writes not mutated, %d reviews failed open (must be 0: 100%% mutated)", p.Name, p.NotMutated, p.FailOpen))
	}
	if p.AllMutated && p.Mutated == 0 {
		out = append(out, fmt.Sprintf("%s: no mutated status write observed", p.Name))
	}
	return out
}

var progressStart = time.Now()

// progress prints one line of progress with the time since start.
func progress(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Printf("[chaos %6.1fs] %s\n", time.Since(progressStart).Seconds(), strings.TrimRight(msg, "\n"))
}
