// Command gpuslice-cni is the local cluster's CNI plugin on a real runtime: it gives each pod an
// address without creating any interface or route, on the host or in the pod's network namespace.
// The pods of the local cluster need no network (those that reach the API server use the host's),
// but containerd wants an eth0 address for every sandbox, and this machine's kernel has neither the
// dummy nor the veth link type to make one without touching the host. ADD reports eth0 with an
// address in 10.244.0.0/16 taken from the container ID; DEL, CHECK and GC do nothing; VERSION
// lists the CNI versions it speaks. It follows the CNI 1.x protocol (environment and stdin in,
// JSON result out).
package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// cniVersion is the version of the results it writes.
const cniVersion = "1.0.0"

// netConf is the part of the network configuration on stdin that it reads.
type netConf struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
}

func main() {
	if err := run(os.Getenv("CNI_COMMAND"), os.Getenv("CNI_CONTAINERID"), os.Getenv("CNI_NETNS"), os.Stdin, os.Stdout); err != nil {
		// CNI's error result: code 100 and above are the plugin's own.
		_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"cniVersion": cniVersion, "code": 100, "msg": err.Error()})
		os.Exit(1)
	}
}

// run executes one CNI command.
func run(command, containerID, netns string, in io.Reader, out io.Writer) error {
	switch command {
	case "VERSION":
		return json.NewEncoder(out).Encode(map[string]any{"cniVersion": cniVersion, "supportedVersions": []string{"0.4.0", "1.0.0", "1.1.0"}})
	case "DEL", "CHECK", "GC", "STATUS":
		return nil
	case "ADD":
	default:
		return fmt.Errorf("CNI_COMMAND=%q: want ADD, DEL, CHECK, GC, STATUS or VERSION", command)
	}
	var conf netConf
	if err := json.NewDecoder(in).Decode(&conf); err != nil {
		return fmt.Errorf("network configuration: %w", err)
	}
	if containerID == "" {
		return fmt.Errorf("CNI_CONTAINERID is empty")
	}
	sum := sha256.Sum256([]byte(containerID))
	// 10.244.0.0/16 without .0 and .255 host bytes, so every address looks like a host's.
	addr := fmt.Sprintf("10.244.%d.%d/32", sum[0], 1+int(sum[1])%254)
	version := conf.CNIVersion
	if version == "" {
		version = cniVersion
	}
	return json.NewEncoder(out).Encode(map[string]any{
		"cniVersion": version,
		"interfaces": []map[string]any{{"name": "eth0", "sandbox": netns}},
		"ips":        []map[string]any{{"address": addr, "interface": 0}},
	})
}
