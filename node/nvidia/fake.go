package nvidia

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// ErrNotWatched is returned by Fake.InjectXID when no event set listens for
// XIDs on that GPU, so the event is dropped as real NVML would drop it.
var ErrNotWatched = errors.New("no NVML event set is registered for XIDs on this GPU")

const (
	// fakeEventTypes are the event types a fake GPU can report.
	fakeEventTypes = nvml.EventTypeXidCriticalError | nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError
	// fakeEventQueue is how many events an event set holds before it drops.
	fakeEventQueue = 256
	// noInstance is NVML's "not a MIG instance" ID in event data.
	noInstance = 0xFFFFFFFF
)

// nvmlInterface lets Fake embed nvml.Interface under an unexported name.
type nvmlInterface = nvml.Interface

// Fake is an nvml.Interface of fake GPUs built on go-nvml's mock servers,
// for --fake-gpus and for tests: the Backend runs the same code over it as
// over real NVML. UUIDs are FakeUUID(node, index), bus IDs are
// "00000000:<index+1>:00.0", free memory equals total, and the first half of
// the GPUs sits on NUMA node 0, the rest on node 1.
//
// The methods the Backend uses (device count and handles; a device's UUID,
// index, minor, name, memory, PCI info, NUMA node, events and recovery
// action field; event sets)
// are modelled here, answer ERROR_GPU_IS_LOST for a lost GPU, and keep no
// call history, so a long-running fake does not grow. Other methods are
// go-nvml's mock server's (those it leaves unset panic). A Fake is safe for
// concurrent use.
type Fake struct {
	nvmlInterface // go-nvml's mock server

	devices []*fakeDevice
	facts   FakeFacts

	mu   sync.Mutex
	lost []bool
	// noEvents marks GPUs that report no event support.
	noEvents []bool
	// recovery is each GPU's NVML recovery action, set by the XIDs that
	// need a reset or a reboot and cleared by ResetGPU (setRecovery).
	recovery []nvml.DeviceGpuRecoveryAction
	// stateDir is the folder of FakeStateFile (KeepStateIn); empty keeps
	// the recovery actions in memory only.
	stateDir string
	// noRecovery marks GPUs whose driver cannot report the recovery action.
	noRecovery []bool
	sets       map[*fakeEventSet]struct{}
	// activity is what runs on each GPU, by index (fakeactivity.go).
	activity map[int]fakeActivity
}

var _ nvml.Interface = (*Fake)(nil)

// NewFake returns fake GPUs for a --fake-gpus spec (see ParseFakeSpec) on
// the node nodeName, which seeds the UUIDs and must not be empty.
func NewFake(spec, nodeName string) (*Fake, error) {
	if nodeName == "" {
		return nil, fmt.Errorf("fake GPUs: node name is empty; it seeds the GPU UUIDs")
	}
	parsed, err := parseFakeSpec(spec)
	if err != nil {
		return nil, err
	}
	srv := parsed.newServer()
	f := &Fake{
		nvmlInterface: srv,
		devices:       make([]*fakeDevice, len(srv.Devices)),
		lost:          make([]bool, len(srv.Devices)),
		noEvents:      make([]bool, len(srv.Devices)),
		recovery:      make([]nvml.DeviceGpuRecoveryAction, len(srv.Devices)),
		noRecovery:    make([]bool, len(srv.Devices)),
		sets:          map[*fakeEventSet]struct{}{},
		facts:         parsed.facts,
	}
	n := len(srv.Devices)
	for i, d := range srv.Devices {
		sd := d.(*server.Device)
		// The mock's UUIDs are random per instance and its free memory 0.
		sd.UUID = FakeUUID(nodeName, i)
		sd.PciBusID = fmt.Sprintf("00000000:%02X:00.0", i+1)
		sd.MemoryInfo.Free = sd.MemoryInfo.Total
		sd.Config.Name = parsed.configs[i].Name
		f.devices[i] = &fakeDevice{Device: sd, fake: f, index: i, numaNode: i * 2 / max(n, 2)}
	}
	return f, nil
}

