package dra

import (
	"errors"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/gpuslice/gpuslice/internal/probe"
)

// ErrNotReady is Ready's error before the driver has published its
// ResourceSlice and the kubelet has registered it.
var ErrNotReady = errors.New("dra: driver not registered with the kubelet or ResourceSlice not yet handed to the publisher")

// Ready returns nil once the driver has handed its first ResourceSlice to
// the helper's publisher and the kubelet has reported the plugin
// registered; ErrNotReady (wrapped with the kubelet's error, if any)
// before. Safe for concurrent use.
func (d *Driver) Ready() error {
	d.mu.Lock()
	helper, published := d.helper, d.published
	d.mu.Unlock()
	if helper == nil || !published {
		return ErrNotReady
	}
	st := helper.RegistrationStatus()
	switch {
	case st == nil:
		return ErrNotReady
	case !st.PluginRegistered:
		return errors.Join(ErrNotReady, errors.New(st.Error))
	}
	return nil
}

// ProbeHandler serves the probes: /healthz (200 while the process serves)
// and /readyz (200 while Ready returns nil, else 503). /metrics answers 404:
// the driver exports no metrics of its own yet.
func (d *Driver) ProbeHandler() http.Handler {
	r := mux.NewRouter()
	probe.Routes(r, d.Ready, http.NotFoundHandler())
	return r
}
