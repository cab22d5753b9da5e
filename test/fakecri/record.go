package fakecri

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"
)

// Record is one CreateContainer call as the kubelet made it. Records are written in call order,
// one JSON object per line; a container restart writes a new Record with a higher Attempt.
type Record struct {
	// Namespace, Pod and PodUID identify the pod from the sandbox metadata.
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	PodUID    string `json:"podUID"`
	// Container is the container's name; Attempt counts its restarts from 0.
	Container string `json:"container"`
	Attempt   uint32 `json:"attempt"`
	// Env is the container's environment as the runtime would set it; a later duplicate key wins.
	Env map[string]string `json:"env"`
	// Mounts, Devices and CDIDevices are copied from the ContainerConfig; with CDI spec folders
	// configured, Env, Mounts and Devices also hold what the CDI devices' specs added.
	Mounts     []Mount  `json:"mounts,omitempty"`
	Devices    []Device `json:"devices,omitempty"`
	CDIDevices []string `json:"cdiDevices,omitempty"`
	// CDIErrors are problems the CDI registry reported with spec files while resolving (a broken
	// file elsewhere in the folder); the devices themselves resolved.
	CDIErrors []string `json:"cdiErrors,omitempty"`
	// Created is when the runtime received the CreateContainer call.
	Created time.Time `json:"created,omitzero"`
}

// Mount is one bind mount of a Record.
type Mount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
}

// Device is one device node of a Record.
type Device struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	Permissions   string `json:"permissions,omitempty"`
}

// ReadRecords returns the Records in the file at path, in call order. A missing file means no call
// yet and returns no Records and no error. A torn last line (a write in progress) is ignored.
func ReadRecords(path string) ([]Record, error) {
	f, err := os.Open(path) //nolint:gosec // G304: the caller names its record file
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open CRI record file: %w", err)
	}
	defer f.Close()
	var records []Record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 16*1024*1024)
	for sc.Scan() {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			continue // a line still being written
		}
		records = append(records, r)
	}
	if err := sc.Err(); err != nil {
		return records, fmt.Errorf("read CRI record file %s: %w", path, err)
	}
	return records, nil
}
