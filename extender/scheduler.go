package extender

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuslice/gpuslice/extender/cluster"
	"github.com/gpuslice/gpuslice/extender/drascore"
	"github.com/gpuslice/gpuslice/extender/retry"
	"github.com/gpuslice/gpuslice/internal/eventqueue"
	"github.com/gpuslice/gpuslice/vgpu"
)

// Options are the Scheduler's injected parts.
type Options struct {
	// Client reaches the API server: informers on Nodes, Pods and heartbeat
	// Leases, and Bind's requests. Required.
	Client kubernetes.Interface
	// Clock judges heartbeat age; nil means the real clock.
	Clock clock.PassiveClock
	// Workload, when set, is what the fragmentation policy measures
	// against, whatever Config.Workload says. It is only read.
	Workload *vgpu.Workload
	// Registry receives the extender's metrics (docs/metrics.md), served
	// on GET /metrics. Nil means a new registry with the Go runtime and
	// process collectors; a given registry gets only the extender's own
	// metrics, and New fails if they are already registered there.
	Registry *prometheus.Registry
	// EventClient writes the events the extender records: a pod event for
	// each placement and a Node event when it changes a registration
	// condition. Give it a client with its own rate limiter, so that
	// events never wait behind binds or hold them back. Nil means Client.
	EventClient kubernetes.Interface
	// Hostname is the host name kube-scheduler's leader identity starts
	// with when it is the one beside this extender (Config.LeaderLease).
	// Empty means os.Hostname(): the pod's, which a sidecar shares.
	Hostname string
}

// Scheduler is the extender's logic: it keeps the cluster's GPU state from
// informers and answers kube-scheduler's Filter, Prioritize and Bind. Its
// methods are safe for concurrent use. Create it with New, then run
// WatchCluster (or Run/Serve, which include it).
type Scheduler struct {
	cfg        Config
	client     kubernetes.Interface
	clock      clock.PassiveClock
	fitOptions vgpu.FitOptions
	// state is what the informers said, and the judge of pods on it.
	state *cluster.State
	// retries are the pods Filter turned away, which the state's changes
	// may cure (retryLoop); it is the state's listener.
	retries    *retry.Tracker[cluster.Demand]
	rejections rejectionCounts
	metrics    *metrics
	// binds bounds the binds waiting for the API client.
	binds bindGate
	// pods is the pod informer's store once WatchCluster started it;
	// Bind reads pods from it. It holds *gpuPod for pods that ask for
	// a hami.io resource or carry annotations the extender reads and
	// *podMeta for the others (trimmer).
	pods atomic.Pointer[cache.Indexer]
	// synced is set once the informers' first lists are handled.
	synced atomic.Bool
	// workload counts arriving pods into the online workload; nil when
	// the workload is fixed (Options.Workload, Config.Workload default).
	workload *workloadTracker
	// events records pod and Node events in the background; WatchCluster
	// runs it.
	events *eventqueue.Queue
	// dra is the DRA nodes and claims (Config.DRA); nil when off.
	dra *drascore.State
	// unconfirmed are the pods Bind bound that the pod informer's cache
	// did not have (confirmBinds).
	unconfirmed unconfirmedBinds
	// doubts are the reservations of binds whose Binding had an unknown
	// outcome and whose pod was not bound yet (doubt.go).
	doubts doubtfulBinds
	// host is this instance's host name (Options.Hostname); leading is
	// whether it runs the leader's loops now (lead).
	host    string
	leading atomic.Bool
}

