// Package inspect is the logic of the gpuslice command's status, doctor and
// why subcommands. It reads the API server only — Nodes, heartbeat Leases,
// Pods, and for doctor the chart's objects — into a Snapshot, and judges it
// with the vgpu codecs and vgpu.Fit that the components use, so that what it
// reports is what the device plugin published and what the scheduler
// extender decides. It imports no component: the components never import
// each other, and neither does their operator's tool.
//
// Load reads a Snapshot; Status, Doctor and Why are pure functions of one,
// so the tests feed them fixed objects. The Render functions write the
// tables a person reads; -o json and -o yaml encode the same values.
package inspect
