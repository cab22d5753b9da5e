package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpuslice/gpuslice/test/harness/findup"
	"github.com/gpuslice/gpuslice/test/image"
)

// RuntimeOptions has every node run real containers: containerd (with its CRI plugin) and runc
// instead of the fake CRI. containerd resolves the CDI devices itself, from the folder the device
// plugin writes (Node.CDISpecDir). Nothing is pulled: the pause image and every image a pod names
// must be among Images.
type RuntimeOptions struct {
	// Dir holds bin/ (containerd, containerd-shim-runc-v2, ctr) and cni/ (the CNI plugin
	// loopback) as hack/install-runtime.sh installs them; empty means FindRuntimeDir. runc is
	// taken from PATH, gpuslice-cni from the cluster's BinDir.
	Dir string `json:"dir"`
	// Images are OCI archives (make image: _output/image/*.tar) imported into every node's
	// containerd before its kubelet starts; they must hold image.PauseName.
	Images []string `json:"images"`
}

// k8sNamespace is the containerd namespace of the CRI plugin.
const k8sNamespace = "k8s.io"

// FindRuntimeDir returns $GPUSLICE_RUNTIME_DIR when set, else the first _output/runtime found in
// the working directory or one of its parents that holds containerd.
func FindRuntimeDir() (string, error) {
	if d := os.Getenv("GPUSLICE_RUNTIME_DIR"); d != "" {
		return d, checkRuntimeDir(d)
	}
	dir, ok, err := findup.Dir(filepath.Join("_output", "runtime"), func(d string) bool { return checkRuntimeDir(d) == nil })
	if err != nil || ok {
		return dir, err
	}
	return "", errors.New("containerd not found in _output/runtime of the working directory or a parent: run hack/install-runtime.sh (or set GPUSLICE_RUNTIME_DIR)")
}

// checkRuntimeDir returns nil when dir holds every binary RuntimeOptions.Dir names and runc is on
// PATH, else what is missing.
func checkRuntimeDir(dir string) error {
	for _, b := range []string{"bin/containerd", "bin/containerd-shim-runc-v2", "bin/ctr", "cni/loopback"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil { //nolint:gosec // G703: the folder of the runtime's binaries
			return fmt.Errorf("container runtime: %w (run hack/install-runtime.sh)", err)
		}
	}
	if _, err := exec.LookPath("runc"); err != nil {
		return fmt.Errorf("container runtime: %w (run hack/install-runtime.sh)", err)
	}
	return nil
}

// containerdConfig is the node's containerd configuration: state under the node's folders (its
// /var/lib and /run, bound in its mount namespace), the CRI plugin resolving CDI devices from
// the plugin's folder, the locally built pause image as the sandbox, oom_score_adj kept at or
// above containerd's own (this machine's root lacks CAP_SYS_RESOURCE, so the kubelet's -998 for
// sandboxes would fail) and the gpuslice-cni network (nothing is added to the host's).
const containerdConfig = `version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = [%q]
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%q, %q]
    conf_dir = %q
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`

// cniConfig is the pod network: test/cmd/gpuslice-cni, an address per pod and no interface. Pods
// reach nothing through it; pods that need the API server use the host's network.
const cniConfig = `{"cniVersion": "1.0.0", "name": "gpuslice-local", "plugins": [{"type": "gpuslice-cni"}]}
`

// runtimeScript runs as sh -c in the node's new mount namespace: bind the node's folders over
// /var/lib, /var/log and /run, then become containerd. The kubelet joins this namespace, so both
// see the same volumes, sockets, CDI specs and pod logs; the host sees none of the mounts.
const runtimeScript = `set -e; mount --bind "$1" /var/lib; mount --bind "$2" /var/log; mount --bind "$3" /run; shift 3; exec "$@"`

// containerdSocket returns the host path of the node's containerd socket (the same path inside the
// node's mount namespace).
func (n *Node) containerdSocket() string { return filepath.Join(n.Dir, "containerd.sock") }

