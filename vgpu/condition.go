package vgpu

import (
	corev1 "k8s.io/api/core/v1"
)

// ConditionRegistered is the Node condition that says whether the node's
// device plugin is registered with the kubelet and advertises healthy GPUs.
// The device plugin writes it (status True or False) whenever its state
// changes; the extender's leader turns it Unknown when the plugin's
// heartbeat goes stale and False when allocatable hami.io/gpu stays 0,
// since a dead plugin cannot speak for itself. Its reason is one of the
// Reason constants below; readers (kubectl describe, gpuslice doctor)
// show the message as the cause.
const ConditionRegistered corev1.NodeConditionType = "GPUSliceRegistered"

// Reasons of ConditionRegistered. The device plugin sets the first five
// and ReasonPluginStopped; the extender sets ReasonHeartbeatStale and
// ReasonNoAllocatableGPUs.
const (
	// ReasonRegistered (True): the kubelet accepted the plugin's
	// registration and at least one advertised GPU is healthy.
	ReasonRegistered = "Registered"
	// ReasonKubeletSocketMissing (False): the device-plugin folder has no
	// kubelet.sock; the kubelet is down or the plugin watches the wrong
	// folder.
	ReasonKubeletSocketMissing = "KubeletSocketMissing"
	// ReasonRegisterFailed (False): the kubelet refused or timed out the
	// Register call; the message carries the kubelet's error text.
	ReasonRegisterFailed = "RegisterFailed"
	// ReasonNoHealthyGPUs (False): registered, but every advertised GPU is
	// unhealthy (or none is advertised), so allocatable is 0.
	ReasonNoHealthyGPUs = "NoHealthyGPUs"
	// ReasonDriverNotFound (False): the plugin could not load the NVIDIA
	// driver's NVML library and exited.
	ReasonDriverNotFound = "DriverNotFound"
	// ReasonPluginStopped (False): the plugin stopped cleanly (SIGTERM,
	// e.g. a DaemonSet rollout); its successor writes the condition anew.
	ReasonPluginStopped = "PluginStopped"
	// ReasonHeartbeatStale (Unknown): the plugin's heartbeat Lease was not
	// renewed within the extender's heartbeatMaxAge.
	ReasonHeartbeatStale = "HeartbeatStale"
	// ReasonNoAllocatableGPUs (False): the condition said Registered, but
	// the Node's allocatable hami.io/gpu stayed 0 for heartbeatMaxAge.
	ReasonNoAllocatableGPUs = "NoAllocatableGPUs"
)

// RegisteredCondition returns node's ConditionRegistered, or false when
// the node has none (no gpuslice device plugin ever ran there).
func RegisteredCondition(node *corev1.Node) (corev1.NodeCondition, bool) {
	for _, c := range node.Status.Conditions {
		if c.Type == ConditionRegistered {
			return c, true
		}
	}
	return corev1.NodeCondition{}, false
}
