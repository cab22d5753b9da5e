package deviceplugin

import (
	"hash/fnv"
	"sync"

	"github.com/gpuslice/gpuslice/node/handoff"
)

// specLocks orders the writes of the spec file of one set of device IDs
// (the spec prepared at Allocate and those of the container's starts). It
// is a fixed set of mutexes, one per hash of the IDs' key, so writes for
// different IDs seldom wait for each other and nothing is kept per set.
type specLocks [32]sync.Mutex

// lock locks key's mutex and returns its unlock.
func (l *specLocks) lock(key string) func() {
	h := fnv.New32a()
	_, _ = h.Write([]byte(key)) // never fails
	m := &l[h.Sum32()%uint32(len(l))]
	m.Lock()
	return m.Unlock
}

// prepare writes, in the background, the spec of CDI device name (the
// holding of device) for c: the container GetPreferredAllocation offered
// the devices to as the only pending container of the pods the kubelet
// listed, so the one the kubelet was admitting. A container runtime that
// resolves CDI devices from a cache refreshed on folder changes
// (containerd 2.x) then has the whole time from admission to the
// container's creation to read it, instead of the moment between
// PreStartContainer and CreateContainer; a spec it has not read fails the
// start (unresolvable CDI device), and the kubelet retries it after up to
// 10 s.
//
// The checkpoint records c as the spec's container (holding.For) before the
// spec is written, so a restarted plugin knows the spec under that name is
// c's. A start of another container with these devices (the view lagged
// the kubelet) rewrites the spec for that container and is refused until
// the runtime has had time to read the rewrite (allocator.prepared,
// settled): it may have read c's edits under that name. The spec is left
// to the container's start when the checkpoint
// cannot be written, when device has another holder by then, or when a
// start already took the name over.
func (a *allocator) prepare(device, name string, c pendingContainer) {
	a.preparing.Add(1)
	go func() {
		defer a.preparing.Done()
		if err := a.claims.saved(); err != nil {
			a.logger.Error(err, "Not preparing the CDI spec at Allocate: the checkpoint that names its container was not written; its start writes it", "cdiDevice", name, "container", c.Ref)
			return
		}
		edits, err := a.editsFor(c.Pod, c.Alloc)
		if err != nil {
			a.logger.V(2).Info("Not preparing the CDI spec at Allocate; its start decides", "cdiDevice", name, "container", c.Ref, "err", err.Error())
			return
		}
		spec, err := handoff.BuildSpec(name, edits)
		if err != nil {
			a.logger.Error(err, "Not preparing the CDI spec at Allocate; its start writes it", "cdiDevice", name, "container", c.Ref)
			return
		}
		unlock := a.specLocks.lock(device)
		defer unlock()
		if h, ok := a.claims.holding(device); !ok || h.Name != name || !h.For.is(c.Ref, c.Pod.UID) {
			return
		}
		written, err := handoff.UpdateSpecFile(a.cfg.CDISpecDir, a.specFile(device, name), spec)
		if err != nil {
			a.logger.Error(err, "Preparing the CDI spec at Allocate; its start writes it", "cdiDevice", name, "container", c.Ref)
			return
		}
		if written {
			a.metrics.specWritten(CallAllocate)
			a.logger.V(2).Info("Prepared CDI spec", "container", c.Ref, "podUID", c.Pod.UID, "cdiDevice", handoff.CDIQualifiedName(name))
		}
	}()
}

// specFile is the file of the spec of CDI device name, the holding of the
// IDs whose key is key, in the spec folder: the key's own file
// (handoff.SpecFileName(key)), which each holder of the IDs rewrites with
// its own device. The folder then holds one file per set of IDs in use,
// not one per container since the last collection: a runtime that watches
// the folder (containerd 2.x) reads every file again at each change, which
// took 22 ms with 300 files against 1.6 ms with 16 on an idle core, and
// the churn of the sixty-pod test left about 300 files per node. A holder
// named by the release before, which wrote the holder's own file, keeps
// that file: a second file that defined the same device would make the
// runtime refuse both.
func (a *allocator) specFile(key, name string) string {
	if name != key && handoff.SpecExists(a.cfg.CDISpecDir, name) {
		return handoff.SpecFileName(name)
	}
	return handoff.SpecFileName(key)
}

// drain waits for the specs being prepared.
func (a *allocator) drain() {
	a.preparing.Wait()
}
