// Package webhook holds gpuslice's mutating admission webhook logic. Mutate
// is the whole decision, a pure function of a Pod and a Config: it steers
// pods that ask for hami.io resources to the gpuslice scheduler profile,
// fills defaults (hami.io/gpu: 1 beside memory or cores; hami.io/gpumem in
// MiB), and rejects invalid requests, forged allocation annotations, bad
// placement annotations and GPUs in regular init containers with a message
// that names the container, resource, value and rule. The decision is
// returned as an RFC 6902 patch that is idempotent: applying it and
// deciding again yields no operation. The AdmissionReview v1 HTTP handler
// and its TLS server, not written yet, are to be thin layers over Mutate.
package webhook
