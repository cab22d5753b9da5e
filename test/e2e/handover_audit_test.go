package e2e

import (
	"fmt"
	"slices"
	"strings"
	"time"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/gpuslice/gpuslice/test/cluster"
)

// Kinds of the writes only the leading scheduler pair may make.
const (
	writeBind      = "bind"       // create pods/binding: answers a Bind call
	writeRetry     = "retry"      // patch of a pod: the retry annotation
	writeCondition = "condition"  // patch of nodes/status: the registration condition
	writeNodeEvent = "node event" // create of an event named after a node: the condition's event
)

// pairWrite is one write of a kind above that a scheduler pair's extender made, from the audit log.
type pairWrite struct {
	at     time.Time
	pair   int
	kind   string
	object string
	code   int32
}

func (w pairWrite) String() string {
	return fmt.Sprintf("%s pair %d %s %s (code %d)", w.at.Format("15:04:05.000"), w.pair, w.kind, w.object, w.code)
}

// term is a span of time during which one pair's kube-scheduler held the leader Lease: from its
// first write of the Lease after another pair's to the next pair's first write (the zero to: still
// holding).
type term struct {
	pair     int
	from, to time.Time
}

// String renders the term as "pair 0 12:00:01.650-12:00:15.903" (an open end: "on").
func (tm term) String() string {
	to := "on"
	if !tm.to.IsZero() {
		to = tm.to.Format("15:04:05.000")
	}
	return fmt.Sprintf("pair %d %s-%s", tm.pair, tm.from.Format("15:04:05.000"), to)
}

// contains reports whether t falls within the term.
func (tm term) contains(t time.Time) bool {
	return !t.Before(tm.from) && (tm.to.IsZero() || t.Before(tm.to))
}

// received is when the API server received the request of e.
func received(e auditv1.Event) time.Time { return e.RequestReceivedTimestamp.Time }

// leaderTerms reads from the audit log who held the scheduler's leader Lease when: a
// kube-scheduler writes the Lease (create, update) only while it holds it, every retryPeriod, and
// the first write of a pair after another's is its takeover.
func leaderTerms(events []auditv1.Event, pairs []cluster.SchedulerPair) []term {
	byUser := map[string]int{}
	for i, p := range pairs {
		byUser[p.KubeSchedulerUser] = i
	}
	var terms []term
	for _, e := range byReceipt(events) {
		ref := e.ObjectRef
		pair, ok := byUser[e.User.Username]
		if !ok || ref == nil || ref.Resource != "leases" || ref.Namespace != cluster.LeaderLeaseNamespace || ref.Name != cluster.LeaderLeaseName ||
			(e.Verb != "create" && e.Verb != "update") || e.ResponseStatus == nil || e.ResponseStatus.Code >= 300 {
			continue
		}
		if n := len(terms); n == 0 || terms[n-1].pair != pair {
			if n > 0 {
				terms[n-1].to = received(e)
			}
			terms = append(terms, term{pair: pair, from: received(e)})
		}
	}
	return terms
}

// pairWrites returns the writes of the kinds above by the extenders of pairs, in the order the API
// server received them; nodes are the node names, which a node event's name starts with.
func pairWrites(events []auditv1.Event, pairs []cluster.SchedulerPair, nodes []string) []pairWrite {
	byUser := map[string]int{}
	for i, p := range pairs {
		byUser[p.ExtenderUser] = i
	}
	var out []pairWrite
	for _, e := range byReceipt(events) {
		pair, ok := byUser[e.User.Username]
		ref := e.ObjectRef
		if !ok || ref == nil {
			continue
		}
		kind := ""
		switch {
		case ref.Resource == "pods" && ref.Subresource == "binding" && e.Verb == "create":
			kind = writeBind
		case ref.Resource == "pods" && ref.Subresource == "" && e.Verb == "patch":
			kind = writeRetry
		case ref.Resource == "nodes" && ref.Subresource == "status" && e.Verb == "patch":
			kind = writeCondition
		case ref.Resource == "events" && e.Verb == "create" && slices.ContainsFunc(nodes, func(n string) bool { return strings.HasPrefix(ref.Name, n+".") }):
			kind = writeNodeEvent
		default:
			continue
		}
		w := pairWrite{at: received(e), pair: pair, kind: kind, object: ref.Namespace + "/" + ref.Name}
		if e.ResponseStatus != nil {
			w.code = e.ResponseStatus.Code
		}
		out = append(out, w)
	}
	return out
}

// outsideTerms returns the writes made while the writer's pair did not lead.
func outsideTerms(writes []pairWrite, terms []term) []pairWrite {
	var out []pairWrite
	for _, w := range writes {
		if !slices.ContainsFunc(terms, func(tm term) bool { return tm.pair == w.pair && tm.contains(w.at) }) {
			out = append(out, w)
		}
	}
	return out
}

// byReceipt returns events sorted by when the API server received each request (the log holds
// them in the order they completed).
func byReceipt(events []auditv1.Event) []auditv1.Event {
	out := slices.Clone(events)
	slices.SortStableFunc(out, func(a, b auditv1.Event) int { return received(a).Compare(received(b)) })
	return out
}