// New returns a Scheduler for cfg, which it validates, with its metrics
// registered (Options.Registry). It starts nothing.
func New(cfg Config, opts Options) (*Scheduler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Client == nil {
		return nil, errors.New("extender: Options.Client is required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Hostname == "" && cfg.LeaderLease != "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("extender: leaderLease %s needs this host's name, which kube-scheduler's identity starts with: %w", cfg.LeaderLease, err)
		}
		opts.Hostname = host
	}
	var tracker *workloadTracker
	if opts.Workload == nil {
		// The online workload starts from the default until pods arrive.
		opts.Workload = vgpu.DefaultWorkload()
		if cfg.Workload == WorkloadOnline {
			tracker = newWorkloadTracker(float64(cfg.WorkloadHalfLife))
		}
	}
	s := &Scheduler{
		cfg:        cfg,
		client:     opts.Client,
		clock:      opts.Clock,
		fitOptions: vgpu.FitOptions{NodePolicy: cfg.NodePolicy, GPUPolicy: cfg.GPUPolicy},
		retries:    retry.New[cluster.Demand](opts.Clock.Now),
		binds:      bindGate{max: int64(cfg.pendingBinds())},
		workload:   tracker,
		host:       opts.Hostname,
	}
	stateOpts := cluster.Options{
		ResourceName:             corev1.ResourceName(cfg.ResourceName),
		Now:                      opts.Clock.Now,
		HeartbeatMaxAge:          cfg.HeartbeatMaxAge.Duration,
		HeartbeatNamespace:       cfg.HeartbeatNamespace,
		Fit:                      s.fitOptions,
		PercentageOfNodesToScore: cfg.PercentageOfNodesToScore,
		Workload:                 opts.Workload,
		Listener:                 s.retries,
	}
	if cfg.DRA {
		// The DRA state reads the cluster state's hosts (ReadHosts) and
		// adds its GPUs to the workload's supply, which is asked for only
		// once s.dra is set below.
		stateOpts.ExtraSupply = func() map[string]int { return s.dra.Supply() }
	}
	s.state = cluster.New(stateOpts)
	if cfg.DRA {
		s.dra = drascore.New(s.fitOptions, s.state)
	}
	events := opts.EventClient
	if events == nil {
		events = opts.Client
	}
	s.events = eventqueue.New(eventCreator(events), corev1.EventSource{Component: fieldManager}, opts.Clock, klog.Background().WithName("events"), eventQueueSize)
	m, err := newMetrics(s, opts.Registry)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	return s, nil
}

// Ready reports whether the informers' caches have synced and their
// contents are counted; before that the state may lack pods, so /readyz
// answers 503.
func (s *Scheduler) Ready() bool { return s.synced.Load() }

// errNotSynced is what /readyz says before the informers synced.
var errNotSynced = errors.New("informer caches not synced")

// readyErr is Ready as the probe routes take it.
func (s *Scheduler) readyErr() error {
	if !s.Ready() {
		return errNotSynced
	}
	return nil
}

// NodeUsage returns a copy of what the counted pods (bound, and reserved by
// a Bind in progress) hold on node; empty for an unknown node.
func (s *Scheduler) NodeUsage(node string) *vgpu.NodeUsage { return s.state.Usage(node) }

// Rejections returns how many times, since start, Filter turned a node
// away, by reason: the vgpu Fit reasons and this package's Reason
// constants.
func (s *Scheduler) Rejections() map[vgpu.Reason]int64 { return s.rejections.snapshot() }

