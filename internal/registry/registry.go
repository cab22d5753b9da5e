// Package registry makes the Prometheus registry a gpuslice component
// serves on /metrics: its own, never the process-wide default, so that tests
// and several components in one process do not share counters.
package registry

import (
	"errors"
	"fmt"
	"regexp"
	"slices"

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

// Set is the collectors a component registered, kept so that the names of
// the metrics it exports can be listed from the code itself (the chart's
// dashboard and alerts are checked against them).
type Set []prometheus.Collector

// Register registers every collector in reg, returning them as a Set and
// every registration error joined.
func Register(reg *prometheus.Registry, cs ...prometheus.Collector) (Set, error) {
	var errs []error
	for _, c := range cs {
		errs = append(errs, reg.Register(c))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return Set(cs), nil
}

// fqNamePattern reads a metric's name out of a Desc's String form, the
// only place client_golang exposes it.
var fqNamePattern = regexp.MustCompile(`fqName: "([^"]+)"`)

// Names returns the names of the metrics the collectors describe, sorted
// and without repeats. A histogram is listed by its base name (PromQL
// reads its _bucket, _sum and _count series).
func (s Set) Names() []string {
	ch := make(chan *prometheus.Desc)
	go func() {
		defer close(ch)
		for _, c := range s {
			c.Describe(ch)
		}
	}()
	var names []string
	for d := range ch {
		if m := fqNamePattern.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}
