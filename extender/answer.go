package extender

import (
	"sync"

	corev1 "k8s.io/api/core/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
)

// filterAnswer is Filter's answer for one pod as slices in the order of
// the candidates, from a pool: the HTTP codec writes it as JSON
// (appendFilterAnswer) and Filter turns it into an ExtenderFilterResult
// (result). One goroutine owns it from newFilterAnswer to release.
type filterAnswer struct {
	// names are the candidates the answer is about (candidates).
	names []string
	// passed are the indices in names of the nodes that passed.
	passed []int
	// failed and unresolvable are the nodes of FailedNodes and of
	// FailedAndUnresolvableNodes with their messages, in the order of
	// names; a name may come twice when kube-scheduler sent it twice.
	failed, unresolvable []failedNode
	// err, when set, is the Error of a pod that cannot be placed: then no
	// node passed or failed, and the answer has neither NodeNames nor
	// Nodes.
	err string
}

// failedNode is one node turned away, by its index in the candidates, and
// the message for the pod's FailedScheduling event.
type failedNode struct {
	node    int
	message string
}

// filterAnswerPool holds filterAnswers between calls: at thousands of
// nodes their slices are most of what Filter's answer costs.
var filterAnswerPool = sync.Pool{New: func() any { return new(filterAnswer) }}

// newFilterAnswer returns an empty answer about names from the pool.
func newFilterAnswer(names []string) *filterAnswer {
	a := filterAnswerPool.Get().(*filterAnswer)
	a.names = names
	return a
}

// release empties a and puts it back in the pool; a must not be used
// afterwards.
func (a *filterAnswer) release() {
	clear(a.failed)
	clear(a.unresolvable)
	*a = filterAnswer{passed: a.passed[:0], failed: a.failed[:0], unresolvable: a.unresolvable[:0]}
	filterAnswerPool.Put(a)
}

// result is a as the ExtenderFilterResult kube-scheduler reads, in the
// form of args: NodeNames when args has NodeNames, else Nodes with the
// passing items of args.Nodes. A name given twice is in FailedNodes (or
// FailedAndUnresolvableNodes) once, with the message of the later.
func (a *filterAnswer) result(args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	if a.err != "" {
		return &extenderv1.ExtenderFilterResult{
			FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}, Error: a.err,
		}
	}
	result := &extenderv1.ExtenderFilterResult{
		FailedNodes:                make(extenderv1.FailedNodesMap, len(a.failed)),
		FailedAndUnresolvableNodes: make(extenderv1.FailedNodesMap, len(a.unresolvable)),
	}
	for _, f := range a.failed {
		result.FailedNodes[a.names[f.node]] = f.message
	}
	for _, f := range a.unresolvable {
		result.FailedAndUnresolvableNodes[a.names[f.node]] = f.message
	}
	if args.NodeNames != nil {
		passed := make([]string, len(a.passed))
		for j, i := range a.passed {
			passed[j] = a.names[i]
		}
		result.NodeNames = &passed
		return result
	}
	items := make([]corev1.Node, len(a.passed))
	for j, i := range a.passed {
		items[j] = args.Nodes.Items[i]
	}
	result.Nodes = &corev1.NodeList{Items: items}
	return result
}
