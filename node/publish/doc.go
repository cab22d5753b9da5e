// Package publish keeps the API server informed of a node agent's state, in
// the background, whichever mode the node runs in (the device plugin, or
// the DRA driver): the Node's vgpu.ConditionRegistered condition, the
// heartbeat Lease the extender and kubectl gpuslice read, and, for the
// device plugin, the inventory annotation and the ready and enforcement
// labels the extender schedules by. It writes only on change, never blocks
// its caller and retries with back-off. It knows nothing of the kubelet's
// APIs: a Source says what the agent's state is.
package publish
