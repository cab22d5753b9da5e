package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// stopTimeout is how long Stop waits after SIGTERM before it sends SIGKILL, and again after.
const stopTimeout = 15 * time.Second

// Process is one component process. Its exported fields are what the state file keeps; a Process
// read back from the state file (not started by this process) has no cmd and is watched through
// /proc. Methods are not safe for concurrent use, except Exited.
type Process struct {
	// Name identifies the component, e.g. "etcd" or "node-1/kubelet".
	Name string `json:"name"`
	// PID is the process ID; it is also the process group ID.
	PID int `json:"pid"`
	// StartTime is field 22 of /proc/PID/stat, so that a PID reused by another process is not
	// mistaken for this one.
	StartTime uint64 `json:"startTime"`
	// Log is the file that holds the process's stdout and stderr.
	Log string `json:"log"`
	// WorkDir is the process's working folder, empty when it started.
	WorkDir string `json:"workDir"`
	// Path is the program that was started.
	Path string `json:"path"`
	// Args are the command-line arguments it was started with (without the program); Env are the
	// variables set on top of this process's environment.
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`

	cmd  *exec.Cmd
	done chan struct{} // closed when cmd.Wait returns
	// grace is how long Stop waits after SIGTERM; zero means stopTimeout.
	grace time.Duration
}

// startProcess starts path with args (and env on top of this process's environment) as a new
// process group, in a new empty working folder
// workDir, with stdout and stderr appended to logPath. With withParent, the kernel sends the
// process SIGKILL when this process dies (PR_SET_PDEATHSIG: it survives exec, and Go only ends an OS
// thread when a goroutine locked to it exits, which this package never does).
func startProcess(name, path string, args, env []string, workDir, logPath string, withParent bool) (*Process, error) {
	if err := os.MkdirAll(workDir, 0o750); err != nil {
		return nil, fmt.Errorf("%s: create working folder: %w", name, err)
	}
	entries, err := os.ReadDir(workDir)
	if err != nil {
		return nil, fmt.Errorf("%s: read working folder: %w", name, err)
	}
	if len(entries) != 0 {
		return nil, fmt.Errorf("%s: working folder %s must be empty", name, workDir)
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600) //nolint:gosec // G304: a log in the cluster's folder
	if err != nil {
		return nil, fmt.Errorf("%s: open log: %w", name, err)
	}
	defer logFile.Close()
	fmt.Fprintf(logFile, "=== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), path, strings.Join(args, " "))

	cmd := exec.Command(path, args...) //nolint:gosec // G204: running the cluster binaries is this package's job
	cmd.Dir = workDir
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if withParent {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: start %s: %w", name, path, err)
	}
	p := &Process{Name: name, PID: cmd.Process.Pid, Log: logPath, WorkDir: workDir, Path: path, Args: args, Env: env, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	if st, err := procStat(p.PID); err == nil {
		p.StartTime = st.startTime
	}
	return p, nil
}

// Exited reports whether the process has ended: no process with its PID and start time is alive.
// A zombie whose other threads are gone has ended: the process that started this one may not have
// reaped it yet (Down, from the state file, stops a cluster whose processes this process started
// and still waits for). A zombie leader whose other threads still exit has not: they may still hold
// its files, so its listening ports are not free yet.
func (p *Process) Exited() bool {
	if p.done != nil {
		select {
		case <-p.done:
			return true
		default:
		}
		if p.StartTime == 0 { // its start time could not be read: only the wait can tell
			return false
		}
	}
	st, err := procStat(p.PID)
	return err != nil || st.startTime != p.StartTime || st.ended()
}

// Stop sends SIGTERM to the process group, waits up to stopTimeout for the process to end, then
// sends SIGKILL to the group and waits again. It is idempotent and returns an error only when the
// process is still alive after SIGKILL.
func (p *Process) Stop() error {
	if p.Exited() {
		p.killGroup(syscall.SIGKILL) // stragglers of a dead leader, if any
		return nil
	}
	p.killGroup(syscall.SIGTERM)
	p.killGroup(syscall.SIGCONT) // a paused process acts on SIGTERM only once it runs
	grace := p.grace
	if grace == 0 {
		grace = stopTimeout
	}
	if p.waitExit(grace) {
		p.killGroup(syscall.SIGKILL)
		return nil
	}
	p.killGroup(syscall.SIGKILL)
	if !p.waitExit(stopTimeout) {
		return fmt.Errorf("%s (pid %d) still alive after SIGKILL", p.Name, p.PID)
	}
	return nil
}

// Kill sends SIGKILL to the process group and waits for the process to end: a crash.
func (p *Process) Kill() error {
	p.killGroup(syscall.SIGKILL)
	if !p.waitExit(stopTimeout) {
		return fmt.Errorf("%s (pid %d) still alive after SIGKILL", p.Name, p.PID)
	}
	return nil
}

// Pause freezes the process group with SIGSTOP: it keeps its sockets, files and connections but
// does nothing until Resume, as a process starved of CPU or stuck in the kernel would.
func (p *Process) Pause() error {
	if p.Exited() {
		return fmt.Errorf("%s (pid %d) has exited", p.Name, p.PID)
	}
	p.killGroup(syscall.SIGSTOP)
	return nil
}

// Resume lets a paused process group run again (SIGCONT).
func (p *Process) Resume() {
	p.killGroup(syscall.SIGCONT)
}

// killGroup signals the process group, but only while it is still this process's group. While the
// leader lives (same start time, not ended), the group is signalled at once. Once the leader is
// gone, Linux does not hand its PID to a new process while the group has members, so the processes
// whose group is PID are ours and are signalled one by one; if a process with another start time
// holds the PID, it was reused and nothing is signalled.
func (p *Process) killGroup(sig syscall.Signal) {
	st, err := procStat(p.PID)
	switch {
	case err == nil && st.startTime == p.StartTime && !st.ended():
		_ = syscall.Kill(-p.PID, sig)
		return
	case err == nil && st.startTime != p.StartTime:
		return // the PID was reused
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == p.PID {
			continue
		}
		if st, err := procStat(pid); err == nil && st.pgrp == p.PID {
			_ = syscall.Kill(pid, sig)
		}
	}
}

// waitExit polls until the process has ended or timeout passes, and reports whether it ended.
func (p *Process) waitExit(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if p.Exited() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		if p.done != nil {
			select {
			case <-p.done:
				return true
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		time.Sleep(50 * time.Millisecond) // polling /proc: nothing to wait on
	}
}

// LogTail returns the last n lines of the process's log.
func (p *Process) LogTail(n int) string {
	b, err := os.ReadFile(p.Log)
	if err != nil {
		return fmt.Sprintf("(read %s: %v)", p.Log, err)
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// stat is what procStat reads from /proc/PID/stat.
type stat struct {
	state     byte
	pgrp      int
	startTime uint64
	// cpuTicks is user plus system time, in clock ticks (USER_HZ, 100 per second on Linux).
	cpuTicks int64
	// threads is the number of threads not yet released, the leader included.
	threads int
}

// ended reports whether the process is a zombie whose threads have all exited: a zombie leader
// whose other threads still run has not ended, and signalling its group still reaches them.
func (st stat) ended() bool {
	return st.state == 'Z' && st.threads <= 1
}

// userHZ is the unit of the times in /proc/PID/stat: fixed at 100 by the kernel's ABI whatever
// its internal tick rate.
const userHZ = 100

// procStat reads /proc/pid/stat.
func procStat(pid int) (stat, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat")) //nolint:gosec // G703: a number, formatted
	if err != nil {
		return stat{}, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	// The command name, in parentheses, may hold spaces: split after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return stat{}, errors.New("malformed /proc stat")
	}
	f := strings.Fields(string(b[i+2:]))
	// f[0] is field 3 (state), f[2] field 5 (pgrp), f[11] and f[12] fields 14 and 15 (utime,
	// stime), f[17] field 20 (num_threads), f[19] field 22 (starttime).
	if len(f) < 20 {
		return stat{}, errors.New("short /proc stat")
	}
	pgrp, _ := strconv.Atoi(f[2])
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return stat{}, fmt.Errorf("parse start time: %w", err)
	}
	utime, uerr := strconv.ParseInt(f[11], 10, 64)
	stime, serr := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(uerr, serr); err != nil {
		return stat{}, fmt.Errorf("parse cpu times: %w", err)
	}
	threads, err := strconv.Atoi(f[17])
	if err != nil {
		return stat{}, fmt.Errorf("parse thread count: %w", err)
	}
	return stat{state: f[0][0], pgrp: pgrp, startTime: start, cpuTicks: utime + stime, threads: threads}, nil
}

// CPUTime returns the CPU time (user plus system) the process has used since it started, at the
// 10 ms resolution of /proc/PID/stat.
func (p *Process) CPUTime() (time.Duration, error) {
	st, err := procStat(p.PID)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p.Name, err)
	}
	return time.Duration(st.cpuTicks) * time.Second / userHZ, nil
}

// Memory returns the process's resident memory now and its peak (VmRSS and VmHWM of
// /proc/PID/status), in KiB.
func (p *Process) Memory() (rssKiB, peakKiB int64, err error) {
	v, err := p.status("VmRSS", "VmHWM")
	return v["VmRSS"], v["VmHWM"], err
}

// ResidentSplit returns how the process's resident memory divides between anonymous pages
// (its heap, stacks and data: what the code allocates) and pages of files it maps (its
// binary's code and data as far as it touched them): RssAnon and RssFile of /proc/PID/status,
// in KiB.
func (p *Process) ResidentSplit() (anonKiB, fileKiB int64, err error) {
	v, err := p.status("RssAnon", "RssFile")
	return v["RssAnon"], v["RssFile"], err
}

// status reads the named KiB fields of /proc/PID/status.
func (p *Process) status(keys ...string) (map[string]int64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.PID), "status"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.Name, err)
	}
	out := make(map[string]int64, len(keys))
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !slices.Contains(keys, k) {
			continue
		}
		if f := strings.Fields(v); len(f) > 0 {
			out[k], _ = strconv.ParseInt(f[0], 10, 64)
		}
	}
	return out, nil
}
