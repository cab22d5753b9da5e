package cluster

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/gpuslice/gpuslice/test/fakecri"
)

// PrintEnvAndMounts is the shell command (sh -c) of a test container on a real runtime: it prints
// its environment and its mount table between markers, which Node.CRIRecords reads back from the
// container's log, then sleeps.
const PrintEnvAndMounts = `echo '== env'; env; echo '== mounts'; cat /proc/self/mounts; echo '== end'; exec sleep 86400`

// Markers of PrintEnvAndMounts's output.
const (
	markEnv    = "== env"
	markMounts = "== mounts"
	markEnd    = "== end"
)

// runtimeRecords returns, for every container of the node whose log holds a whole
// PrintEnvAndMounts report, a Record of what the container saw: pod, container, attempt (the
// log's restart count), environment and mounts (device as HostPath). Records of one container are
// in attempt order.
func (n *Node) runtimeRecords() ([]fakecri.Record, error) {
	logs, err := filepath.Glob(filepath.Join(n.Dir, "log", "pods", "*", "*", "*.log"))
	if err != nil {
		return nil, err
	}
	var out []fakecri.Record
	for _, path := range logs {
		podDir := filepath.Base(filepath.Dir(filepath.Dir(path)))
		parts := strings.SplitN(podDir, "_", 3) // <namespace>_<name>_<uid>; names hold no "_"
		attempt, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(path), ".log"), 10, 32)
		if len(parts) != 3 || err != nil {
			continue
		}
		r, ok, err := readReport(path)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		r.Namespace, r.Pod, r.PodUID = parts[0], parts[1], parts[2]
		r.Container = filepath.Base(filepath.Dir(path))
		r.Attempt = uint32(attempt)
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Attempt < out[j].Attempt })
	return out, nil
}

// readReport parses the PrintEnvAndMounts report in the CRI log file at path; false when the log
// holds no whole report (yet).
func readReport(path string) (fakecri.Record, bool, error) {
	f, err := os.Open(path) //nolint:gosec // G304: a container log of this cluster
	if err != nil {
		if os.IsNotExist(err) {
			return fakecri.Record{}, false, nil // the container was removed meanwhile
		}
		return fakecri.Record{}, false, err
	}
	defer f.Close()
	r := fakecri.Record{Env: map[string]string{}}
	section, pending := "", ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		content, full, ok := trimLogPrefix(sc.Text())
		if !ok {
			continue
		}
		if pending += content; !full {
			continue
		}
		line := pending
		pending = ""
		switch line {
		case markEnv, markMounts:
			section = line
			continue
		case markEnd:
			return r, true, nil
		}
		switch section {
		case markEnv:
			if k, v, ok := strings.Cut(line, "="); ok {
				r.Env[k] = v
			}
		case markMounts:
			if f := strings.Fields(line); len(f) >= 4 {
				r.Mounts = append(r.Mounts, fakecri.Mount{HostPath: f[0], ContainerPath: f[1], ReadOnly: hasOption(f[3], "ro")})
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fakecri.Record{}, false, fmt.Errorf("read %s: %w", path, err)
	}
	return fakecri.Record{}, false, nil
}

// hasOption reports whether the comma-separated mount options hold opt.
func hasOption(options, opt string) bool {
	for _, o := range strings.Split(options, ",") {
		if o == opt {
			return true
		}
	}
	return false
}
