package extender

import (
	"context"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpuslice/gpuslice/extender/drascore"
	"github.com/gpuslice/gpuslice/vgpu"
)

// PrioritizeDRA scores the candidate nodes for a pod whose claims ask for gpuslice's DRA devices,
// for a kube-scheduler extender with prioritizeVerb dra/prioritize and no managedResources (asked
// about every pod of the profile). It places the claims on each node as the allocator would and
// scores the node under the node policy (the pod's hami.io/node-policy, else Config.NodePolicy):
// drascore.State.Score. The nodes are then ranked (drascore.Rank): the best score gets
// extenderv1.MaxExtenderPriority, each worse distinct score one less, down to 1; nodes where the
// requests do not fit get 0.
//
// Every node scores 0 — neutral, leaving the choice to kube-scheduler's own scores — for a pod
// Score scores neutrally (its claims ask for no gpuslice device, or for one the scoring does not
// model), without Config.DRA and before the informers synced. The first time it scores a pod,
// the online workload counts the pod's requests (Config.Workload).
//
// It reads the informers' state only and is safe to call concurrently; the error wraps
// ErrBadArgs.
func (s *Scheduler) PrioritizeDRA(ctx context.Context, args *extenderv1.ExtenderArgs) (extenderv1.HostPriorityList, error) {
	names, err := candidates(args)
	if err != nil {
		return nil, err
	}
	list := make(extenderv1.HostPriorityList, len(names))
	for i, name := range names {
		list[i].Host = name
	}
	if s.dra == nil || !s.Ready() {
		return list, nil
	}
	res, ok := s.dra.Score(ctx, args.Pod, names)
	if !ok {
		return list, nil
	}
	if s.workload != nil && s.dra.CountOnce(args.Pod.UID) {
		s.workload.add(res.Demand)
	}
	for i, v := range drascore.Rank(res.Scores) {
		list[i].Score = v
	}
	klog.FromContext(ctx).V(5).Info("Prioritized DRA pod", "pod", klog.KObj(args.Pod), "scores", list)
	return list, nil
}

// watchDRA registers the DRA informers of factory (ResourceSlices of the gpuslice driver,
// ResourceClaims, DeviceClasses) with register, feeding s.dra; slices come from their own
// factory, which lists only the driver's. The caller starts both factories.
func (s *Scheduler) watchDRA(cluster, sliceFactory informers.SharedInformerFactory, register func(cache.SharedIndexInformer, cache.ResourceEventHandlerFuncs) error) error {
	d := s.dra
	if err := register(sliceFactory.Resource().V1().ResourceSlices().Informer(), handlers(d.UpsertSlice, d.DeleteSlice)); err != nil {
		return err
	}
	if err := register(cluster.Resource().V1().ResourceClaims().Informer(), handlers(d.UpsertClaim, d.DeleteClaim)); err != nil {
		return err
	}
	return register(cluster.Resource().V1().DeviceClasses().Informer(), handlers(d.UpsertClass, d.DeleteClass))
}

// draSliceFactory is an informer factory whose ResourceSlices are only the gpuslice driver's.
func draSliceFactory(s *Scheduler) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(s.client, 0, informers.WithTransform(trimmer("", nil)),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = resourcev1.ResourceSliceSelectorDriver + "=" + vgpu.DRADriverName
		}))
}
