// Package webhook holds gpuslice's webhook tests through a real
// kube-apiserver of k8s.io/kubernetes v1.37.2 (with etcd) running
// in-process: the webhook's real HTTPS server runs on loopback with a
// certificate minted by the test, a MutatingWebhookConfiguration points the
// API server at it, and pods are created through the API server, so
// defaulting, the JSON patch application, denial messages and the TLS
// handshake with the caBundle are all the API server's own.
package webhook
