// Package vgputest builds vgpu fixtures for tests in a few fluent lines:
//
//	node := vgputest.Node("n1").GPU("GPU-0", 81920).GPU("GPU-1", 81920).Obj()
//	pod := vgputest.Pod("p").Container("c").GPU(1).MemoryMiB(10240).Cores(30).Obj()
//	alloc := vgputest.Allocation("n1").Container("c").Slice("GPU-0", 10240, 30).Obj()
//
// Builders are not safe for concurrent use; Obj returns a value that shares
// nothing with the builder, so a builder may be reused as a template. Only
// tests import this package.
package vgputest
