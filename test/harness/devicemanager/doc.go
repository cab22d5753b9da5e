// Package devicemanager runs the real kubelet device manager of k8s.io/kubernetes
// (pkg/kubelet/cm/devicemanager) in the test process, on a folder of the caller's choosing.
//
// What is real: the kubelet's registration gRPC server (kubelet.sock), its dial-back to the plugin
// during Register, the ListAndWatch stream, capacity and allocatable bookkeeping, Allocate,
// GetPreferredAllocation, PreStartContainer, the checkpoint file and the clean-up of every socket in
// the folder when a manager starts. A device plugin under test talks to it exactly as it would to a
// kubelet.
//
// ServePodResources adds the kubelet's own PodResources v1 server (with its rate limiter) over the
// manager's active pods and assigned devices, for plugins that look up which container holds a set
// of device IDs.
//
// What is not there: the container runtime and the rest of the kubelet. Pods are never admitted or
// started; a test says which pods are active by allocating for them, and reads what the runtime would
// be given (environment, mounts, devices, CDI devices) through GetDeviceRunContainerOptions. The
// topology manager is upstream's fake (no NUMA alignment) and the kubelet's config sources always
// report ready.
//
// A kubelet restart is Stop followed by Start of a new Manager on the same folder: the new manager
// deletes the sockets there and reloads the checkpoint, as the kubelet does.
package devicemanager
