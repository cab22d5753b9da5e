package devicemanager

import (
	_ "unsafe" // for go:linkname

	cadvisorapi "github.com/google/cadvisor/lib/model"
	"k8s.io/klog/v2"
	kubeletdevicemanager "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

// newManagerImpl is the unexported constructor behind kubeletdevicemanager.NewManagerImpl, which
// always uses the kubelet's own socket path (/var/lib/kubelet/device-plugins/kubelet.sock). It
// takes the socket path as an argument and keeps the checkpoint in that socket's folder.
//
// The signature must match k8s.io/kubernetes v1.37.2 exactly: the linker does not check it, and
// a mismatch corrupts memory instead of failing the build. The smoke test in this package calls it.
//
//go:linkname newManagerImpl k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newManagerImpl(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*kubeletdevicemanager.ManagerImpl, error)
