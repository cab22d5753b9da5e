// Package apiserver runs a real kube-apiserver of k8s.io/kubernetes, with a real etcd, in the test
// process, listening on loopback only.
//
// What is real: etcd (go.etcd.io/etcd/server/v3/embed, fsync off), and the kube-apiserver built
// from its own flags and options exactly as the binary builds them (cmd/kube-apiserver/app):
// storage, validation, defaulting, admission, RBAC and Node authorization, watch, the aggregator and
// apiextensions servers, and its post-start hooks (bootstrap RBAC roles, priority and fairness,
// system namespaces).
//
// What is not there: no controller-manager, scheduler or kubelet run. Nothing creates service
// account tokens or default service accounts (the ServiceAccount admission plugin is off so that
// pods can be created), nothing removes the node.kubernetes.io/not-ready taint that admission puts
// on every new Node, and the endpoint reconciler is off (--endpoint-reconciler-type=none).
//
// A Server's folder (Options.Dir) holds etcd's data, the serving certificates, the
// service-account key and the admin token. Starting a new Server on the folder of a stopped one is
// a control-plane restart: objects, certificates and credentials survive, so a kubeconfig written
// before the restart still works.
package apiserver
