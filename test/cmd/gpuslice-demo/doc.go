// Command gpuslice-demo starts and stops the local demo cluster of package cluster: real etcd,
// kube-apiserver, kube-scheduler and two real kubelets, each node with a real gpuslice-device-plugin
// on fake GPUs (8×A100-80GB; 4×T4-16GB + 2×L4-24GB) and a fake container runtime, so that nothing
// really runs in the pods. It needs root and the binaries of hack/build-cluster.sh. When make
// prometheus has installed Prometheus, a Prometheus scrapes the cluster as the chart's
// ServiceMonitors say, with the chart's alerts (package monitoring), and up prints its URL.
// The nodes and pods are package demo's.
//
//	gpuslice-demo up     start the cluster, create sample pods, print where they landed, kubectl gpuslice
//	                     status (with --cli-dir), the KUBECONFIG and the Prometheus URL
//	gpuslice-demo down   stop every process of the cluster and remove its folder
package main
