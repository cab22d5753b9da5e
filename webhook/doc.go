// Package webhook will hold gpuslice's mutating admission webhook: it steers
// pods that ask for hami.io resources to the gpuslice scheduler profile,
// fills defaults and rejects invalid requests with a clear message. It is
// built in the scheduling milestone on top of vgpu.RequestFromPod.
package webhook
