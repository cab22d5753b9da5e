// Package extender is gpuslice's scheduler extender: the HTTP filter,
// prioritize and bind endpoints a stock kube-scheduler (profile
// gpuslice-scheduler, nodeCacheCapable) calls to place pods that ask for
// hami.io resources on nodes whose device plugin is serving, and on
// concrete GPUs.
//
// A Scheduler keeps the cluster's GPU state from informers only (Nodes,
// Pods, and the device plugins' labelled heartbeat Leases): per node the
// parsed inventory, ready label, allocatable GPUs and heartbeat, a
// vgpu.NodeUsage updated incrementally as pods are bound, reserved and
// deleted, and a vgpu.NodeSummary rebuilt whenever the node changes.
// Filter and Prioritize read that state under a read lock and make no API
// call: a node is turned away from its summary alone when it is full, else
// judged by NodeSummary.Fit and vgpu.Score, and the verdict is remembered
// per pod shape until the node changes, so Prioritize reuses Filter's and
// a burst of alike pods judges each node once per change. Nothing is
// answered before the informers synced. Bind re-checks the fit under a
// per-node lock, reserves the GPUs in memory and posts one Binding that
// carries the allocation annotation; binds beyond Config.MaxPendingBinds
// are refused at once. A change on a node (ready, inventory, usage freed)
// asks kube-scheduler to retry only the pods that node turned away for a
// reason that change can cure and that fit there now. Everything is
// rebuilt from the API objects on restart.
//
// The state and its judging live in extender/cluster, behind a lock only
// that package takes; the bookkeeping of pods waiting for a change in
// extender/retry; the DRA scoring in extender/drascore. This package is
// the adapter: the verbs, HTTP, the API client, metrics and the background
// loops (docs/architecture.md maps which file answers which call).
//
// The HTTP layer (Handler, Serve, Run) only decodes, calls one Scheduler
// method and encodes; it also serves Prometheus metrics, whose per-GPU
// gauges are computed from the same state at scrape time (docs/metrics.md).
// docs/extender.md describes the endpoints, flags and the kube-scheduler
// configuration.
package extender
