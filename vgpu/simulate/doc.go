// Package simulate replays a GPU cluster trace through vgpu.Fit and
// vgpu.Score to measure packing quality, with the method of Weng et al.,
// "Beware of Fragmentation" (USENIX ATC '23): shuffle the tasks, append
// random copies until the GPU demand reaches Tune times the capacity, place
// tasks one by one and never remove them, and report the share of GPU
// capacity left unallocated when the arrived demand equals the capacity.
//
// It reads the CSV files of Alibaba's cluster-trace-gpu-v2023 (openb node
// and pod lists) from io.Readers and is pure: no files, no clock, no global
// state; results depend only on the inputs and the seed.
package simulate
