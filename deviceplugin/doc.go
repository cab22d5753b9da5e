// Package deviceplugin is gpuslice's node agent: it serves the kubelet
// device-plugin API (v1beta1) for one extended resource (hami.io/gpu by
// default), advertising SplitCount virtual devices per healthy physical GPU.
//
// Plugin.Run owns the whole lifetime: it starts the gRPC server on a fresh
// socket in the device-plugin folder, then registers with the kubelet (serve
// first: since Kubernetes 1.25 the kubelet dials back inside Register), and
// registers again with a new socket whenever the kubelet restarts (kubelet.sock
// re-created), the plugin's own socket disappears, the kubelet ends
// ListAndWatch, or Reregister is called. In the background it publishes the
// node's GPU inventory, a heartbeat Lease and the hami.io/gpu.ready label to
// the API server; registration never waits on the API server.
//
// The GPU backend (NVML or fake GPUs) and the Kubernetes client are injected
// through small interfaces, so tests run against the real kubelet device
// manager with fake GPUs.
package deviceplugin
