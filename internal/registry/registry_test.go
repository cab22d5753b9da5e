package registry

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

func TestSetNames(t *testing.T) {
	reg, err := New()
	if err != nil {
		t.Fatal(err)
	}
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"a"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "y_seconds", Help: "y"})
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "a_ready", Help: "a"}, func() float64 { return 1 })
	set, err := Register(reg, c, h, g)
	if err != nil {
		t.Fatal(err)
	}
	// Names lists what was registered, even a vector without a series yet.
	if diff := cmp.Diff([]string{"a_ready", "x_total", "y_seconds"}, set.Names()); diff != "" {
		t.Errorf("Names (-want +got):\n%s", diff)
	}
	if _, err := Register(reg, c); err == nil {
		t.Error("registering a collector twice succeeded")
	}
}
