// Package cluster runs a local Kubernetes cluster on one machine out of real processes, for gpuslice's
// end-to-end tests and its demo: etcd, kube-apiserver and kube-scheduler built from the Go modules of
// Kubernetes v1.37.2 (hack/build-cluster.sh), and simulated GPU nodes.
//
// Each simulated node is one real kubelet, run as root inside its own mount namespace (unshare -m)
// with a node folder bind-mounted over /var/lib and /var/log, so that /var/lib/kubelet — and the
// hard-wired /var/lib/kubelet/device-plugins — are the node's own; the kubelet talks to a fake
// container runtime (gpuslice-fake-cri: nothing runs, every CreateContainer is recorded) and to one
// real gpuslice-device-plugin started with fake GPUs (--fake-gpus). The plugin runs outside the
// namespace and is pointed at the host path of the node's device-plugin folder: a unix socket is
// one inode, reached by either path, so the kubelet dials the plugin's socket and the plugin dials
// kubelet.sock as on a real node, and the plugin outlives kubelet restarts as a DaemonSet pod does.
//
// With Options.Runtime the nodes run real containers instead: containerd (its CRI plugin resolving
// the plugin's CDI specs) and runc, in a mount namespace of the node's own where the node's folders
// cover /var/lib, /var/log and /run, and which the kubelet joins; images come from OCI archives
// (package image), never from a registry. With a chart, every workload of the chart then runs as
// containers of its images: the device plugin as the DaemonSet's pod on each node, the scheduler
// (kube-scheduler and the extender) and the webhook as one pod of each Deployment on a node
// (RuntimeOptions, startChartPluginPod, startChartControlPlanePods).
//
// Real: every Kubernetes component and the device plugin, their flags, gRPC and HTTP protocols.
// Fake: NVML (fake GPUs inside the plugin) and, unless Options.Runtime, the container runtime. No controller-manager runs,
// so the cluster removes the node.kubernetes.io/not-ready taint itself once a node is Ready.
//
// Every component is a separate process in its own process group, with an empty working folder
// (the kubelet's log clean-up deletes files in its working directory), loopback ports, and a log
// file. A JSON state file records PIDs, ports and folders, so that another process (the demo's
// "down") can stop everything by PID and remove the folders. Waits poll with deadlines; nothing
// sleeps to synchronise.
package cluster
