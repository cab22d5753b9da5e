// Package handoff is what a GPU container gets for its slice on a node,
// whichever way the node agent learns the slice (the device plugin's
// PreStartContainer, or a DRA driver's NodePrepareResources): the
// environment HAMi-core and the NVIDIA runtime read (Builder.EditsFor),
// what the node's enforcement mechanism adds (ChooseEnforcement, the MPS
// control daemons), and the CDI spec that carries it to the runtime
// (BuildSpec, WriteSpec, RemoveStaleSpecs), written atomically. It knows
// nothing of the kubelet's APIs.
package handoff
