package cluster

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// TestStopFallsBackToSIGKILL stops a real process that ignores SIGTERM. Real: processes, signals
// and /proc. Needs /bin/sh.
func TestStopFallsBackToSIGKILL(t *testing.T) {
	c := &Cluster{State: State{Dir: t.TempDir()}}
	p, err := c.start("stubborn", "/bin/sh", []string{"-c", "trap '' TERM; while :; do sleep 0.1; done"}, c.State.Dir)
	if err != nil {
		t.Fatal(err)
	}
	p.grace = 200 * time.Millisecond
	if err := p.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !p.Exited() {
		t.Error("still running after Stop")
	}
}

// TestDownStopsProcessGroups stops, through the state file only as another process would, a real
// process and the child it started in its process group, and removes the folder. Real: processes,
// signals and /proc. Needs /bin/sh and sleep.
func TestDownStopsProcessGroups(t *testing.T) {
	c := &Cluster{State: State{Dir: filepath.Join(t.TempDir(), "cluster")}}
	childPIDFile := filepath.Join(c.State.Dir, "child.pid")
	parent, err := c.start("parent", "/bin/sh", []string{"-c", `sleep 300 & echo $! > "$0"; wait`, childPIDFile}, c.State.Dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	child := waitNumber(t, childPIDFile)

	if err := Down(c.StatePath()); err != nil {
		t.Fatalf("Down: %v", err)
	}
	if !parent.Exited() {
		t.Error("parent still running after Down")
	}
	waitGone(t, child)
	if _, err := os.Stat(c.State.Dir); !os.IsNotExist(err) {
		t.Errorf("folder %s still there after Down (stat: %v)", c.State.Dir, err)
	}
	if err := Down(c.StatePath()); err != nil {
		t.Errorf("second Down: %v, want nil (nothing left)", err)
	}
}

// TestStopKillsStragglersOfADeadLeader stops the group of a real process that exited and left a
// child behind. Real: processes, signals and /proc. Needs /bin/sh and sleep.
func TestStopKillsStragglersOfADeadLeader(t *testing.T) {
	c := &Cluster{State: State{Dir: t.TempDir()}}
	childPIDFile := filepath.Join(c.State.Dir, "child.pid")
	p, err := c.start("leader", "/bin/sh", []string{"-c", `sleep 300 & echo $! > "$0"`, childPIDFile}, c.State.Dir)
	if err != nil {
		t.Fatal(err)
	}
	child := waitNumber(t, childPIDFile)
	if !p.waitExit(10 * time.Second) {
		t.Fatal("leader did not exit")
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	waitGone(t, child)
}

// TestKillFreesThePortsOfAZombieLeader kills a real process whose main thread has exited while its
// other threads still hold a listening socket: its leader is a zombie, but the process has not
// ended and its port is not free. Kill must return only once the port can be listened on again, as
// a restart on the same port needs. Real: processes, threads, signals, sockets and /proc.
func TestKillFreesThePortsOfAZombieLeader(t *testing.T) {
	c := &Cluster{State: State{Dir: t.TempDir()}}
	portFile := filepath.Join(c.State.Dir, "port")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.startEnv("zombie-leader", exe, []string{"-test.run=^$"}, []string{zombieHelperEnv + "=" + portFile}, c.State.Dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	port := waitNumber(t, portFile)
	err = wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		st, err := procStat(p.PID)
		return err == nil && st.state == 'Z', nil
	})
	if err != nil {
		t.Fatalf("the helper's main thread did not exit: %v\n%s", err, p.LogTail(20))
	}
	if p.Exited() {
		t.Error("Exited: true for a zombie leader whose other threads still run")
	}
	if fromState := (&Process{PID: p.PID, StartTime: p.StartTime}); fromState.Exited() {
		t.Error("Exited (from the state file): true for a zombie leader whose other threads still run")
	}
	if err := p.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("listen on the killed process's port right after Kill: %v", err)
	}
	_ = ln.Close()
}

// zombieHelperEnv names the file the test binary, run as TestKillFreesThePortsOfAZombieLeader's
// helper, writes its port to.
const zombieHelperEnv = "GPUSLICE_ZOMBIE_LEADER_PORT_FILE"

// zombieListener keeps the helper's socket reachable: a collected one would be closed.
var zombieListener net.Listener

// init makes the test binary TestKillFreesThePortsOfAZombieLeader's helper when zombieHelperEnv is
// set: it listens on a free loopback port, writes the port, and ends the main thread only (exit, not
// exit_group), so the runtime's other threads keep the socket open. Only init runs on the main
// thread for certain.
func init() {
	path := os.Getenv(zombieHelperEnv)
	if path == "" {
		return
	}
	var err error
	if zombieListener, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		panic(err)
	}
	port := strconv.Itoa(zombieListener.Addr().(*net.TCPAddr).Port)
	if err := os.WriteFile(path, []byte(port), 0o600); err != nil { //nolint:gosec // G703: a file in the parent test's own temporary folder
		panic(err)
	}
	_, _, _ = syscall.Syscall(syscall.SYS_EXIT, 0, 0, 0)
}

// waitNumber waits for another process to write a number (a child's PID, a port) to path and
// returns it.
func waitNumber(t *testing.T, path string) int {
	t.Helper()
	var n int
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return false, nil
		}
		n, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("a number in %s: %v", path, err)
	}
	return n
}

// waitGone fails t unless pid ends (or is a zombie) within 10 s.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		st, err := procStat(pid)
		return err != nil || st.state == 'Z', nil
	})
	if err != nil {
		t.Errorf("process %d still running", pid)
	}
}
