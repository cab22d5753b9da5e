// Package kubeletstate reads what the kubelet records on the node's disk
// about its device allocations: the device manager's checkpoint, in the
// kubelet's device-plugin folder. The file is the kubelet's own record, not
// an API, so a reader treats anything it cannot read as one (no file,
// another format, no entry or several for the devices asked about) as no
// answer, and asks the API server instead.
package kubeletstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
)

// CheckpointFile is the device manager's checkpoint in the kubelet's
// device-plugin folder. The kubelet writes it (a temporary file renamed
// over it) whenever it allocates devices to a container, before the pod's
// admission ends, so before any start of its containers. The layout read
// here is the one the kubelet's own checkpoint code writes at the pinned
// Kubernetes version (a test in the test module writes it with that code).
const CheckpointFile = "kubelet_internal_checkpoint"

// Holder is the container the kubelet allocated a set of devices to: its
// pod's UID, as the kubelet has it, its name, and the CDI devices of the
// plugin's Allocate answer for it (Entry.CDIDevices).
type Holder struct {
	PodUID     string
	Container  string
	CDIDevices []string
}

// ErrNoHolder means the checkpoint was read but gives the devices to no
// container, or to more than one.
var ErrNoHolder = errors.New("the kubelet's device checkpoint gives the devices to no single container")

// Entry is one entry of the device manager's checkpoint: the devices of
// one resource the kubelet allocated to one container.
type Entry struct {
	PodUID    string
	Container string
	Resource  string
	// DeviceIDs are the devices, sorted, each once: the kubelet lists a
	// device under every NUMA node it is on, and devices without a
	// topology under node -1.
	DeviceIDs []string
	// CDIDevices are the fully qualified names of the CDI devices in the
	// plugin's Allocate answer for the container, in the answer's order:
	// the kubelet keeps the answer and passes them to the runtime at every
	// start of the container. Nil when the answer has none or does not
	// decode (the entry is read all the same).
	CDIDevices []string
}

// checkpoint is the part of the device manager's checkpoint an Entry comes
// from, with the device IDs per NUMA node.
type checkpoint struct {
	Data struct {
		PodDeviceEntries []struct {
			PodUID        string
			ContainerName string
			ResourceName  string
			DeviceIDs     map[string][]string
			// AllocResp is the plugin's ContainerAllocateResponse in
			// protobuf encoding (base64 in the JSON).
			AllocResp []byte
		}
	}
}

// Read returns the entries of the device manager's checkpoint in dir, the
// kubelet's device-plugin folder. Its error wraps the read's or the
// decoding's.
func Read(dir string) ([]Entry, error) {
	path := filepath.Join(dir, CheckpointFile)
	data, err := os.ReadFile(path) //nolint:gosec // G304: the kubelet's checkpoint in its device-plugin folder (configuration).
	if err != nil {
		return nil, fmt.Errorf("read the kubelet's device checkpoint: %w", err)
	}
	var cp checkpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		return nil, fmt.Errorf("decode the kubelet's device checkpoint %s: %w", path, err)
	}
	entries := make([]Entry, 0, len(cp.Data.PodDeviceEntries))
	for _, e := range cp.Data.PodDeviceEntries {
		var ids []string
		for _, onNode := range e.DeviceIDs {
			ids = append(ids, onNode...)
		}
		slices.Sort(ids)
		entries = append(entries, Entry{PodUID: e.PodUID, Container: e.ContainerName, Resource: e.ResourceName, DeviceIDs: slices.Compact(ids), CDIDevices: cdiDevices(e.AllocResp)})
	}
	return entries, nil
}

// Field numbers of the device-plugin API's ContainerAllocateResponse.cdi_devices and
// CDIDevice.name (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1, api.proto): the checkpoint
// keeps each container's Allocate answer in its protobuf encoding. They are read off the wire
// here, as node/ serves both node agents and does not link the device-plugin API; the
// device plugin's tests check the reading against answers that API encodes.
const (
	fieldCDIDevices protowire.Number = 5
	fieldCDIName    protowire.Number = 1
)

// cdiDevices returns the names of the CDI devices of resp, a
// ContainerAllocateResponse in protobuf encoding; nil when there are none
// or it does not decode.
func cdiDevices(resp []byte) []string {
	var names []string
	ok := eachField(resp, func(num protowire.Number, typ protowire.Type, value []byte) bool {
		if num != fieldCDIDevices || typ != protowire.BytesType {
			return true
		}
		return eachField(value, func(num protowire.Number, typ protowire.Type, value []byte) bool {
			if num == fieldCDIName && typ == protowire.BytesType {
				names = append(names, string(value))
			}
			return true
		})
	})
	if !ok {
		return nil
	}
	return names
}

// eachField calls fn with each field of the protobuf message b, in order: its number, wire
// type and, for a length-delimited field, its bytes (nil for the others). It stops and returns
// false when b does not decode or fn returns false.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, value []byte) bool) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		b = b[n:]
		var value []byte
		if typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return false
			}
			value, n = v, m
		} else if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return false
		}
		b = b[n:]
		if !fn(num, typ, value) {
			return false
		}
	}
	return true
}

// DeviceHolder returns the container that holds exactly ids (in any order)
// of resource in the device manager's checkpoint in dir (Read). Its error
// is Read's or ErrNoHolder.
func DeviceHolder(dir, resource string, ids []string) (Holder, error) {
	entries, err := Read(dir)
	if err != nil {
		return Holder{}, err
	}
	want := slices.Sorted(slices.Values(ids))
	var found []Holder
	for _, e := range entries {
		if e.Resource == resource && slices.Equal(e.DeviceIDs, want) {
			found = append(found, Holder{PodUID: e.PodUID, Container: e.Container, CDIDevices: e.CDIDevices})
		}
	}
	if len(found) != 1 {
		return Holder{}, fmt.Errorf("%w (%d of %v of %s)", ErrNoHolder, len(found), ids, resource)
	}
	return found[0], nil
}