// Facts returns the node facts of the spec (ParseFakeSpec); the driver
// version is also what SystemGetDriverVersion answers.
func (f *Fake) Facts() FakeFacts { return f.facts }

// NoDriver returns an nvml.Interface like nvml.New() on a machine without
// the NVIDIA driver: Init answers ERROR_LIBRARY_NOT_FOUND, and any other
// call panics, as real NVML would then kill the process. It is a
// *mock.Interface, so tests can count the calls.
func NoDriver() nvml.Interface {
	return &mock.Interface{
		InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND },
	}
}

// InjectXID delivers an XID event for the GPU at index to every event set
// registered for XIDs on it, as the driver would. An XID that needs a GPU
// reset or a reboot (ClassifyXID: ResetRequired) first sets the GPU's
// recovery action, as the driver does, until ResetGPU; the XID is then
// recorded even when nobody watches (and kept in the state file under
// KeepStateIn). It returns ErrNotWatched when no set listens (the event is
// dropped), and an error for an index out of range or a state file that
// cannot be written.
func (f *Fake) InjectXID(index int, xid uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.checkIndex(index); err != nil {
		return err
	}
	if class := ClassifyXID(xid); class.Kind == ResetRequired {
		action := nvml.GPU_RECOVERY_ACTION_GPU_RESET
		if class.Reboot {
			action = nvml.GPU_RECOVERY_ACTION_NODE_REBOOT
		}
		if err := f.setRecovery(index, action); err != nil {
			return err
		}
	}
	e := nvml.EventData{
		Device:            f.devices[index],
		EventType:         nvml.EventTypeXidCriticalError,
		EventData:         xid,
		GpuInstanceId:     noInstance,
		ComputeInstanceId: noInstance,
	}
	delivered := 0
	for s := range f.sets {
		if s.mask[index]&nvml.EventTypeXidCriticalError == 0 {
			continue
		}
		select {
		case s.queue <- e:
			delivered++
		default: // a full queue drops, as NVML's does
		}
	}
	if delivered == 0 {
		return fmt.Errorf("fake GPU %d, XID %d: %w", index, xid, ErrNotWatched)
	}
	return nil
}

// Watched says whether an event set listens for XIDs on the GPU at index.
func (f *Fake) Watched(index int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.sets {
		if s.mask[index]&nvml.EventTypeXidCriticalError != 0 {
			return true
		}
	}
	return false
}

// SetLost makes the GPU at index stop answering (lost=true: its calls and
// its handle lookups return ERROR_GPU_IS_LOST) or answer again (false).
func (f *Fake) SetLost(index int, lost bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.checkIndex(index); err != nil {
		return err
	}
	f.lost[index] = lost
	return nil
}

// ResetGPU resets the GPU at index, as nvidia-smi --gpu-reset or a reboot
// would: it answers NVML again and its recovery action is none (in the
// state file too, under KeepStateIn).
func (f *Fake) ResetGPU(index int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.checkIndex(index); err != nil {
		return err
	}
	f.lost[index] = false
	return f.setRecovery(index, nvml.GPU_RECOVERY_ACTION_NONE)
}

// RecoveryAction returns the recovery action NVML reports for the GPU at
// index (an out-of-range index reports none).
func (f *Fake) RecoveryAction(index int) nvml.DeviceGpuRecoveryAction {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.checkIndex(index) != nil {
		return nvml.GPU_RECOVERY_ACTION_NONE
	}
	return f.recovery[index]
}

// SetRecoveryActionUnsupported makes the GPU at index answer the recovery
// action field with ERROR_NOT_SUPPORTED, like drivers older than the field.
func (f *Fake) SetRecoveryActionUnsupported(index int, unsupported bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.checkIndex(index); err != nil {
		return err
	}
	f.noRecovery[index] = unsupported
	return nil
}

// SetEventsUnsupported makes the GPU at index report that it cannot send
// events (ERROR_NOT_SUPPORTED), like GPUs older than Kepler.
func (f *Fake) SetEventsUnsupported(index int, unsupported bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.checkIndex(index); err != nil {
		return err
	}
	f.noEvents[index] = unsupported
	return nil
}

