package deviceplugin

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpuslice/gpuslice/node/handoff"
)

// checkpointFileName is the plugin's checkpoint in the state folder.
const (
	checkpointFileName = "claims.json"
	checkpointVersion  = 1
)

// claim ties a set of device IDs to the container the plugin meant them
// for. GetPreferredAllocation makes offers (in memory, both modes): the
// container it steered the kubelet for. Env-mode Allocate makes bindings
// (checkpointed): the container whose environment it answered with, which
// PreStartContainer verifies on every start. Mode-cdi Allocate makes
// holdings (checkpointed too): the CDI device name of the container it
// answered.
type claim struct {
	// Device is the CDI device name of DeviceIDs (handoff.DeviceName), the key.
	Device    string       `json:"device"`
	DeviceIDs []string     `json:"deviceIDs"`
	Ref       containerRef `json:"container"`
	PodUID    types.UID    `json:"podUID"`
	At        time.Time    `json:"at"`
	// Sole (offers only, not checkpointed) says Ref's was the only pending
	// container of the pods the kubelet listed when the offer was made:
	// the kubelet was admitting it, so Allocate may prepare its CDI spec.
	Sole bool `json:"-"`
}

// holding is the CDI device name mode-cdi Allocate gave the container it
// answered for a set of device IDs (handoff.HolderName), which every
// PreStartContainer of that container writes the spec of.
type holding struct {
	// Device is the key of DeviceIDs (handoff.DeviceName), the map key.
	Device    string    `json:"device"`
	DeviceIDs []string  `json:"deviceIDs"`
	Name      string    `json:"cdiDevice"`
	At        time.Time `json:"at"`
	// For is the container whose spec Allocate prepared under Name (see
	// allocator.prepare); nil when none was, and PreStartContainer writes it.
	For *specOwner `json:"preparedFor,omitempty"`
}

// specOwner is the container a prepared CDI spec is for.
type specOwner struct {
	Ref    containerRef `json:"container"`
	PodUID types.UID    `json:"podUID"`
	// Rewritten is when a start rewrote the spec for this container after
	// it had been written for another one (allocator.prepared); zero when
	// it never defined another container's edits. The container's starts
	// wait until the runtime has had SpecSettle to read it again.
	Rewritten time.Time `json:"rewritten,omitzero"`
}

// is reports whether o names container ref of pod uid.
func (o *specOwner) is(ref containerRef, uid types.UID) bool {
	return o != nil && o.Ref == ref && o.PodUID == uid
}

// checkpoint is the checkpoint file's content. Holdings were added after
// version 1 without a new version: a release that knows none ignores them.
type checkpoint struct {
	Version  int       `json:"version"`
	Bindings []claim   `json:"bindings"`
	Holdings []holding `json:"holdings,omitempty"`
}

// claimStore holds offers, bindings and holdings; safe for concurrent use.
type claimStore struct {
	path string // checkpoint file; "" keeps bindings and holdings in memory only
	// logger reports the background checkpoint writes that fail.
	logger klog.Logger

	// fileMu orders the checkpoint writes. A write encodes the store
	// after taking it, so the file always ends with the latest state.
	fileMu sync.Mutex

	mu       sync.Mutex
	offers   map[string]claim   // by Device
	bindings map[string]claim   // by Device
	holdings map[string]holding // by Device
	// missing is when gc first found a bound or held Device that no
	// container holds, since the last time one did.
	missing map[string]time.Time
	// dirty: a holding changed after the last write encoded the store;
	// flushing: a background write (flushLoop) runs.
	dirty, flushing bool
}

// newClaimStore returns an empty store that checkpoints bindings and
// holdings to path ("" for none).
func newClaimStore(path string) *claimStore {
	return &claimStore{path: path, offers: map[string]claim{}, bindings: map[string]claim{}, holdings: map[string]holding{}, missing: map[string]time.Time{}}
}

