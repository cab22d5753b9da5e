package simulate_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu/simulate"
)

// variantStats is what a variant's family changes in a task list.
type variantStats struct {
	Tasks, GPUTasks, CPUOnly, Pinned int
	RequestMilli, MultiMilli         int64
}

func statsOf(tasks []simulate.Task) variantStats {
	var s variantStats
	s.Tasks = len(tasks)
	for _, t := range tasks {
		if t.GPUs == 0 {
			s.CPUOnly++
		} else {
			s.GPUTasks++
			s.RequestMilli += t.DemandMilli()
			if t.GPUs > 1 {
				s.MultiMilli += t.DemandMilli()
			}
		}
		if len(t.Models) > 0 {
			s.Pinned++
		}
	}
	return s
}

func TestMakeVariant(t *testing.T) {
	t.Parallel()
	_, base := readTestdata(t)
	// As in the trace's default list, no task is pinned to a model.
	for i := range base {
		base[i].Models = nil
	}
	baseStats := statsOf(base)
	tests := map[string]struct {
		name  string
		check func(t *testing.T, got variantStats)
	}{
		"gpuspec pins a share of the GPU tasks": {"gpuspec50", func(t *testing.T, got variantStats) {
			want := baseStats
			want.Pinned = (baseStats.GPUTasks + 1) / 2
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("stats mismatch (-want +got):\n%s", diff)
			}
		}},
		"multigpu adds multi-GPU tasks until their share": {"multigpu60", func(t *testing.T, got variantStats) {
			if got.CPUOnly != baseStats.CPUOnly || got.Tasks <= baseStats.Tasks ||
				float64(got.MultiMilli) < 0.6*float64(got.RequestMilli) {
				t.Errorf("stats %+v, want more tasks, multi-GPU 60%% of the request, CPU-only as in %+v", got, baseStats)
			}
		}},
		"cpu sets the share of CPU-only tasks": {"cpu500", func(t *testing.T, got variantStats) {
			if got.GPUTasks != baseStats.GPUTasks || got.CPUOnly < got.GPUTasks || got.CPUOnly > got.GPUTasks+1 {
				t.Errorf("stats %+v, want the base's GPU tasks and as many CPU-only tasks", got)
			}
		}},
		"cpu0 drops CPU-only tasks": {"cpu0", func(t *testing.T, got variantStats) {
			if got.CPUOnly != 0 || got.GPUTasks != baseStats.GPUTasks {
				t.Errorf("stats %+v, want the base's GPU tasks only", got)
			}
		}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			v, err := simulate.ParseVariant(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			got, err := simulate.MakeVariant(base, v)
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, statsOf(got))
			again, _ := simulate.MakeVariant(base, v)
			if diff := cmp.Diff(got, again); diff != "" {
				t.Errorf("MakeVariant is not deterministic (-first +second):\n%s", diff)
			}
		})
	}
}

func TestParseVariantErrors(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"", "gpuspec", "gpuspec0", "gpuspec100", "multigpu-5", "cpu991", "gpushare40", "default"} {
		if _, err := simulate.ParseVariant(name); !errors.Is(err, simulate.ErrVariant) {
			t.Errorf("ParseVariant(%q) error = %v, want ErrVariant", name, err)
		}
	}
	for _, v := range simulate.Variants() {
		if got, err := simulate.ParseVariant(v.Name); err != nil || got != v {
			t.Errorf("ParseVariant(%q) = %+v, %v; want %+v", v.Name, got, err, v)
		}
	}
	if _, err := simulate.MakeVariant(nil, simulate.VariantSpec{Family: simulate.FamilyMultiGPU, Percent: 20, Name: "multigpu20"}); !errors.Is(err, simulate.ErrVariant) {
		t.Errorf("MakeVariant of an empty list: error = %v, want ErrVariant", err)
	}
}
