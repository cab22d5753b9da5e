// Package extender is gpuslice's scheduler extender: the HTTP filter,
// prioritize and bind endpoints a stock kube-scheduler (profile
// gpuslice-scheduler, nodeCacheCapable) calls to place pods that ask for
// hami.io resources on nodes whose device plugin is serving, and on
// concrete GPUs.
//
// A Scheduler keeps the cluster's GPU state from informers only (Nodes,
// Pods, and the device plugins' heartbeat Leases): per node the parsed
// inventory, ready label, allocatable GPUs and heartbeat, and a
// vgpu.NodeUsage updated incrementally as pods are bound, reserved and
// deleted. Filter and Prioritize read that state under a read lock and
// call vgpu.Fit and vgpu.Score; they make no API call. Bind re-checks the
// fit under a per-node lock, reserves the GPUs in memory, writes the
// allocation annotation and posts the Binding, undoing both on failure.
// Everything is rebuilt from annotations on restart.
//
// The HTTP layer (Handler, Serve, Run) only decodes, calls one Scheduler
// method and encodes; it also serves Prometheus metrics, whose per-GPU
// gauges are computed from the same state at scrape time (docs/metrics.md).
// docs/extender.md describes the endpoints, flags and the kube-scheduler
// configuration.
package extender