// loadClaimStore reads the checkpoint at path. A missing file gives an
// empty store. An unreadable or malformed file also gives an empty store
// (so the plugin still starts; PreStartContainer then refuses the
// containers it cannot verify) together with an error naming the file.
func loadClaimStore(path string) (*claimStore, error) {
	s := newClaimStore(path)
	data, err := os.ReadFile(path) //nolint:gosec // G304: the plugin's own checkpoint.
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("read checkpoint: %w", err)
	}
	var cp checkpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		return s, fmt.Errorf("checkpoint %s is malformed: %w", path, err)
	}
	if cp.Version != checkpointVersion {
		return s, fmt.Errorf("checkpoint %s has version %d, want %d", path, cp.Version, checkpointVersion)
	}
	for i, c := range cp.Bindings {
		if c.Device == "" || c.Device != handoff.DeviceName(c.DeviceIDs) {
			return newClaimStore(path), fmt.Errorf("checkpoint %s: bindings[%d].device=%q does not match its deviceIDs %v", path, i, c.Device, c.DeviceIDs)
		}
		s.bindings[c.Device] = c
	}
	for i, h := range cp.Holdings {
		if h.Device == "" || h.Device != handoff.DeviceName(h.DeviceIDs) || !handoff.IsHolderName(h.Name, h.Device) {
			return newClaimStore(path), fmt.Errorf("checkpoint %s: holdings[%d] (device %q, cdiDevice %q) does not match its deviceIDs %v", path, i, h.Device, h.Name, h.DeviceIDs)
		}
		if o := h.For; o != nil && (o.Ref.Namespace == "" || o.Ref.Pod == "" || o.Ref.Container == "" || o.PodUID == "") {
			return newClaimStore(path), fmt.Errorf("checkpoint %s: holdings[%d].preparedFor (%+v) must name a namespace, pod, container and podUID", path, i, *o)
		}
		s.holdings[h.Device] = h
	}
	return s, nil
}

// offer records that GetPreferredAllocation steered c.DeviceIDs to c.Ref.
func (s *claimStore) offer(c claim) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.offers[c.Device] = c
}

// offered returns the offer for device, if any.
func (s *claimStore) offered(device string) (claim, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.offers[device]
	return c, ok
}

// recentlyOffered reports whether the container ref of pod uid got an
// offer after since.
func (s *claimStore) recentlyOffered(ref containerRef, uid types.UID, since time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.offers {
		if c.Ref == ref && c.PodUID == uid && c.At.After(since) {
			return true
		}
	}
	return false
}

// bind records c as the binding of c.Device, replacing any earlier one
// (device IDs pass from pod to pod), drops the offer for it and writes the
// checkpoint before it returns. On a write error the binding is kept in
// memory and the error returned.
func (s *claimStore) bind(c claim) error {
	s.mu.Lock()
	s.bindings[c.Device] = c
	delete(s.offers, c.Device)
	delete(s.missing, c.Device)
	s.mu.Unlock()
	return s.save(true)
}

// hold gives the holder of ids, which Allocate is answering at, a CDI
// device name of its own (handoff.HolderName with a random token) and
// records it in place of the previous holder's. The checkpoint is written
// in the background: Allocate runs while the kubelet admits the node's
// pods one at a time, and a write (two fsyncs) made it 10–16 ms instead of
// under 1 ms in a burst of 40 pods onto one node. A plugin that stops
// before the write loses the name from its record; the container's start
// then takes it from the kubelet's, which keeps Allocate's answer
// (allocator.cdiDeviceFor, adopt). A non-nil prepared is the container
// Allocate prepares the spec for (holding.For).
func (s *claimStore) hold(ids []string, at time.Time, prepared *specOwner) string {
	key := handoff.DeviceName(ids)
	s.mu.Lock()
	prev, had := s.holdings[key]
	name := handoff.HolderName(key, newToken())
	for had && name == prev.Name {
		name = handoff.HolderName(key, newToken())
	}
	s.holdings[key] = holding{Device: key, DeviceIDs: slices.Clone(ids), Name: name, At: at, For: prepared}
	delete(s.missing, key)
	s.dirty = true
	start := s.path != "" && !s.flushing
	if start {
		s.flushing = true
	}
	s.mu.Unlock()
	if start {
		go s.flushLoop()
	}
	return name
}

