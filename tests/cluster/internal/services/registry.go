// Package services is the file registry that stands in for Services and their EndpointSlices:
// <dir>/<namespace>/<service> lists backends, one a line:
//
//	127.0.0.1:18443 port=443 ready=http://127.0.0.1:18080/readyz
//
// port= is the Service port the line serves (absent: any port); ready= is a URL whose 200 answer
// marks the backend ready (absent: always ready). Lines starting with # are comments.
package services

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Backend is one endpoint of a service.
type Backend struct {
	// Addr is host:port to dial.
	Addr string
	// Port is the Service port this backend serves; 0 matches any port.
	Port int32
	// ReadyURL is polled; a 200 answer means ready. Empty: always ready.
	ReadyURL string
}

func (b Backend) line() string {
	s := b.Addr
	if b.Port != 0 {
		s += " port=" + strconv.Itoa(int(b.Port))
	}
	if b.ReadyURL != "" {
		s += " ready=" + b.ReadyURL
	}
	return s
}

// Validate reports bad input clearly.
func (b Backend) Validate() error {
	if _, _, err := net.SplitHostPort(b.Addr); err != nil {
		return fmt.Errorf("backend address %q is not host:port: %w", b.Addr, err)
	}
	if b.Port < 0 || b.Port > 65535 {
		return fmt.Errorf("service port %d out of range", b.Port)
	}
	if b.ReadyURL != "" {
		u, err := url.Parse(b.ReadyURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("ready URL %q is not an http(s) URL", b.ReadyURL)
		}
	}
	return nil
}

// ParseLine parses one registry line.
func ParseLine(line string) (Backend, error) {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return Backend{}, errors.New("empty line")
	}
	b := Backend{Addr: fields[0]}
	for _, f := range fields[1:] {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return Backend{}, fmt.Errorf("field %q is not key=value", f)
		}
		switch k {
		case "port":
			p, err := strconv.ParseInt(v, 10, 32)
			if err != nil {
				return Backend{}, fmt.Errorf("bad port %q: %w", v, err)
			}
			b.Port = int32(p)
		case "ready":
			b.ReadyURL = v
		default:
			return Backend{}, fmt.Errorf("unknown field %q", k)
		}
	}
	return b, b.Validate()
}

// Parse reads a registry file's content; bad lines are returned as errors beside the good ones.
func Parse(content string) ([]Backend, []error) {
	var out []Backend
	var errs []error
	sc := bufio.NewScanner(strings.NewReader(content))
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		b, err := ParseLine(line)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", n, err))
			continue
		}
		out = append(out, b)
	}
	return out, errs
}

func validName(s string) bool {
	return s != "" && !strings.ContainsAny(s, "/\\") && s != "." && s != ".."
}

func servicePath(dir, namespace, service string) (string, error) {
	if !validName(namespace) || !validName(service) {
		return "", fmt.Errorf("invalid namespace/service %q/%q", namespace, service)
	}
	return filepath.Join(dir, namespace, service), nil
}

// List returns the backends registered for a service (none: empty, no error).
func List(dir, namespace, service string) ([]Backend, error) {
	p, err := servicePath(dir, namespace, service)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	bs, errs := Parse(string(data))
	return bs, errors.Join(errs...)
}

// Add registers a backend, replacing a line with the same address and port.
func Add(dir, namespace, service string, b Backend) error {
	if err := b.Validate(); err != nil {
		return err
	}
	return edit(dir, namespace, service, func(bs []Backend) []Backend {
		out := bs[:0]
		for _, x := range bs {
			if !(x.Addr == b.Addr && x.Port == b.Port) {
				out = append(out, x)
			}
		}
		return append(out, b)
	})
}

// Remove unregisters the backend with this address (and port, if port != 0).
func Remove(dir, namespace, service, addr string, port int32) error {
	return edit(dir, namespace, service, func(bs []Backend) []Backend {
		out := bs[:0]
		for _, x := range bs {
			if !(x.Addr == addr && (port == 0 || x.Port == port)) {
				out = append(out, x)
			}
		}
		return out
	})
}

// edit rewrites a service file under an exclusive lock, atomically (temp file + rename), so the
// resolver never reads half a file and concurrent editors do not lose lines.
func edit(dir, namespace, service string, f func([]Backend) []Backend) error {
	p, err := servicePath(dir, namespace, service)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	bs, err := List(dir, namespace, service)
	if err != nil {
		return err
	}
	bs = f(bs)
	var sb strings.Builder
	for _, b := range bs {
		sb.WriteString(b.line())
		sb.WriteByte('\n')
	}
	tmp := fmt.Sprintf("%s.tmp.%d", p, os.Getpid())
	if err := os.WriteFile(tmp, []byte(sb.String()), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
