// Package drascore keeps what the DRA informers say about gpuslice's DRA nodes and scores nodes
// for a pod whose ResourceClaims ask for the driver's devices (Config.DRA of the extender,
// docs/dra.md).
//
// kube-scheduler's own DRA allocator places the claims of pods on DRA-mode nodes, taking the
// first device of a node that fits and leaving the choice of node to CPU and memory scores. A
// State keeps each DRA node's GPUs (the devices of the driver's ResourceSlices, in the
// allocator's order) and what the allocated ResourceClaims consume of them, fed by the
// extender's informer handlers. State.Score places a pod's claims on each candidate node by the
// allocator's first fit (vgpu.PolicyFirstFit) and scores the nodes by vgpu.Score, as the
// device-plugin mode does; Rank maps the scores onto kube-scheduler's extender range.
//
// The package speaks no HTTP and holds no API client: the extender's POST /dra/prioritize
// decodes, calls Score and Rank, and encodes. The cluster state it needs besides its own (the
// workload and each node's free CPU and memory) it reads through a HostReader.
package drascore
