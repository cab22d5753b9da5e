package extender

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// The extender runs no leader election of its own: it follows kube-scheduler's
// (Config.LeaderLease). It is kube-scheduler's sidecar, and only the leading kube-scheduler calls
// it, so only the leader's extender learns from Filter which pods wait (retries); an instance
// elected apart could be one that is never called, asking nobody to retry, while the called one
// stays silent. Following the same leader makes the instance that is called the one that writes.
//
// kube-scheduler's identity in the Lease is its host name, "_" and a UUID, and the containers of
// a pod share the pod's host name; a host name has no "_", so the holder is the kube-scheduler
// beside this extender exactly when its identity starts with this host's name and "_".

// leadsUntil returns until when l makes host's kube-scheduler the leader: l's renewTime plus its
// leaseDurationSeconds when its holder's identity is host's name and "_" and more, and the zero
// time when l is nil, held by another or lacks a holder, renewTime or duration. Pure.
func leadsUntil(l *coordinationv1.Lease, host string) time.Time {
	if l == nil || l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil || host == "" {
		return time.Time{}
	}
	if !strings.HasPrefix(*l.Spec.HolderIdentity, host+"_") {
		return time.Time{}
	}
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
}

// Leading reports whether this instance runs the leader's loops now (lead): always without
// Config.LeaderLease once the informers synced, else while kube-scheduler's Lease names the
// kube-scheduler beside it.
func (s *Scheduler) Leading() bool { return s.leading.Load() }

// lead runs work whenever this instance leads, with a context that ends when it stops leading or
// ctx ends, and returns once ctx has ended and work has returned. Without Config.LeaderLease it
// runs work once, at once. With it, it watches that Lease alone and leads from the moment it
// sees it held by the kube-scheduler beside this extender (leadsUntil) until it sees another
// holder or the Lease expires by its renewTime, on this instance's clock: the clock of the
// kube-scheduler that renewed it, on the same host. A new leader takes the Lease only once it
// has seen it unrenewed for its whole duration, so this instance has stopped by then even when
// its watch is broken. Called once, by WatchCluster.
func (s *Scheduler) lead(ctx context.Context, work func(ctx context.Context)) {
	logger := klog.FromContext(ctx).WithName("leader")
	if s.cfg.LeaderLease == "" {
		s.setLeading(true)
		work(ctx)
		s.setLeading(false)
		return
	}
	namespace, name, _ := strings.Cut(s.cfg.LeaderLease, "/")
	var latest atomic.Pointer[coordinationv1.Lease]
	changed := make(chan struct{}, 1)
	seen := func(l *coordinationv1.Lease) {
		if l != nil && l.Name != name {
			return
		}
		latest.Store(l)
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(s.client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
		}))
	defer factory.Shutdown()
	if _, err := factory.Coordination().V1().Leases().Informer().AddEventHandler(handlers(seen, func(*coordinationv1.Lease) { seen(nil) })); err != nil {
		logger.Error(err, "Cannot follow kube-scheduler's leader Lease; never leading", "lease", s.cfg.LeaderLease)
		<-ctx.Done()
		return
	}
	factory.Start(ctx.Done())

	var term struct {
		stop context.CancelFunc
		wg   sync.WaitGroup
	}
	end := func(why string) {
		term.stop()
		term.wg.Wait()
		term.stop = nil
		s.setLeading(false)
		logger.Info("No longer leading", "lease", s.cfg.LeaderLease, "why", why)
	}
	expiry := s.newTimer()
	defer expiry.Stop()
	for {
		l := latest.Load()
		until := leadsUntil(l, s.host)
		now := s.clock.Now()
		switch leading := now.Before(until); {
		case leading && term.stop == nil:
			var termCtx context.Context
			termCtx, term.stop = context.WithCancel(ctx)
			s.setLeading(true)
			logger.Info("Leading: kube-scheduler beside this extender holds the Lease", "lease", s.cfg.LeaderLease, "holder", *l.Spec.HolderIdentity, "until", until)
			term.wg.Go(func() { work(termCtx) })
		case !leading && term.stop != nil:
			why := "the Lease has no holder"
			if !until.IsZero() {
				why = "the Lease expired at " + until.String()
			} else if l != nil && l.Spec.HolderIdentity != nil {
				why = "held by " + *l.Spec.HolderIdentity
			}
			end(why)
		}
		if term.stop != nil {
			expiry.Reset(until.Sub(now))
		}
		select {
		case <-ctx.Done():
			if term.stop != nil {
				end("stopping")
			}
			return
		case <-changed:
		case <-expiry.C():
		}
	}
}

// setLeading records whether this instance leads, for Leading and MetricLeader.
func (s *Scheduler) setLeading(v bool) {
	s.leading.Store(v)
	if v {
		s.metrics.leader.Set(1)
	} else {
		s.metrics.leader.Set(0)
	}
}

// leaderLoops are the writes only the leader makes, besides answering kube-scheduler's calls:
// the retry annotations (retryLoop) and the nodes' registration conditions with their events
// (conditionController). They run until ctx ends.
func (s *Scheduler) leaderLoops(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { s.retryLoop(ctx) })
	wg.Go(func() {
		ctx := klog.NewContext(ctx, klog.FromContext(ctx).WithName("node-conditions"))
		newConditionController(s).run(ctx)
	})
	wg.Wait()
}

// newTimer returns a stopped timer of the Scheduler's clock when it has timers (the real one, a
// fake clock in tests), else of the real clock.
func (s *Scheduler) newTimer() clock.Timer {
	var t clock.Timer
	if c, ok := s.clock.(clock.WithTicker); ok {
		t = c.NewTimer(time.Hour)
	} else {
		t = clock.RealClock{}.NewTimer(time.Hour)
	}
	t.Stop()
	return t
}
