// Package vgpu is gpuslice's shared model: the resource names users write in
// pod specs, the physical GPUs a node reports, what a container asks for, what
// a pod is granted, and the annotation/label protocol that carries them
// between the device plugin, the scheduler extender and the webhook.
//
// The package is pure: it imports the standard library and the Kubernetes API
// types only, never NVML, gRPC, HTTP or client-go, so every component can call
// the same code and tests run without a cluster.
package vgpu
