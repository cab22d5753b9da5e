package handoff

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Restart back-off of an MPS control daemon that exits, and how long it
// has to run to count as healthy again (the back-off then starts over).
const (
	MPSRestartInitial = time.Second
	mpsRestartMax     = 30 * time.Second
	mpsStableAfter    = time.Minute
	// mpsStopWait is how long a daemon may take to exit after SIGTERM
	// before it is killed.
	mpsStopWait = 5 * time.Second
	// mpsOutputFile, in a GPU's log folder, takes the daemon's own output.
	mpsOutputFile = "control-daemon.out"
)

// MPSPipeDir is the pipe folder of the MPS daemon of the GPU at index:
// <dir>/gpu<index>/pipe. An index, not a UUID, keeps the daemon's socket
// paths under the 108-byte limit of a unix socket address.
func MPSPipeDir(dir string, index int) string {
	return filepath.Join(dir, "gpu"+strconv.Itoa(index), "pipe")
}

// MPSShmDir is the shared memory folder of all MPS daemons and clients.
func MPSShmDir(dir string) string {
	return filepath.Join(dir, "shm")
}

// MPSLogDir is the log folder of the MPS daemon of the GPU at index.
func MPSLogDir(dir string, index int) string {
	return filepath.Join(dir, "gpu"+strconv.Itoa(index), "log")
}

// MPSDaemons supervises one MPS control daemon per GPU the plugin shares:
// "<binary> -f" (foreground) with CUDA_VISIBLE_DEVICES naming the GPU and
// its own pipe and log folders, restarted with back-off when it exits,
// stopped with SIGTERM when the plugin stops.
type MPSDaemons struct {
	Binary string
	Dir    string
	GPUs   []vgpu.GPU
	Clock  clock.WithTicker
	// RestartInitial is MPSRestartInitial; a field so tests can shorten it.
	RestartInitial time.Duration
}

// Run supervises the daemons until ctx ends, then waits for them to exit.
func (m *MPSDaemons) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, g := range m.GPUs {
		wg.Go(func() { m.supervise(ctx, g) })
	}
	wg.Wait()
}

// supervise keeps the daemon of g running until ctx ends.
func (m *MPSDaemons) supervise(ctx context.Context, g vgpu.GPU) {
	logger := klog.FromContext(ctx).WithValues("gpu", g.UUID, "index", g.Index)
	delay := m.RestartInitial
	for starts := 1; ; starts++ {
		started := m.Clock.Now()
		logger.V(2).Info("Starting the MPS control daemon", "binary", m.Binary, "start", starts)
		err := m.runOnce(ctx, g)
		if ctx.Err() != nil {
			return
		}
		if m.Clock.Since(started) >= mpsStableAfter {
			delay = m.RestartInitial
		}
		logger.Error(err, "MPS control daemon exited; restarting", "in", delay, "logs", MPSLogDir(m.Dir, g.Index))
		t := m.Clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		delay = min(2*delay, mpsRestartMax)
	}
}

// runOnce runs the daemon of g until it exits or ctx ends.
func (m *MPSDaemons) runOnce(ctx context.Context, g vgpu.GPU) error {
	pipe, logs := MPSPipeDir(m.Dir, g.Index), MPSLogDir(m.Dir, g.Index)
	for _, d := range []string{pipe, logs} {
		if err := os.MkdirAll(d, 0o755); err != nil { //nolint:gosec // G301: GPU containers reach the pipes.
			return fmt.Errorf("MPS folder: %w", err)
		}
	}
	out, err := os.OpenFile(filepath.Join(logs, mpsOutputFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600) //nolint:gosec // G304: the plugin's own MPS folder.
	if err != nil {
		return fmt.Errorf("MPS daemon output: %w", err)
	}
	defer func() { _ = out.Close() }()
	cmd := exec.CommandContext(ctx, m.Binary, "-f") //nolint:gosec // G204: the operator's configured binary.
	cmd.Env = append(os.Environ(),
		"CUDA_VISIBLE_DEVICES="+g.UUID,
		EnvMPSPipeDirectory+"="+pipe,
		"CUDA_MPS_LOG_DIRECTORY="+logs,
	)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = mpsStopWait
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s -f: %w", m.Binary, err)
	}
	return fmt.Errorf("%s -f exited", m.Binary)
}
