// Package e2e holds gpuslice's end-to-end tests on a local cluster of real processes (package
// cluster): etcd, kube-apiserver, kube-scheduler and real kubelets of Kubernetes v1.37.2, with the
// real gpuslice-device-plugin binary on each node. Only NVML (the plugin's --fake-gpus) and the
// container runtime (a recording CRI fake) are fake.
//
// The tests need root and unshare(1), and the binaries of hack/build-cluster.sh; without them they
// skip, except with CI=true, where they fail.
package e2e
