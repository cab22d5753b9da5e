// Package scale measures gpuslice at cluster scale on real components: etcd, kube-apiserver and
// kube-scheduler built from Kubernetes v1.37.2, and the gpuslice extender and webhook built from
// this tree, each its own process as package cluster runs them. kube-scheduler runs the gpuslice
// profile the Helm chart renders (helm template of charts/gpuslice) beside the stock
// default-scheduler profile, and the extender runs with the chart's extender configuration.
//
// The only fakes are the nodes. A hollow node is a Node object written through the API server
// with what a kubelet and the gpuslice device plugin would publish: capacity and allocatable
// (cpu, memory, pods and hami.io/gpu = splitCount × GPUs), a Ready condition, no not-ready
// taint, the GPU inventory annotation and ready label, and a heartbeat Lease renewed as often as
// the plugin renews it, all written with the vgpu codecs the plugin uses. No kubelet runs, so
// pods are measured to bound (spec.nodeName set), as kube-scheduler's scheduler_perf measures.
//
// A Harness starts such a cluster (Start), runs phases of pods through it (RunPhase: create
// them, wait until each is bound or the phase's deadline passes, watched by one informer) and
// reads what the components report about a phase: the extender's request-duration histogram,
// the API server's request counters and the processes' resident memory. Check verifies what
// the extender granted: every bound GPU pod carries an allocation, and no GPU holds more memory,
// compute or slices than its inventory offers. Figures are printed, never compared with a
// wall-clock target; only correctness fails a test.
//
// Replay places the FGD trace (Alibaba's cluster-trace-gpu-v2023) through the same path, one
// pod at a time, and compares the share of GPU capacity left unallocated with vgpu/simulate's
// replay of the same seed and policy.
package scale
