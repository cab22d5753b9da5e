// Package registry makes the Prometheus registry a gpuslice component
// serves on /metrics: its own, never the process-wide default, so that tests
// and several components in one process do not share counters.
package registry

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// New returns a new registry holding the Go runtime and process
// collectors, to which the caller adds its own metrics.
func New() (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	if err := errors.Join(
		reg.Register(collectors.NewGoCollector()),
		reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})),
	); err != nil {
		return nil, fmt.Errorf("metrics registry: %w", err)
	}
	return reg, nil
}
