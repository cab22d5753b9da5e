package scale

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// heartbeatTick is how often the heartbeats send a batch of renewals.
const heartbeatTick = time.Second

// heartbeats renews the hollow nodes' heartbeat Leases as the device plugin does: an Update of
// the whole Lease with a new renewTime (the heartbeat annotation unchanged, as the registration
// does not change), each Lease once per interval. The Leases are spread over the interval in
// batches sent once per heartbeatTick, so the API server sees a steady len/interval renewals
// per second rather than bursts.
type heartbeats struct {
	client   kubernetes.Interface
	interval time.Duration
	workers  int

	mu     sync.Mutex // guards leases and paused
	leases []*coordinationv1.Lease
	// paused are the Leases (by name) not renewed for now: a device plugin that stopped
	// renewing (see setRenewTime).
	paused map[string]bool

	renewals, failures atomic.Int64
	lastErr            atomic.Value // string
}

// run renews until ctx ends.
func (h *heartbeats) run(ctx context.Context) {
	batches := max(int(h.interval/heartbeatTick), 1)
	ticker := time.NewTicker(heartbeatTick)
	defer ticker.Stop()
	for turn := 0; ; turn = (turn + 1) % batches {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		h.mu.Lock()
		var batch []int
		for i := turn; i < len(h.leases); i += batches {
			batch = append(batch, i)
		}
		h.mu.Unlock()
		_ = parallel(ctx, len(batch), h.workers, func(ctx context.Context, j int) error {
			h.renew(ctx, batch[j])
			return nil // a failed renewal is counted; the next turn tries again
		})
	}
}

// renew renews Lease i once; on a conflict it reads the Lease again for the next turn.
func (h *heartbeats) renew(ctx context.Context, i int) {
	h.mu.Lock()
	l := h.leases[i].DeepCopy()
	paused := h.paused[l.Name]
	h.mu.Unlock()
	if paused {
		return
	}
	now := metav1.NewMicroTime(time.Now())
	l.Spec.RenewTime = &now
	leases := h.client.CoordinationV1().Leases(l.Namespace)
	got, err := leases.Update(ctx, l, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		got, err = leases.Get(ctx, l.Name, metav1.GetOptions{})
	}
	if err != nil {
		if ctx.Err() == nil {
			h.failures.Add(1)
			h.lastErr.Store(fmt.Sprintf("renew lease %s/%s: %v", l.Namespace, l.Name, err))
		}
		return
	}
	h.renewals.Add(1)
	h.mu.Lock()
	h.leases[i] = got
	h.mu.Unlock()
}

// lastError returns the last renewal error, or "".
func (h *heartbeats) lastError() string {
	s, _ := h.lastErr.Load().(string)
	return s
}

// setRenewTime writes renewTime at of the heartbeat Lease name and pauses its renewals when
// pause, or resumes them: a device plugin that stopped renewing (at in the past), or came back
// (at now). Pausing a Lease the harness does not renew is an error.
func (h *heartbeats) setRenewTime(ctx context.Context, name string, at time.Time, pause bool) error {
	h.mu.Lock()
	i := -1
	for k, l := range h.leases {
		if l.Name == name {
			i = k
		}
	}
	if i < 0 {
		h.mu.Unlock()
		return fmt.Errorf("heartbeat Lease %s: not one the harness renews", name)
	}
	if h.paused == nil {
		h.paused = map[string]bool{}
	}
	h.paused[name] = pause
	ns := h.leases[i].Namespace
	h.mu.Unlock()
	leases := h.client.CoordinationV1().Leases(ns)
	for range 5 {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("heartbeat Lease %s: %w", name, err)
		}
		t := metav1.NewMicroTime(at)
		l.Spec.RenewTime = &t
		got, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue // a renewal in flight when the pause began
		}
		if err != nil {
			return fmt.Errorf("heartbeat Lease %s: %w", name, err)
		}
		h.mu.Lock()
		h.leases[i] = got
		h.mu.Unlock()
		return nil
	}
	return fmt.Errorf("heartbeat Lease %s: conflicts on every update", name)
}
