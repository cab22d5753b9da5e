package vgpu

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestNodeReadiness(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		invErr      error
		label       string
		hasLabel    bool
		allocatable int64
		want        Readiness
	}{
		"ready":         {nil, "true", true, 8, Readiness{}},
		"no inventory":  {ErrNoInventory, "true", true, 8, Readiness{ReasonNoInventory, "plugin not ready: no hami.io/node-gpu-inventory annotation on the node"}},
		"malformed":     {errors.New("parse: bad"), "true", true, 8, Readiness{ReasonMalformedInventory, "plugin not ready: parse: bad"}},
		"no label":      {nil, "", false, 8, Readiness{ReasonReadyLabel, "plugin not ready: label hami.io/gpu.ready is missing"}},
		"label false":   {nil, "false", true, 8, Readiness{ReasonReadyLabel, `plugin not ready: label hami.io/gpu.ready is "false"`}},
		"label garbled": {nil, "yes", true, 8, Readiness{ReasonReadyLabel, `plugin not ready: label hami.io/gpu.ready is "yes" (must be "true" or "false")`}},
		"no devices":    {nil, "true", true, 0, Readiness{ReasonNoAllocatable, "plugin not ready: allocatable hami.io/gpu is 0"}},
		// The first failing check wins.
		"all wrong": {ErrNoInventory, "", false, 0, Readiness{ReasonNoInventory, "plugin not ready: no hami.io/node-gpu-inventory annotation on the node"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := NodeReadiness(tt.invErr, tt.label, tt.hasLabel, tt.allocatable, ResourceGPU)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("NodeReadiness (-want +got):\n%s", diff)
			}
			if got.Ready() != (tt.want.Reason == "") {
				t.Errorf("Ready() = %t for %+v", got.Ready(), got)
			}
		})
	}
}

func TestHeartbeatReadiness(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	fresh := now.Add(-5 * time.Second)
	registered := PluginHeartbeat{Node: "n", ResourceName: string(ResourceGPU), Registered: true, RegisteredAt: fresh, Socket: "s.sock"}
	tests := map[string]struct {
		h    Heartbeat
		want Readiness
	}{
		"registered":     {Heartbeat{Exists: true, RenewTime: fresh, Raw: "{}", Parsed: registered}, Readiness{}},
		"older plugin":   {Heartbeat{Exists: true, RenewTime: fresh}, Readiness{}},
		"no lease":       {Heartbeat{}, Readiness{ReasonNoHeartbeat, "plugin not ready: no heartbeat Lease in namespace kube-node-lease"}},
		"no renewTime":   {Heartbeat{Exists: true}, Readiness{ReasonNoHeartbeat, "plugin not ready: heartbeat Lease has no renewTime"}},
		"stale":          {Heartbeat{Exists: true, RenewTime: now.Add(-2 * time.Minute)}, Readiness{ReasonStaleHeartbeat, "plugin not ready: heartbeat Lease not renewed for more than 1m0s"}},
		"malformed":      {Heartbeat{Exists: true, RenewTime: fresh, Raw: "{", Err: errors.New("parse: bad")}, Readiness{ReasonNotRegistered, "plugin not ready: parse: bad"}},
		"not registered": {Heartbeat{Exists: true, RenewTime: fresh, Raw: "{}", Parsed: PluginHeartbeat{Node: "n"}}, Readiness{ReasonNotRegistered, "plugin not ready: heartbeat says the device plugin is not registered with the kubelet"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := HeartbeatReadiness(tt.h, now, time.Minute, DefaultHeartbeatNamespace)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("HeartbeatReadiness (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPluginReadiness checks that what the Node says comes before its
// heartbeat, which is judged only for a Node that is ready.
func TestPluginReadiness(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	fresh := Heartbeat{Exists: true, RenewTime: now.Add(-5 * time.Second)}
	noLabel := NodeReadiness(nil, "", false, 8, ResourceGPU)
	tests := map[string]struct {
		node Readiness
		h    Heartbeat
		want Readiness
	}{
		"ready":                {Readiness{}, fresh, Readiness{}},
		"node first":           {noLabel, Heartbeat{}, noLabel},
		"node with fresh beat": {noLabel, fresh, noLabel},
		"heartbeat then":       {Readiness{}, Heartbeat{}, Readiness{ReasonNoHeartbeat, "plugin not ready: no heartbeat Lease in namespace kube-node-lease"}},
		"stale by the default": {Readiness{}, Heartbeat{Exists: true, RenewTime: now.Add(-DefaultHeartbeatMaxAge - time.Second)}, Readiness{ReasonStaleHeartbeat, "plugin not ready: heartbeat Lease not renewed for more than 1m0s"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got := PluginReadiness(tt.node, tt.h, now, DefaultHeartbeatMaxAge, DefaultHeartbeatNamespace)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("PluginReadiness (-want +got):\n%s", diff)
			}
		})
	}
}
