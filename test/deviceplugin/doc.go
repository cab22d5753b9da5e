// Package deviceplugin holds gpuslice's device-plugin tests against real
// Kubernetes code: the kubelet's device manager from k8s.io/kubernetes
// v1.37.2 running in-process on a temporary folder, and a real
// kube-apiserver with etcd. The plugin runs its real gRPC server on fake GPUs
// (go-nvml mocks under gpuslice's NVML backend); the GPUs are the only fake.
package deviceplugin
