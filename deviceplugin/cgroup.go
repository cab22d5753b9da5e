package deviceplugin

import (
	"bufio"
	"bytes"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// processContainer is the pod and container a process runs in, as its
// cgroup path names them.
type processContainer struct {
	PodUID      types.UID
	ContainerID string
}

// podUIDPattern finds the pod UID in a kubelet cgroup path: "pod<uid>"
// with dashes (cgroupfs driver) or underscores (systemd driver).
var podUIDPattern = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// containerIDPattern is a container runtime's ID: 64 hex digits.
var containerIDPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// readProcessContainer reads /proc/<pid>/cgroup under procDir and returns
// the pod and container the process runs in, or false when its cgroups
// are not a Kubernetes container's (a host process, a process gone).
func readProcessContainer(procDir string, pid int) (processContainer, bool) {
	data, err := os.ReadFile(filepath.Join(procDir, strconv.Itoa(pid), "cgroup")) //nolint:gosec // G304: a /proc file of a PID NVML listed.
	if err != nil {
		return processContainer{}, false
	}
	return parseProcessCgroup(data)
}

// parseProcessCgroup finds a kubelet container cgroup among the lines of
// a /proc/<pid>/cgroup file ("hierarchy:controllers:path", v1 and v2),
// for the cgroupfs driver (/kubepods/burstable/pod<uid>/<id>) and the
// systemd driver (…/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope).
func parseProcessCgroup(data []byte) (processContainer, bool) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		p := parts[2]
		m := podUIDPattern.FindStringSubmatch(p)
		if m == nil {
			continue
		}
		last := strings.TrimSuffix(path.Base(p), ".scope")
		if i := strings.LastIndexByte(last, '-'); i >= 0 {
			last = last[i+1:] // cri-containerd-<id>, crio-<id>, docker-<id>
		}
		if !containerIDPattern.MatchString(last) {
			continue
		}
		return processContainer{PodUID: types.UID(strings.ReplaceAll(m[1], "_", "-")), ContainerID: last}, true
	}
	return processContainer{}, false
}

// containerIDOf strips the runtime scheme of a container status's ID
// ("containerd://<id>").
func containerIDOf(statusID string) string {
	if _, id, ok := strings.Cut(statusID, "://"); ok {
		return id
	}
	return statusID
}
