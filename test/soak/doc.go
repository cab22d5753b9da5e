// Package soak is gpuslice's chaos soak: for a set time, on a local cluster of real processes
// (package cluster: three nodes of mixed fake GPUs, the fake CRI runtime), a driver keeps
// creating and deleting GPU pods of random sizes, some that never fit, while a chaos loop kills
// and restarts the kubelets, the device plugins (SIGKILL and SIGTERM), either scheduler pair's
// extender or kube-scheduler, the webhook and the API server, injects XIDs into the running
// fake GPUs and resets them (through each plugin's faults folder, --fake-gpu-faults-dir), makes
// the API server slow to write for the extenders (the cluster's API proxy holds each write for
// 2-8 s during 5-15 s, so that binds time out and commit after the extender gave up on them),
// and hands the leadership over (both processes of the leading pair ended, the time until the
// other pair's kube-scheduler holds the Lease measured, the pair started again). The cluster runs
// two scheduler pairs with leader election, as the chart does.
//
// Invariants are checked all along, every violation printed with the objects involved:
//   - capacity: no GPU's slices exceed its schedulable memory, its split count or its compute;
//   - exactness: every container the fake runtime created got its own pod's allocation (pod
//     identity, GPUs and memory limits in its environment, as the runtime resolved the CDI
//     devices), on the node of that allocation (a container the kubelet starts with no slice
//     at all for a pod already being deleted is counted apart: the kubelet hands such a pod's
//     devices to another pod and starts the container without any);
//   - explained: no pod stays Pending for a minute without an event saying why (a minute from
//     its creation while unbound, from its binding once bound);
//   - no leaked CDI spec: a plugin spec file that no live container uses is removed within the
//     plugin's collection period.
//
// When the chaos stops, every GPU is reset and, within 60 s, every pod that fits (vgpu.Fit over
// the pods running) must be Running; then every pod is deleted, the extender must count nothing
// held (no leaked reservation) once its informer has caught up (within 75 s: client-go's
// reflector backs off for up to 60 s after repeated API server restarts), and the freed
// cluster must take a full set of slices again, all Running within 60 s. Run prints a summary
// (pods created, deleted and running, faults by kind, hand-over times, writes held,
// violations); any violation fails the test. Pods that a kubelet refuses at admission while its
// device plugin is down (Kubernetes does that, FIELD.md §1) are counted, not violations, and are
// deleted as a controller would replace them.
package soak