// WatchCluster runs the informers on Nodes, Pods and the heartbeat Leases
// (in Config.HeartbeatNamespace), and with Config.DRA on the gpuslice
// driver's ResourceSlices, ResourceClaims and DeviceClasses, until ctx ends, keeping the state that
// Filter, Prioritize and Bind read; Ready turns true once their first
// lists are handled. It returns nil when ctx ends, or an error when ctx
// ends before the caches synced. Call it once.
func (s *Scheduler) WatchCluster(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("informers")
	trim := trimmer(corev1.ResourceName(s.cfg.ResourceName), s.state.ParsedInventory)
	factory := informers.NewSharedInformerFactoryWithOptions(s.client, 0, informers.WithTransform(trim))
	// The pod cache without the factory's namespace index: the extender
	// reads pods by key only, and the index costs a set entry per pod.
	factory.InformerFor(&corev1.Pod{}, func(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
		return coreinformers.NewFilteredPodInformer(c, metav1.NamespaceAll, resync, cache.Indexers{}, nil)
	})
	// Only the heartbeat Leases: the kubelets' node Leases share the
	// namespace and are renewed every 10 s each.
	leases := informers.NewSharedInformerFactoryWithOptions(s.client, 0,
		informers.WithNamespace(s.cfg.HeartbeatNamespace), informers.WithTransform(trim),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = vgpu.LabelHeartbeat + "=" + vgpu.LabelHeartbeatValue
		}))
	defer factory.Shutdown()
	defer leases.Shutdown()
	var draSlices informers.SharedInformerFactory
	if s.dra != nil {
		draSlices = draSliceFactory(s)
		defer draSlices.Shutdown()
	}

	st := s.state
	var regs []cache.ResourceEventHandlerRegistration
	register := func(inf cache.SharedIndexInformer, h cache.ResourceEventHandlerFuncs) error {
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return fmt.Errorf("informer handler: %w", err)
		}
		regs = append(regs, reg)
		return nil
	}
	err := errors.Join(
		register(factory.Core().V1().Nodes().Informer(), handlers(st.UpsertNodeMeta, func(n *cluster.NodeMeta) { st.DeleteNode(n.Name) })),
		register(factory.Core().V1().Pods().Informer(), podHandlers(logger, st, s.podArrival())),
		register(leases.Coordination().V1().Leases().Informer(), handlers(st.UpsertLease, func(l *coordinationv1.Lease) { st.DeleteLease(l.Name) })),
	)
	if err != nil {
		return err
	}
	if s.dra != nil {
		// A deleted pod is forgotten by the online workload's DRA count.
		forget := handlers(func(any) {}, func(obj any) {
			if o, err := meta.Accessor(obj); err == nil {
				s.dra.ForgetPod(o.GetUID())
			}
		})
		if err := errors.Join(s.watchDRA(factory, draSlices, register), register(factory.Core().V1().Pods().Informer(), forget)); err != nil {
			return err
		}
		draSlices.Start(ctx.Done())
	}
	podStore := factory.Core().V1().Pods().Informer().GetIndexer()
	s.pods.Store(&podStore)
	factory.Start(ctx.Done())
	leases.Start(ctx.Done())
	synced := make([]cache.InformerSynced, 0, len(regs))
	for _, r := range regs {
		synced = append(synced, r.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("informer caches did not sync: %w", context.Cause(ctx))
	}
	s.synced.Store(true)
	// Pods Filter turned away before now were judged on no state at all.
	s.state.Synced()
	logger.Info("Informer caches synced; ready")
	var wg sync.WaitGroup
	// Only the leader asks for retries and writes node conditions; every
	// instance keeps its informers warm, confirms its own binds and
	// records the events of the binds it answers.
	wg.Go(func() { s.lead(ctx, s.leaderLoops) })
	wg.Go(func() { s.confirmLoop(ctx) })
	if s.workload != nil {
		wg.Go(func() { s.workloadLoop(ctx) })
	}
	wg.Go(func() { s.events.Run(ctx) })
	<-ctx.Done()
	s.synced.Store(false)
	wg.Wait()
	return nil
}

// handlers adapts typed add/update and delete functions to an informer,
// unwrapping the tombstones of deletes the watch missed.
func handlers[T any](upsert func(T), remove func(T)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if o, ok := obj.(T); ok {
				upsert(o)
			}
		},
		UpdateFunc: func(_, obj any) {
			if o, ok := obj.(T); ok {
				upsert(o)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if o, ok := obj.(T); ok {
				remove(o)
			}
		},
	}
}

// podHandlers feeds the pod informer's events to st, and each pod added
// to arrived (nil: none). A pod the trimmer kept as a podMeta asks for no
// GPU and carries no allocation: it counts its CPU and memory on its node
// and no GPU usage (an update that removed a pod's last hami.io/
// annotation must still remove what it counted).
//
// The informer keys pods by namespace/name. When its watch breaks (an API
// server restart) and it lists again, a pod deleted and created again under
// the same name in the gap arrives as an update from the old pod to the new
// one, never as the old pod's delete: an update that changes the UID first
// removes what the old pod held, else its slices would stay counted for
// good (found by the chaos soak), and the new pod arrives.
func podHandlers(logger klog.Logger, st *cluster.State, arrived func(obj any)) cache.ResourceEventHandlerFuncs {
	h := handlers(func(obj any) {
		switch o := obj.(type) {
		case *podMeta:
			st.UpsertPlainPod(o.UID, o.NodeName, o.Terminal, o.Host)
		case *gpuPod:
			if err := st.UpsertPod(o.pod()); err != nil {
				logger.Info("Not counting a pod with an invalid allocation", "pod", klog.KRef(o.Namespace, o.Name), "node", o.NodeName, "err", err.Error())
			}
		}
	}, func(obj any) {
		// meta.Accessor reads a podMeta through GetObjectMeta.
		if o, err := meta.Accessor(obj); err == nil {
			st.DeletePod(o.GetUID())
		}
	})
	update := h.UpdateFunc
	h.UpdateFunc = func(oldObj, obj any) {
		// meta.Accessor reads a podMeta through GetObjectMeta.
		o, oldErr := meta.Accessor(oldObj)
		n, newErr := meta.Accessor(obj)
		if oldErr == nil && newErr == nil && n.GetUID() != o.GetUID() {
			st.DeletePod(o.GetUID())
			if arrived != nil {
				arrived(obj)
			}
		}
		update(oldObj, obj)
	}
	if arrived != nil {
		upsert := h.AddFunc
		h.AddFunc = func(obj any) {
			arrived(obj)
			upsert(obj)
		}
	}
	return h
}

