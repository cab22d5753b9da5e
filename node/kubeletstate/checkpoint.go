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
)

// CheckpointFile is the device manager's checkpoint in the kubelet's
// device-plugin folder. The kubelet writes it (a temporary file renamed
// over it) whenever it allocates devices to a container, before the pod's
// admission ends, so before any start of its containers. The layout read
// here is the one the kubelet's own checkpoint code writes at the pinned
// Kubernetes version (a test in the test module writes it with that code).
const CheckpointFile = "kubelet_internal_checkpoint"

// Holder is the container the kubelet allocated a set of devices to: its
// pod's UID, as the kubelet has it, and its name.
type Holder struct {
	PodUID    string
	Container string
}

// ErrNoHolder means the checkpoint was read but gives the devices to no
// container, or to more than one.
var ErrNoHolder = errors.New("the kubelet's device checkpoint gives the devices to no single container")

// checkpoint is the part of the device manager's checkpoint a Holder comes
// from: the entry of each container and resource, with its device IDs per
// NUMA node (the kubelet writes the IDs of devices without a topology
// under node -1).
type checkpoint struct {
	Data struct {
		PodDeviceEntries []struct {
			PodUID        string
			ContainerName string
			ResourceName  string
			DeviceIDs     map[string][]string
		}
	}
}

// DeviceHolder returns the container that holds exactly ids (in any order)
// of resource in the device manager's checkpoint in dir, the kubelet's
// device-plugin folder. Its error wraps the read's or the decoding's, or
// is ErrNoHolder.
func DeviceHolder(dir, resource string, ids []string) (Holder, error) {
	path := filepath.Join(dir, CheckpointFile)
	data, err := os.ReadFile(path) //nolint:gosec // G304: the kubelet's checkpoint in its device-plugin folder (configuration).
	if err != nil {
		return Holder{}, fmt.Errorf("read the kubelet's device checkpoint: %w", err)
	}
	var cp checkpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		return Holder{}, fmt.Errorf("decode the kubelet's device checkpoint %s: %w", path, err)
	}
	want := slices.Sorted(slices.Values(ids))
	var found []Holder
	for _, e := range cp.Data.PodDeviceEntries {
		if e.ResourceName != resource {
			continue
		}
		var held []string
		for _, onNode := range e.DeviceIDs {
			held = append(held, onNode...)
		}
		slices.Sort(held)
		if slices.Equal(slices.Compact(held), want) {
			found = append(found, Holder{PodUID: e.PodUID, Container: e.ContainerName})
		}
	}
	if len(found) != 1 {
		return Holder{}, fmt.Errorf("%w (%d of %v of %s)", ErrNoHolder, len(found), ids, resource)
	}
	return found[0], nil
}
