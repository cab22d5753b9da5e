// Package retry keeps the bookkeeping behind the extender's retry requests:
// which pods Filter turned away from every node, for what, and which of the
// cluster changes since may cure that. A Tracker hears of the changes from
// the extender's cluster state and of the rejections from Filter, and its
// Due tells the extender's retry loop whom to ask kube-scheduler to try
// again; the loop itself, which writes to the API server, stays in the
// extender.
//
// The package holds no client and no lock of the cluster state. Its demand
// type is a parameter, so that it needs nothing of the state but a fits
// function judging a demand on a node, which Due's caller supplies under
// the state's read lock.
package retry
