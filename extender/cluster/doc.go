// Package cluster is the extender's picture of the cluster and its judge:
// what the informers said of Nodes, pods and heartbeat Leases, kept parsed
// and summarized per node (State), and the judging of one pod on one node,
// on many, or on the best of them (Judge, JudgeAll, JudgeBest), with the
// reservations of binds in progress (Reserve, Release).
//
// State's lock is private to this package: every method takes it itself,
// so no caller can hold it across a call back in, and the lock-order rules
// are written here once. Changes that may let a waiting pod fit are told
// to a ChangeListener, which must not call back into the State; code that
// judges many pods at once (the retry loop) does so inside Judging, which
// holds the read lock for it. The DRA scoring reads hosts through
// ReadHosts the same way.
//
// The package speaks no HTTP and holds no API client: the extender's
// adapter (package extender) turns kube-scheduler's calls into calls here,
// and gpuslice why judges a snapshot of the cluster through the same
// State, so that its reasons are the extender's.
package cluster
