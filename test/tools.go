//go:build tools

// This file keeps the Kubernetes commands that hack/build-cluster.sh builds in the module graph, so
// that go mod tidy leaves go.sum complete for them. It is never compiled into anything.

package test

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
