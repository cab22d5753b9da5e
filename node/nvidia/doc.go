// Package nvidia is the device plugin's GPU backend: it lists a node's
// physical GPUs and watches their health through NVML. It is the only
// package of gpuslice that imports go-nvml.
//
// A Backend (Open) speaks vgpu types to the plugin through two methods, GPUs
// and WatchHealth. Below it sits any nvml.Interface: the real library
// (nvml.New, the default) or a Fake built from a --fake-gpus spec
// (NewFake), which runs the very same code above the interface, so every
// path of the backend is tested without a GPU.
//
// Health comes from NVML XID events. ClassifyXID splits XIDs into
// application faults, which leave a GPU healthy, and device faults, which
// mark it unhealthy. Unlike NVIDIA's own plugin and its peers, an unhealthy
// GPU is not written off: after Options.CoolDown it is probed again and
// returns to healthy once NVML answers for it normally.
//
// NVML must not be touched after a failed Init (the process dies on an
// unresolved symbol), so Open returns at once when Init fails: ErrNoDriver
// when no driver is installed. Close shuts NVML down only after every
// WatchHealth call has returned.
package nvidia