// podArrival is podHandlers' arrived: the online workload's, or nil.
func (s *Scheduler) podArrival() func(obj any) {
	if s.workload == nil {
		return nil
	}
	return s.podArrived
}

// trimmer returns the informers' transform: it drops from each object
// what the extender never reads, to keep cluster-wide caches small. Of a
// Pod that asks for a hami.io resource or carries an annotation the
// extender reads (keepAnnotations) it keeps a gpuPod: its identity, those
// annotations, bounded (not, say, kubectl's last-applied-configuration or
// another hami.io/ key), node, phase, overhead, claims and its
// containers' names, resources and restart policies. Every other pod — most pods of a
// cluster, which the extender never binds — becomes a podMeta: its
// identity, node, whether it finished and its CPU and memory request, a
// fifth of the size of an empty corev1.Pod. A Node becomes a nodeMeta
// (cluster.NodeMetaOf): its identity, the ready label, the inventory parsed (reuse
// shares the state's parse while the annotation is unchanged; nil: parse
// each time), the allocatable of resource, CPU and memory and the status
// and reason of its Ready and registration conditions. Of a Lease it keeps
// its identity, renewTime and heartbeat annotation. Of anything else, all
// but the managed fields.
func trimmer(resource corev1.ResourceName, reuse cluster.InventoryReuse) cache.TransformFunc {
	return func(obj any) (any, error) {
		switch o := obj.(type) {
		case *corev1.Pod:
			annotations := keepAnnotations(o.Annotations)
			if annotations == nil && !vgpu.AsksForGPU(o) {
				return metaOf(o), nil
			}
			return gpuPodOf(o, annotations), nil
		case *corev1.Node:
			return cluster.NodeMetaOf(o, resource, reuse), nil
		case *resourcev1.ResourceClaim:
			return drascore.TrimClaim(o), nil
		case *coordinationv1.Lease:
			// Only heartbeat Leases are watched: the renewal and the
			// heartbeat annotation are all the extender reads.
			l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace, UID: o.UID, ResourceVersion: o.ResourceVersion}}
			if v, ok := o.Annotations[vgpu.AnnotationPluginHeartbeat]; ok {
				l.Annotations = map[string]string{vgpu.AnnotationPluginHeartbeat: v}
			}
			l.Spec.RenewTime = o.Spec.RenewTime
			return l, nil
		case metav1.Object:
			o.SetManagedFields(nil)
		}
		return obj, nil
	}
}

// keepAnnotations returns the annotations of a pod that the extender reads
// (vgpu.PodAnnotationLimit): its allocation and its placement constraints;
// nil when it has none. A value over its limit is kept as a copy of its
// first limit+1 bytes, which the parsers reject as over the limit all the
// same, so that what the cache keeps of a pod is bounded whatever the pod
// carries.
func keepAnnotations(in map[string]string) map[string]string {
	var out map[string]string
	for k, v := range in {
		limit, read := vgpu.PodAnnotationLimit(k)
		if !read {
			continue
		}
		if len(v) > limit {
			v = strings.Clone(v[:limit+1])
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out
}

// rejectionCounts counts Filter's rejections by reason.
type rejectionCounts struct {
	mu     sync.Mutex
	counts map[vgpu.Reason]int64
}

func (r *rejectionCounts) add(counts map[vgpu.Reason]int64) {
	if len(counts) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.counts == nil {
		r.counts = map[vgpu.Reason]int64{}
	}
	for reason, n := range counts {
		r.counts[reason] += n
	}
}

func (r *rejectionCounts) snapshot() map[vgpu.Reason]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.counts)
}