func (f *Fake) checkIndex(index int) error {
	if index < 0 || index >= len(f.devices) {
		return fmt.Errorf("fake GPU index %d: want 0 to %d", index, len(f.devices)-1)
	}
	return nil
}

func (f *Fake) isLost(index int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lost[index]
}

// DeviceGetCount returns the number of fake GPUs.
func (f *Fake) DeviceGetCount() (int, nvml.Return) {
	return len(f.devices), nvml.SUCCESS
}

// DeviceGetHandleByIndex returns the fake GPU at index.
func (f *Fake) DeviceGetHandleByIndex(index int) (nvml.Device, nvml.Return) {
	if index < 0 || index >= len(f.devices) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	if f.isLost(index) {
		return nil, nvml.ERROR_GPU_IS_LOST
	}
	return f.devices[index], nvml.SUCCESS
}

// DeviceGetHandleByUUID returns the fake GPU with that UUID.
func (f *Fake) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	for i, d := range f.devices {
		if d.Device.UUID != uuid {
			continue
		}
		if f.isLost(i) {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return d, nvml.SUCCESS
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// DeviceGetHandleByPciBusId returns the fake GPU at that bus ID.
func (f *Fake) DeviceGetHandleByPciBusId(busID string) (nvml.Device, nvml.Return) {
	for i, d := range f.devices {
		if d.Device.PciBusID != busID {
			continue
		}
		if f.isLost(i) {
			return nil, nvml.ERROR_GPU_IS_LOST
		}
		return d, nvml.SUCCESS
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// EventSetCreate returns a new, empty event set.
func (f *Fake) EventSetCreate() (nvml.EventSet, nvml.Return) {
	s := &fakeEventSet{
		fake:  f,
		queue: make(chan nvml.EventData, fakeEventQueue),
		freed: make(chan struct{}),
		mask:  map[int]uint64{},
	}
	f.mu.Lock()
	f.sets[s] = struct{}{}
	f.mu.Unlock()
	return s, nvml.SUCCESS
}

// fakeDevice is one fake GPU over go-nvml's mock device.
type fakeDevice struct {
	*server.Device
	fake     *Fake
	index    int
	numaNode int
}

func (d *fakeDevice) lost() bool { return d.fake.isLost(d.index) }

func (d *fakeDevice) GetUUID() (string, nvml.Return) {
	if d.lost() {
		return "", nvml.ERROR_GPU_IS_LOST
	}
	return d.Device.UUID, nvml.SUCCESS
}

func (d *fakeDevice) GetIndex() (int, nvml.Return) {
	if d.lost() {
		return 0, nvml.ERROR_GPU_IS_LOST
	}
	return d.index, nvml.SUCCESS
}

func (d *fakeDevice) GetMinorNumber() (int, nvml.Return) {
	if d.lost() {
		return 0, nvml.ERROR_GPU_IS_LOST
	}
	return d.Device.Minor, nvml.SUCCESS
}

func (d *fakeDevice) GetName() (string, nvml.Return) {
	if d.lost() {
		return "", nvml.ERROR_GPU_IS_LOST
	}
	return d.Config.Name, nvml.SUCCESS
}

func (d *fakeDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	if d.lost() {
		return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST
	}
	m := d.MemoryInfo
	m.Used = d.fake.usedBytes(d.index, m.Total)
	m.Free = m.Total - m.Used
	return m, nvml.SUCCESS
}

func (d *fakeDevice) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	if d.lost() {
		return nvml.PciInfo{}, nvml.ERROR_GPU_IS_LOST
	}
	p := nvml.PciInfo{
		Domain:      0,
		Bus:         uint32(d.index + 1), //nolint:gosec // G115: at most maxFakeGPUs
		PciDeviceId: d.Config.PciDeviceId,
	}
	copy(p.BusId[:], cChars(d.Device.PciBusID))
	copy(p.BusIdLegacy[:], cChars(d.Device.PciBusID[4:]))
	return p, nvml.SUCCESS
}

func (d *fakeDevice) GetNumaNodeId() (int, nvml.Return) {
	if d.lost() {
		return 0, nvml.ERROR_GPU_IS_LOST
	}
	return d.numaNode, nvml.SUCCESS
}

func (d *fakeDevice) GetSupportedEventTypes() (uint64, nvml.Return) {
	d.fake.mu.Lock()
	defer d.fake.mu.Unlock()
	switch {
	case d.fake.lost[d.index]:
		return 0, nvml.ERROR_GPU_IS_LOST
	case d.fake.noEvents[d.index]:
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	return fakeEventTypes, nvml.SUCCESS
}

// GetFieldValues answers nvml.FI_DEV_GET_GPU_RECOVERY_ACTION (an unsigned
// int); any other field is ERROR_NOT_SUPPORTED in its NvmlReturn.
func (d *fakeDevice) GetFieldValues(values []nvml.FieldValue) nvml.Return {
	if len(values) == 0 {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	d.fake.mu.Lock()
	defer d.fake.mu.Unlock()
	if d.fake.lost[d.index] {
		return nvml.ERROR_GPU_IS_LOST
	}
	for i := range values {
		v := &values[i]
		if v.FieldId != nvml.FI_DEV_GET_GPU_RECOVERY_ACTION || d.fake.noRecovery[d.index] {
			v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			continue
		}
		v.NvmlReturn = uint32(nvml.SUCCESS)
		v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
		v.Value = [8]byte{}
		binary.LittleEndian.PutUint32(v.Value[:4], uint32(d.fake.recovery[d.index])) //nolint:gosec // G115: a small enum
	}
	return nvml.SUCCESS
}

func (d *fakeDevice) RegisterEvents(eventTypes uint64, set nvml.EventSet) nvml.Return {
	fs, ok := set.(interface{ base() *fakeEventSet })
	if !ok || fs.base().fake != d.fake {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	s := fs.base()
	d.fake.mu.Lock()
	defer d.fake.mu.Unlock()
	switch {
	case d.fake.lost[d.index]:
		return nvml.ERROR_GPU_IS_LOST
	case d.fake.noEvents[d.index] || eventTypes&^fakeEventTypes != 0:
		return nvml.ERROR_NOT_SUPPORTED
	}
	if _, live := d.fake.sets[s]; !live {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	s.mask[d.index] |= eventTypes
	return nvml.SUCCESS
}

// fakeEventSet is a fake NVML event set: a queue that InjectXID fills.
// Methods it does not model are go-nvml's mock's.
type fakeEventSet struct {
	mock.EventSet
	fake     *Fake
	queue    chan nvml.EventData
	freed    chan struct{}
	freeOnce sync.Once
	// mask holds the registered event types by GPU index; guarded by fake.mu.
	mask map[int]uint64
}

// base lets RegisterEvents accept a set that wraps a fakeEventSet.
func (s *fakeEventSet) base() *fakeEventSet { return s }

// Wait returns the next event, or ERROR_TIMEOUT after timeoutMs
// milliseconds of real time, as NVML does.
func (s *fakeEventSet) Wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	select {
	case e := <-s.queue:
		return e, nvml.SUCCESS
	case <-s.freed:
		return nvml.EventData{}, nvml.ERROR_UNINITIALIZED
	default:
	}
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	select {
	case e := <-s.queue:
		return e, nvml.SUCCESS
	case <-s.freed:
		return nvml.EventData{}, nvml.ERROR_UNINITIALIZED
	case <-t.C:
		return nvml.EventData{}, nvml.ERROR_TIMEOUT
	}
}

// Free releases the set; later Waits fail with ERROR_UNINITIALIZED.
func (s *fakeEventSet) Free() nvml.Return {
	s.freeOnce.Do(func() {
		s.fake.mu.Lock()
		delete(s.fake.sets, s)
		s.fake.mu.Unlock()
		close(s.freed)
	})
	return nvml.SUCCESS
}

// cChars converts s to a C char array's elements, without the NUL.
func cChars(s string) []int8 {
	out := make([]int8, len(s))
	for i := range len(s) {
		out[i] = int8(s[i]) //nolint:gosec // G115: C char bytes, reinterpreted on purpose
	}
	return out
}