// runDir returns the host folder of the node's /run.
func (n *Node) runDir() string { return filepath.Join(n.Dir, "run") }

// runtimeRoot returns the host folder of runc's state for the CRI plugin's containers.
func (n *Node) runtimeRoot() string {
	return filepath.Join(n.runDir(), "containerd", "runc", k8sNamespace)
}

// startContainerd writes the node's containerd and CNI configuration, starts containerd in the
// node's new mount namespace, waits for its socket and imports the cluster's images.
func (n *Node) startContainerd(ctx context.Context) error {
	rt := n.c.State.Runtime
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	cniDir := filepath.Join(n.Dir, "cni-conf")
	for _, d := range []string{cniDir, n.runDir()} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			return fmt.Errorf("node %s: create folder: %w", n.Name, err)
		}
	}
	if err := os.WriteFile(filepath.Join(cniDir, "10-gpuslice-local.conflist"), []byte(cniConfig), 0o600); err != nil {
		return fmt.Errorf("node %s: write CNI configuration: %w", n.Name, err)
	}
	cfg := filepath.Join(n.Dir, "containerd.toml")
	content := fmt.Sprintf(containerdConfig, n.containerdSocket(), n.containerdSocket()+".ttrpc", "/var/run/cdi",
		filepath.Join(rt.Dir, "cni"), n.c.State.BinDir, cniDir, image.PauseName)
	if err := os.WriteFile(cfg, []byte(content), 0o600); err != nil {
		return fmt.Errorf("node %s: write containerd configuration: %w", n.Name, err)
	}
	args := []string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", runtimeScript, "sh",
		filepath.Join(n.Dir, "varlib"), filepath.Join(n.Dir, "log"), n.runDir(),
		filepath.Join(rt.Dir, "bin", "containerd"), "--config=" + cfg,
	}
	// containerd finds its shim on PATH, the shim finds runc there.
	env := []string{"PATH=" + filepath.Join(rt.Dir, "bin") + ":" + os.Getenv("PATH")}
	p, err := n.c.startEnv(n.Name+"/containerd", unshare, args, env, n.Dir)
	if err != nil {
		return err
	}
	n.CRI = p
	if err := n.c.waitFor(ctx, n.Name+" containerd socket", []*Process{p}, func(context.Context) (bool, error) {
		_, err := os.Stat(n.containerdSocket())
		return err == nil, nil
	}); err != nil {
		return err
	}
	for _, archive := range rt.Images {
		if out, err := n.ctr(ctx, "images", "import", archive); err != nil {
			return fmt.Errorf("node %s: import %s: %w\n%s", n.Name, archive, err, out)
		}
	}
	return nil
}