// flushLoop writes the checkpoint until no holding changed since the last
// write, or a write fails (logged; the next change tries again).
func (s *claimStore) flushLoop() {
	for {
		s.mu.Lock()
		if !s.dirty {
			s.flushing = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		if err := s.save(false); err != nil {
			s.logger.Error(err, "Writing the checkpoint: CDI device names given since the last write are lost if the plugin stops before it is written")
			s.mu.Lock()
			s.flushing = false
			s.mu.Unlock()
			return
		}
	}
}

// flush writes the checkpoint now, with what the store holds (the plugin's
// stop calls it). A background write that has not begun then writes
// nothing.
func (s *claimStore) flush() error {
	return s.save(true)
}

// saved returns once the checkpoint holds every change made before the
// call: it writes the checkpoint unless a write that began after those
// changes has ended (save(false) skips a clean store), and returns that
// write's error.
func (s *claimStore) saved() error {
	return s.save(false)
}

// held returns the CDI device name of the holder of the IDs whose key is
// device, if Allocate gave one.
func (s *claimStore) held(device string) (string, bool) {
	h, ok := s.holding(device)
	return h.Name, ok
}

// holding returns the holding of the IDs whose key is device, if any.
func (s *claimStore) holding(device string) (holding, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.holdings[device]
	return h, ok
}

// adopt records name, the CDI device name of the holder of ids as the
// kubelet's record has it (allocator.cdiDeviceFor), as the holding of ids
// in place of any other, and writes the checkpoint before it returns. name
// must be a holder's name of the IDs' key (handoff.IsHolderName).
func (s *claimStore) adopt(ids []string, name string, at time.Time) error {
	key := handoff.DeviceName(ids)
	s.mu.Lock()
	s.holdings[key] = holding{Device: key, DeviceIDs: slices.Clone(ids), Name: name, At: at}
	delete(s.missing, key)
	s.dirty = true
	s.mu.Unlock()
	return s.saved()
}

// prepareFor records that the spec of the holding of device named name is
// for o now, and writes the checkpoint before it returns; false (nothing
// changed) when device has another holder by now.
func (s *claimStore) prepareFor(device, name string, o specOwner) (bool, error) {
	s.mu.Lock()
	h, ok := s.holdings[device]
	if !ok || h.Name != name {
		s.mu.Unlock()
		return false, nil
	}
	h.For = &o
	s.holdings[device] = h
	s.dirty = true
	s.mu.Unlock()
	return true, s.save(false)
}

// newToken returns 12 random hex digits.
func newToken() string {
	var b [6]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// binding returns the binding of device, if any.
func (s *claimStore) binding(device string) (claim, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.bindings[device]
	return c, ok
}

// isBound reports whether the container ref of pod uid holds a binding.
func (s *claimStore) isBound(ref containerRef, uid types.UID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.bindings {
		if c.Ref == ref && c.PodUID == uid {
			return true
		}
	}
	return false
}

// gc drops offers made before cutoff, and bindings and holdings made
// before cutoff whose devices no container holds (live, now) in two
// collections at least now-cutoff apart, and rewrites the checkpoint when
// a binding or holding went. It returns how many bindings and holdings it
// dropped. One collection is not enough: right after a restart the kubelet
// answers PodResources before its pod sources have synced, listing none of
// the running pods, and a container that restarts later needs its binding
// or CDI device name.
func (s *claimStore) gc(live map[string]bool, cutoff, now time.Time) (int, error) {
	s.mu.Lock()
	maps.DeleteFunc(s.offers, func(_ string, c claim) bool { return c.At.Before(cutoff) })
	gone := func(device string, at time.Time) bool {
		if live[device] {
			return false
		}
		since, ok := s.missing[device]
		if !ok {
			s.missing[device] = now
			return false
		}
		return at.Before(cutoff) && !since.After(cutoff)
	}
	for d := range s.missing {
		_, bound := s.bindings[d]
		_, held := s.holdings[d]
		if live[d] || (!bound && !held) {
			delete(s.missing, d)
		}
	}
	before := len(s.bindings) + len(s.holdings)
	maps.DeleteFunc(s.bindings, func(d string, c claim) bool { return gone(d, c.At) })
	maps.DeleteFunc(s.holdings, func(d string, h holding) bool { return gone(d, h.At) })
	dropped := before - len(s.bindings) - len(s.holdings)
	s.mu.Unlock()
	if dropped == 0 {
		return 0, nil
	}
	return dropped, s.save(true)
}

// save writes the checkpoint atomically with the store's state when it
// begins, unless the store is clean and always is false; a failed write
// leaves the store dirty, for the next to retry.
func (s *claimStore) save(always bool) error {
	if s.path == "" {
		return nil
	}
	s.fileMu.Lock()
	defer s.fileMu.Unlock()
	s.mu.Lock()
	if !always && !s.dirty {
		s.mu.Unlock()
		return nil
	}
	cp := checkpoint{Version: checkpointVersion, Bindings: slices.Collect(maps.Values(s.bindings)), Holdings: slices.Collect(maps.Values(s.holdings))}
	s.dirty = false
	s.mu.Unlock()
	slices.SortFunc(cp.Bindings, func(a, b claim) int { return cmp.Compare(a.Device, b.Device) })
	slices.SortFunc(cp.Holdings, func(a, b holding) int { return cmp.Compare(a.Device, b.Device) })
	data, err := json.MarshalIndent(cp, "", "  ")
	if err == nil {
		err = handoff.WriteFileAtomic(filepath.Dir(s.path), filepath.Base(s.path), data, 0o600, nil)
	}
	if err != nil {
		s.mu.Lock()
		s.dirty = true
		s.mu.Unlock()
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return nil
}
