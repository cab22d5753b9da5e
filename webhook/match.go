package webhook

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// MatchConditionName names the webhook's one match condition; the API
// server quotes it when the expression cannot be evaluated.
const MatchConditionName = "gpuslice-pods-only"

// MatchExpression is the CEL expression of the webhook's match condition:
// true for a pod that carries an annotation with the hami.io/ prefix, or
// whose containers or init containers ask for a hami.io/ resource in limits
// or requests. Every pod Mutate acts on matches (it denies a forged
// allocation annotation on any pod), so the API server calls the webhook for
// these pods only and every other pod is created without waiting on it, even
// while the webhook is down. The chart writes the same text (charts/gpuslice, checked by
// test/chart).
const MatchExpression = `(has(object.metadata.annotations) &&
  object.metadata.annotations.exists(k, k.startsWith('hami.io/'))) ||
object.spec.containers.exists(c, has(c.resources) && (
  (has(c.resources.limits) && c.resources.limits.exists(r, r.startsWith('hami.io/'))) ||
  (has(c.resources.requests) && c.resources.requests.exists(r, r.startsWith('hami.io/'))))) ||
(has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) && (
  (has(c.resources.limits) && c.resources.limits.exists(r, r.startsWith('hami.io/'))) ||
  (has(c.resources.requests) && c.resources.requests.exists(r, r.startsWith('hami.io/'))))))`

// MatchConditions returns the matchConditions of the webhook's entry in a
// MutatingWebhookConfiguration (admissionregistration.k8s.io/v1, GA since
// Kubernetes 1.30): the API server evaluates them before calling the
// webhook. Each call returns a new slice.
func MatchConditions() []admissionregistrationv1.MatchCondition {
	return []admissionregistrationv1.MatchCondition{{Name: MatchConditionName, Expression: MatchExpression}}
}

// HAMiCompatMatchExpression is MatchExpression for Config.HAMiCompat: it
// also matches pods with an nvidia.com/ annotation or resource and HAMi's
// hami.io/ policy annotations (already matched by the hami.io/ prefix), so
// that the webhook sees the HAMi names it rewrites. The chart writes it when
// webhook.hamiCompat is on (checked by test/chart).
const HAMiCompatMatchExpression = `(has(object.metadata.annotations) &&
  object.metadata.annotations.exists(k, k.startsWith('hami.io/') || k.startsWith('nvidia.com/'))) ||
object.spec.containers.exists(c, has(c.resources) && (
  (has(c.resources.limits) && c.resources.limits.exists(r, r.startsWith('hami.io/') || r.startsWith('nvidia.com/'))) ||
  (has(c.resources.requests) && c.resources.requests.exists(r, r.startsWith('hami.io/') || r.startsWith('nvidia.com/'))))) ||
(has(object.spec.initContainers) && object.spec.initContainers.exists(c, has(c.resources) && (
  (has(c.resources.limits) && c.resources.limits.exists(r, r.startsWith('hami.io/') || r.startsWith('nvidia.com/'))) ||
  (has(c.resources.requests) && c.resources.requests.exists(r, r.startsWith('hami.io/') || r.startsWith('nvidia.com/'))))))`

// HAMiCompatMatchConditions is MatchConditions with
// HAMiCompatMatchExpression. Each call returns a new slice.
func HAMiCompatMatchConditions() []admissionregistrationv1.MatchCondition {
	return []admissionregistrationv1.MatchCondition{{Name: MatchConditionName, Expression: HAMiCompatMatchExpression}}
}

// ClaimsMatchClause is what Config.DRA.SteerClaims adds to the match
// condition, or-ed after it: pods with resource claims of their own, which
// the webhook then steers to the gpuslice profile. The chart writes it when
// dra.webhook.steerClaims is on (checked by test/chart).
const ClaimsMatchClause = `(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)`

// WithClaims returns conds with ClaimsMatchClause or-ed into each
// expression, for Config.DRA.SteerClaims. conds is not modified.
func WithClaims(conds []admissionregistrationv1.MatchCondition) []admissionregistrationv1.MatchCondition {
	out := make([]admissionregistrationv1.MatchCondition, len(conds))
	for i, c := range conds {
		out[i] = admissionregistrationv1.MatchCondition{Name: c.Name, Expression: c.Expression + " ||\n" + ClaimsMatchClause}
	}
	return out
}
