// Package fakecri is the container runtime of the local test cluster: the CRI fake of
// k8s.io/cri-client/pkg/fake (sandboxes and containers are in-memory records, nothing runs, no image
// is pulled) served on a unix socket, with one addition: every CreateContainer call is appended as
// one JSON line (a Record) to a file, so that a test can assert what a real runtime would have been
// asked to give the container — its environment, mounts, device nodes and CDI devices, as the real
// kubelet computed them from the device plugin's Allocate response.
//
// Real: the CRI gRPC protocol and every request the kubelet sends. Fake: everything the runtime
// would do with them.
package fakecri
