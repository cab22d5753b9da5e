package nvidia

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuslice/gpuslice/vgpu"
)

// Backend satisfies the plugin's seam (deviceplugin.GPUBackend), restated
// here so that this package does not depend on the plugin.
var _ interface {
	GPUs() ([]vgpu.GPU, error)
	WatchHealth(ctx context.Context, events chan<- vgpu.HealthEvent) error
} = (*Backend)(nil)

const noDriverMessage = "NVML init failed: libnvidia-ml.so.1 not found (is the NVIDIA driver installed? use --fake-gpus to run without a GPU): ERROR_LIBRARY_NOT_FOUND"

func TestOpenNoDriver(t *testing.T) {
	lib := NoDriver()
	b, err := Open(Options{Library: lib})
	if b != nil {
		t.Errorf("Open returned a backend with error %v", err)
	}
	if !errors.Is(err, ErrNoDriver) || !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) {
		t.Errorf("Open error = %v, want ErrNoDriver and ERROR_LIBRARY_NOT_FOUND", err)
	}
	if err != nil && err.Error() != noDriverMessage {
		t.Errorf("Open error = %q, want %q", err, noDriverMessage)
	}
	// Any other call would have panicked: the mock has no other function.
	if got := len(lib.(*mock.Interface).InitCalls()); got != 1 {
		t.Errorf("Init calls = %d, want 1", got)
	}
}

func TestOpenInitFailures(t *testing.T) {
	tests := []struct {
		ret      nvml.Return
		noDriver bool
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, true},
		{nvml.ERROR_DRIVER_NOT_LOADED, true},
		{nvml.ERROR_LIB_RM_VERSION_MISMATCH, false},
		{nvml.ERROR_NO_PERMISSION, false},
		{nvml.ERROR_UNKNOWN, false},
	}
	for _, tc := range tests {
		t.Run(tc.ret.Error(), func(t *testing.T) {
			// Only Init is set: any later call panics.
			lib := &mock.Interface{InitFunc: func() nvml.Return { return tc.ret }}
			_, err := Open(Options{Library: lib})
			if !errors.Is(err, tc.ret) {
				t.Errorf("Open error = %v, want it to wrap %v", err, tc.ret)
			}
			if got := errors.Is(err, ErrNoDriver); got != tc.noDriver {
				t.Errorf("errors.Is(%v, ErrNoDriver) = %v, want %v", err, got, tc.noDriver)
			}
		})
	}
}

// TestOpenRealNVMLWithoutDriver runs go-nvml's real library. This machine
// and CI have no NVIDIA driver, so Init fails and nothing else may run.
func TestOpenRealNVMLWithoutDriver(t *testing.T) {
	tests := []struct {
		name string
		opts Options
	}{
		{"nvml.New()", Options{Library: nvml.New()}},
		{"default library", Options{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := Open(tc.opts)
			if err == nil {
				_ = b.Close()
				t.Skip("an NVIDIA driver is installed here; see nvml_real_test.go (-tags nvml)")
			}
			if !errors.Is(err, ErrNoDriver) {
				t.Fatalf("Open error = %v, want ErrNoDriver", err)
			}
			if err.Error() != noDriverMessage {
				t.Errorf("Open error = %q, want %q", err, noDriverMessage)
			}
		})
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		wantErr bool
	}{
		{"zero", Options{}, false},
		{"set", Options{CoolDown: time.Minute, EventWait: 5 * time.Second}, false},
		{"negative cool-down", Options{CoolDown: -time.Second}, true},
		{"negative event wait", Options{EventWait: -time.Second}, true},
		{"event wait under 1ms", Options{EventWait: time.Microsecond}, true},
		{"event wait over 1m", Options{EventWait: 2 * time.Minute}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.Validate()
			if (err != nil) != tc.wantErr {
				t.Errorf("Validate() = %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				if _, openErr := Open(Options{Library: NoDriver(), CoolDown: tc.opts.CoolDown, EventWait: tc.opts.EventWait}); openErr == nil || errors.Is(openErr, ErrNoDriver) {
					t.Errorf("Open with invalid options = %v, want a validation error before Init", openErr)
				}
			}
		})
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	f := newFixture(t, "dgxa100")
	for range 2 {
		if err := f.b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if _, err := f.b.GPUs(); !errors.Is(err, ErrClosed) {
		t.Errorf("GPUs after Close = %v, want ErrClosed", err)
	}
}
