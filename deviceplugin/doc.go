// Package deviceplugin is gpuslice's node agent: it serves the kubelet
// device-plugin API (v1beta1) for one extended resource (hami.io/gpu by
// default), advertising SplitCount virtual devices per healthy physical GPU.
//
// Plugin.Run owns the whole lifetime: it starts the gRPC server on a fresh
// socket in the device-plugin folder, then registers with the kubelet (serve
// first: since Kubernetes 1.25 the kubelet dials back inside Register), and
// registers again with a new socket whenever the kubelet restarts (kubelet.sock
// re-created), the plugin's own socket disappears, the kubelet ends
// ListAndWatch, or Reregister is called. In the background it publishes the
// node's GPU inventory, a heartbeat Lease and the hami.io/gpu.ready label to
// the API server; registration never waits on the API server.
//
// The bind → Allocate hand-off gives every container exactly its own pod's
// slice (docs/handoff.md). The scheduler extender writes the pod's
// allocation (vgpu.AnnotationPodAllocation) at bind; the plugin watches the
// node's pods with an informer. GetPreferredAllocation steers the kubelet to
// devices on the GPUs the scheduler chose. In mode cdi (the default)
// Allocate answers a CDI device named after the device IDs and a token
// of its own (checkpointed: a name never passes to the IDs' next holder),
// and PreStartContainer, called before every container start, asks the
// kubelet's PodResources API which container holds exactly those IDs and
// makes that container's CDI spec under that name hold its slice (Allocate
// has usually prepared it in the background, for the one container the
// kubelet could be admitting): HAMi-core's environment
// (CUDA_DEVICE_MEMORY_LIMIT_<i>, CUDA_DEVICE_SM_LIMIT, …), device nodes and,
// when configured, libvgpu.so with an ld.so.preload. In mode env, for
// runtimes without CDI, Allocate answers the environment itself for the
// pending container it matches, checkpoints that choice, and
// PreStartContainer refuses any start for another container. Refusals are
// errors the kubelet retries and Warning events on the pod. Stale specs are
// collected every minute.
//
// The GPU backend (NVML or fake GPUs) and the Kubernetes API (API: NewAPI,
// or package clientset over a client-go clientset) are injected through
// small interfaces, so tests run against the real kubelet device manager
// with fake GPUs. NewAPI knows only the core and coordination.k8s.io/v1
// types, so that the plugin's binary, and its resident memory, stay small. ProbeHandler serves the probes and the plugin's
// Prometheus metrics (registrations, GPU health, Allocate and
// PreStartContainer results; docs/metrics.md).
package deviceplugin
