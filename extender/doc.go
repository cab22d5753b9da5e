// Package extender will hold gpuslice's scheduler extender: the HTTP
// filter/prioritize/bind endpoints a stock kube-scheduler calls to place pods
// that ask for hami.io resources on registered nodes and concrete GPUs. It is
// built in the scheduling milestone; the shared model it will call lives in
// package vgpu.
package extender