// ctr runs ctr against the node's containerd, in the CRI plugin's namespace, and returns its
// combined output.
func (n *Node) ctr(ctx context.Context, args ...string) (string, error) {
	bin := filepath.Join(n.c.State.Runtime.Dir, "bin", "ctr")
	cmd := exec.CommandContext(ctx, bin, append([]string{"--address", n.containerdSocket(), "--namespace", k8sNamespace}, args...)...) //nolint:gosec // G204: the cluster's own ctr
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// kubeletCommand returns the program and leading arguments that run the kubelet: in the node's
// own new mount namespace with the fake CRI, or in containerd's namespace with a real runtime.
func (n *Node) kubeletCommand() (string, []string, error) {
	if n.c.State.Runtime == nil {
		unshare, err := exec.LookPath("unshare")
		if err != nil {
			return "", nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		return unshare, []string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", kubeletScript, "sh",
			filepath.Join(n.Dir, "varlib"), filepath.Join(n.Dir, "log")}, nil
	}
	nsenter, err := exec.LookPath("nsenter")
	if err != nil {
		return "", nil, fmt.Errorf("node %s: %w", n.Name, err)
	}
	if n.CRI == nil || n.CRI.Exited() {
		return "", nil, fmt.Errorf("node %s: containerd is not running: its mount namespace is the kubelet's", n.Name)
	}
	return nsenter, []string{"--mount=/proc/" + strconv.Itoa(n.CRI.PID) + "/ns/mnt", "--"}, nil
}

// cleanupContainers ends what a stopped containerd leaves running on the node: every container
// runc knows (killed and deleted, with their cgroups) and every shim serving the node's socket. It
// runs after the node's processes are stopped; the node's mount namespace goes with the last of
// them.
func cleanupContainers(nodeDir string) error {
	root := filepath.Join(nodeDir, "run", "containerd", "runc", k8sNamespace)
	var errs []error
	if entries, err := os.ReadDir(root); err == nil {
		for _, e := range entries {
			cmd := exec.Command("runc", "--root", root, "delete", "--force", e.Name()) //nolint:gosec // G204: containers of this cluster
			if out, err := cmd.CombinedOutput(); err != nil && !bytes.Contains(out, []byte("not exist")) {
				errs = append(errs, fmt.Errorf("runc delete %s: %w: %s", e.Name(), err, bytes.TrimSpace(out)))
			}
		}
	}
	socket := []byte(filepath.Join(nodeDir, "containerd.sock"))
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte("containerd-shim")) {
			continue
		}
		for _, arg := range bytes.Split(cmdline, []byte{0}) {
			if bytes.Equal(arg, socket) {
				p := &Process{Name: "shim", PID: pid}
				if st, err := procStat(pid); err == nil {
					p.StartTime = st.startTime
				}
				if err := p.Kill(); err != nil {
					errs = append(errs, err)
				}
				break
			}
		}
	}
	return errors.Join(errs...)
}

// isRuntimeNode reports whether the node's folder holds a containerd configuration.
func isRuntimeNode(nodeDir string) bool {
	_, err := os.Stat(filepath.Join(nodeDir, "containerd.toml"))
	return err == nil
}

// trimLogPrefix returns the content of one CRI log line ("<time> <stream> <P|F> <content>") and
// whether it ends a line (F: full, P: partial).
func trimLogPrefix(line string) (string, bool, bool) {
	f := strings.SplitN(line, " ", 4)
	if len(f) < 3 {
		return "", false, false
	}
	content := ""
	if len(f) == 4 {
		content = f[3]
	}
	return content, f[2] == "F", true
}

// ContainerPID returns the host PID of the process of the container containerID (a
// ContainerStatus's "containerd://<id>") on node name, from runc's state of it.
func (c *Cluster) ContainerPID(name, containerID string) (int, error) {
	id, ok := strings.CutPrefix(containerID, "containerd://")
	if !ok {
		return 0, fmt.Errorf("container ID %q: not a containerd container", containerID)
	}
	var n *Node
	for _, candidate := range c.Nodes {
		if candidate.Name == name {
			n = candidate
		}
	}
	if n == nil || c.State.Runtime == nil {
		return 0, fmt.Errorf("node %s: no such node on a real runtime", name)
	}
	out, err := exec.Command("runc", "--root", n.runtimeRoot(), "state", id).Output() //nolint:gosec // G204: a container of this cluster
	if err != nil {
		return 0, fmt.Errorf("runc state %s: %w", id, err)
	}
	var st struct {
		PID int `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil || st.PID <= 0 {
		return 0, fmt.Errorf("runc state %s: no pid in %q", id, out)
	}
	return st.PID, nil
}

// containerLogTails returns the last n lines of the log of every container outside the default
// namespace (the gpuslice pods) on every node, each under a header.
func (c *Cluster) containerLogTails(n int) string {
	var b strings.Builder
	for _, node := range c.Nodes {
		logs, _ := filepath.Glob(filepath.Join(node.Dir, "log", "pods", "*", "*", "*.log"))
		for _, path := range logs {
			if strings.HasPrefix(filepath.Base(filepath.Dir(filepath.Dir(path))), "default_") {
				continue
			}
			p := &Process{Log: path}
			fmt.Fprintf(&b, "----- %s container log %s -----\n%s\n", node.Name, strings.TrimPrefix(path, node.Dir+"/"), p.LogTail(n))
		}
	}
	return b.String()
}
