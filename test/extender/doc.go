// Package extender holds scheduler extender tests through a real
// kube-apiserver of k8s.io/kubernetes v1.37.2 (with etcd) running
// in-process (test/harness/apiserver). The extender reaches it through a
// proxy of the test's own, which can hold a request until the extender has
// given up on it and forward it later, so that a Binding is committed by the
// API server after its client saw it time out, as an API server that is slow
// to reach etcd does.
package extender
