// Package secretvolume mirrors a Secret into a directory the way the kubelet's secret volume
// does, with the kubelet's own AtomicWriter: the keys appear as symlinks to ..data/<key>, and
// ..data is a symlink swapped atomically to a new timestamped directory on every change.
package secretvolume

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	volumeutil "k8s.io/kubernetes/pkg/volume/util"
)

// Config of one mirrored Secret.
type Config struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
	Dir       string
	// Delay between seeing a change and writing it (the kubelet's sync period makes real
	// volumes lag by up to ~a minute).
	Delay time.Duration
	// Mode of the files (the volume's defaultMode).
	Mode int32
}

// Payload is the kubelet's secret volume payload: every key, with the default mode.
func Payload(s *corev1.Secret, mode int32) map[string]volumeutil.FileProjection {
	out := make(map[string]volumeutil.FileProjection, len(s.Data))
	for k, v := range s.Data {
		out[k] = volumeutil.FileProjection{Data: v, Mode: mode}
	}
	return out
}

// Write writes the Secret into dir once, as the kubelet sets up the volume before the
// container starts (AtomicWriter: nothing changes when the content is the same).
func Write(dir string, s *corev1.Secret, mode int32) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	w, err := volumeutil.NewAtomicWriter(dir, fmt.Sprintf("secret %s/%s", s.Namespace, s.Name))
	if err != nil {
		return err
	}
	return w.Write(Payload(s, mode), nil)
}

// Run mirrors until ctx ends. Changes seen during a pending delay are coalesced: the latest
// version is written when the delay ends.
func Run(ctx context.Context, cfg Config) error {
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return err
	}
	w, err := volumeutil.NewAtomicWriter(cfg.Dir, fmt.Sprintf("secret %s/%s", cfg.Namespace, cfg.Name))
	if err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0,
		informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", cfg.Name).String()
		}))
	inf := factory.Core().V1().Secrets().Informer()
	changed := make(chan struct{}, 1)
	notify := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, n any) { notify(n) },
	})
	factory.Start(ctx.Done())
	lastRV := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		if cfg.Delay > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(cfg.Delay):
			}
		}
		obj, exists, err := inf.GetIndexer().GetByKey(cfg.Namespace + "/" + cfg.Name)
		if err != nil || !exists {
			// A deleted Secret leaves the volume as it was, as in the kubelet.
			continue
		}
		s := obj.(*corev1.Secret)
		if s.ResourceVersion == lastRV {
			continue
		}
		if err := w.Write(Payload(s, cfg.Mode), nil); err != nil {
			log.Printf("write %s: %v", cfg.Dir, err)
			// Try again on the next change or after a second.
			go func() { time.Sleep(time.Second); notify(nil) }()
			continue
		}
		lastRV = s.ResourceVersion
		log.Printf("wrote secret %s/%s resourceVersion %s (%d keys) into %s", cfg.Namespace, cfg.Name, s.ResourceVersion, len(s.Data), cfg.Dir)
	}
}
