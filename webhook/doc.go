// Package webhook holds gpuslice's mutating admission webhook. Mutate is
// the whole decision, a pure function of a Pod and a Config: it steers pods
// that ask for hami.io resources to the gpuslice scheduler profile, fills
// defaults (hami.io/gpu: 1 beside memory or cores; hami.io/gpumem in MiB),
// and rejects invalid requests, forged allocation annotations, bad
// placement annotations and GPUs in regular init containers with a message
// that names the container, resource, value and rule. The decision is
// returned as an RFC 6902 patch that is idempotent: applying it and
// deciding again yields no operation.
//
// NewHandler is the thin AdmissionReview v1 layer over Mutate (decode,
// decide, encode), with health, readiness and Prometheus metrics routes
// (docs/metrics.md); Server serves it over TLS and takes in a renewed
// certificate without a restart. ServerConfig configures the binary,
// cmd/gpuslice-webhook. docs/webhook.md shows how to deploy it.
package webhook
