package vgpu_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/vgpu"
)

// malformedCase is one bad annotation value: valid with old replaced by new.
type malformedCase struct {
	name     string
	old, new string
	want     error
}

// commonMalformed applies to every value; old "" means new is the whole
// value.
var commonMalformed = []malformedCase{
	{"empty", "", "", vgpu.ErrMalformed},
	{"not JSON", "", "gpu-node-1,GPU-0,81920", vgpu.ErrMalformed},
	{"JSON null", "", "null", vgpu.ErrMalformed},
	{"JSON array", "", "[]", vgpu.ErrMalformed},
	{"JSON string", "", `"x"`, vgpu.ErrMalformed},
	{"empty object", "", "{}", vgpu.ErrMalformed},
	{"missing version", `"version":1,`, ``, vgpu.ErrMalformed},
	{"version as string", `"version":1`, `"version":"1"`, vgpu.ErrMalformed},
	{"version null", `"version":1`, `"version":null`, vgpu.ErrMalformed},
	{"version fraction", `"version":1`, `"version":1.5`, vgpu.ErrMalformed},
	{"version 0", `"version":1`, `"version":0`, vgpu.ErrUnknownVersion},
	{"version 2", `"version":1`, `"version":2`, vgpu.ErrUnknownVersion},
	{"version 2 with other fields", `"version":1,`, `"version":2,"future":true,`, vgpu.ErrUnknownVersion},
	{"unknown field", `"version":1`, `"version":1,"extra":0`, vgpu.ErrMalformed},
	{"truncated", `"version":1`, `"version":`, vgpu.ErrMalformed},
	{"trailing data", `"node":"gpu-node-1"`, `"node":"gpu-node-1"}{`, vgpu.ErrMalformed},
	{"missing node", `"node":"gpu-node-1",`, ``, vgpu.ErrMalformed},
	{"null node", `"node":"gpu-node-1"`, `"node":null`, vgpu.ErrMalformed},
	{"empty node", `"node":"gpu-node-1"`, `"node":""`, vgpu.ErrMalformed},
	{"node as number", `"node":"gpu-node-1"`, `"node":1`, vgpu.ErrMalformed},
}

// checkMalformed runs each case through parse, which must return an error
// wrapping the case's sentinel and the zero value.
func checkMalformed[T any](t *testing.T, valid string, cases []malformedCase, parse func(string) (T, error)) {
	t.Helper()
	for _, tc := range append(append([]malformedCase(nil), commonMalformed...), cases...) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := tc.new
			if tc.old != "" {
				if !strings.Contains(valid, tc.old) {
					t.Fatalf("%s does not contain %s", valid, tc.old)
				}
				in = strings.Replace(valid, tc.old, tc.new, 1)
			}
			got, err := parse(in)
			if !errors.Is(err, tc.want) {
				t.Errorf("parse(%s) error = %v, want %v", in, err, tc.want)
			}
			var zero T
			if diff := cmp.Diff(zero, got); diff != "" {
				t.Errorf("parse(%s) returned a value with its error (-want +got):\n%s", in, diff)
			}
		})
	}
}

func TestParseNodeInventoryMalformed(t *testing.T) {
	t.Parallel()
	valid, err := vgpu.EncodeNodeInventory(exampleNodeInventory())
	if err != nil {
		t.Fatal(err)
	}
	const uuid0 = `"uuid":"GPU-8b3c6f2e-1d4a-4f5b-9c7e-0a1b2c3d4e5f"`
	checkMalformed(t, valid, []malformedCase{
		{"missing gpus", valid[strings.Index(valid, `,"gpus":`):], `}`, vgpu.ErrMalformed},
		{"null gpus", valid[strings.Index(valid, `"gpus":`):], `"gpus":null}`, vgpu.ErrMalformed},
		{"gpus not a list", valid[strings.Index(valid, `"gpus":`):], `"gpus":{"a":1}}`, vgpu.ErrMalformed},
		{"split count 0", `"splitCount":10`, `"splitCount":0`, vgpu.ErrMalformed},
		{"split count negative", `"splitCount":10`, `"splitCount":-1`, vgpu.ErrMalformed},
		{"split count fraction", `"splitCount":10`, `"splitCount":1.5`, vgpu.ErrMalformed},
		{"memory scaling 0", `"memoryScaling":1`, `"memoryScaling":0`, vgpu.ErrMalformed},
		{"memory scaling negative", `"memoryScaling":1`, `"memoryScaling":-1`, vgpu.ErrMalformed},
		{"memory scaling out of range", `"memoryScaling":1`, `"memoryScaling":1e400`, vgpu.ErrMalformed},
		{"empty UUID", uuid0, `"uuid":""`, vgpu.ErrMalformed},
		{"missing UUID", uuid0 + ",", ``, vgpu.ErrMalformed},
		{"duplicate UUID", `"GPU-0f9e8d7c-6b5a-4c3d-8e1f-2a3b4c5d6e7f"`, `"GPU-8b3c6f2e-1d4a-4f5b-9c7e-0a1b2c3d4e5f"`, vgpu.ErrMalformed},
		{"duplicate index", `"index":1`, `"index":0`, vgpu.ErrMalformed},
		{"negative index", `"index":1`, `"index":-1`, vgpu.ErrMalformed},
		{"missing index", `"index":0,`, ``, vgpu.ErrMalformed},
		{"negative memory", `"totalMemoryMiB":81920`, `"totalMemoryMiB":-1`, vgpu.ErrMalformed},
		{"zero memory", `"totalMemoryMiB":81920`, `"totalMemoryMiB":0`, vgpu.ErrMalformed},
		{"negative schedulable memory", `"schedulableMemoryMiB":81408`, `"schedulableMemoryMiB":-1`, vgpu.ErrMalformed},
		{"memory as string", `"totalMemoryMiB":81920`, `"totalMemoryMiB":"81920"`, vgpu.ErrMalformed},
		{"cores above 100", `"coresPercent":100`, `"coresPercent":101`, vgpu.ErrMalformed},
		{"NUMA node below -1", `"numaNode":1`, `"numaNode":-2`, vgpu.ErrMalformed},
		{"unknown health", `"health":"Unhealthy"`, `"health":"Sick"`, vgpu.ErrMalformed},
		{"unknown GPU field", uuid0, uuid0 + `,"mig":true`, vgpu.ErrMalformed},
	}, vgpu.ParseNodeInventory)
}

func TestParsePluginHeartbeatMalformed(t *testing.T) {
	t.Parallel()
	valid, err := vgpu.EncodePluginHeartbeat(examplePluginHeartbeat())
	if err != nil {
		t.Fatal(err)
	}
	const at = `"registeredAt":"2026-03-14T09:26:53Z"`
	checkMalformed(t, valid, []malformedCase{
		{"empty resource name", `"resourceName":"hami.io/gpu"`, `"resourceName":""`, vgpu.ErrMalformed},
		{"missing plugin version", `"pluginVersion":"v0.1.0",`, ``, vgpu.ErrMalformed},
		{"registered as string", `"registered":true`, `"registered":"true"`, vgpu.ErrMalformed},
		{"missing registered", `"registered":true,`, ``, vgpu.ErrMalformed},
		{"registered without time", at, `"registeredAt":""`, vgpu.ErrMalformed},
		{"registered without socket", `"socket":"gpuslice-1773480413.sock"`, `"socket":""`, vgpu.ErrMalformed},
		{"time not RFC 3339", at, `"registeredAt":"14 Mar 26 09:26 UTC"`, vgpu.ErrMalformed},
		{"time with offset", at, `"registeredAt":"2026-03-14T10:26:53+01:00"`, vgpu.ErrMalformed},
		{"time with fraction", at, `"registeredAt":"2026-03-14T09:26:53.5Z"`, vgpu.ErrMalformed},
		{"time as number", at, `"registeredAt":1773480413`, vgpu.ErrMalformed},
	}, vgpu.ParsePluginHeartbeat)
}

func TestParsePodAllocationMalformed(t *testing.T) {
	t.Parallel()
	valid, err := vgpu.EncodePodAllocation(examplePodAllocation())
	if err != nil {
		t.Fatal(err)
	}
	const train = `"name":"train"`
	const slice = `"memoryMiB":10240,"coresPercent":30`
	checkMalformed(t, valid, []malformedCase{
		{"no containers", valid[strings.Index(valid, `"containers":`):], `"containers":[]}`, vgpu.ErrMalformed},
		{"null containers", valid[strings.Index(valid, `"containers":`):], `"containers":null}`, vgpu.ErrMalformed},
		{"missing containers", valid[strings.Index(valid, `,"containers":`):], `}`, vgpu.ErrMalformed},
		{"empty container name", train, `"name":""`, vgpu.ErrMalformed},
		{"duplicate container name", train, `"name":"warmup"`, vgpu.ErrMalformed},
		{"missing init", train + `,"init":false,`, train + `,`, vgpu.ErrMalformed},
		{"container without slices", `"init":true,"gpus":[{"uuid":"GPU-8b3c6f2e-1d4a-4f5b-9c7e-0a1b2c3d4e5f","memoryMiB":2048,"coresPercent":0}]`, `"init":true,"gpus":[]`, vgpu.ErrMalformed},
		{"same GPU twice in a container", `"GPU-0f9e8d7c-6b5a-4c3d-8e1f-2a3b4c5d6e7f"`, `"GPU-8b3c6f2e-1d4a-4f5b-9c7e-0a1b2c3d4e5f"`, vgpu.ErrMalformed},
		{"empty UUID", `"uuid":"GPU-0f9e8d7c-6b5a-4c3d-8e1f-2a3b4c5d6e7f"`, `"uuid":""`, vgpu.ErrMalformed},
		{"zero memory", slice, `"memoryMiB":0,"coresPercent":30`, vgpu.ErrMalformed},
		{"negative memory", slice, `"memoryMiB":-10240,"coresPercent":30`, vgpu.ErrMalformed},
		{"memory beyond int64", slice, `"memoryMiB":9223372036854775808,"coresPercent":30`, vgpu.ErrMalformed},
		{"cores above 100", slice, `"memoryMiB":10240,"coresPercent":150`, vgpu.ErrMalformed},
		{"negative cores", slice, `"memoryMiB":10240,"coresPercent":-1`, vgpu.ErrMalformed},
		{"missing cores", slice, `"memoryMiB":10240`, vgpu.ErrMalformed},
		{"unknown slice field", slice, slice + `,"mig":"1g.10gb"`, vgpu.ErrMalformed},
	}, vgpu.ParsePodAllocation)
}

func TestParseErrorMessages(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		parse func() error
		want  string
	}{{
		name: "invalid slice names its path and value",
		parse: func() error {
			_, err := vgpu.ParsePodAllocation(`{"version":1,"node":"n","containers":[{"name":"c","init":false,"gpus":[{"uuid":"GPU-a","memoryMiB":1,"coresPercent":150}]}]}`)
			return err
		},
		want: "parse hami.io/gpu-allocation: malformed value: containers[0].gpus[0].coresPercent=150: must be from 0 to 100",
	}, {
		name: "missing fields are listed",
		parse: func() error {
			_, err := vgpu.ParsePodAllocation(`{"version":1,"node":"n","containers":[{"name":"c","gpus":[{"uuid":"GPU-a"}]}]}`)
			return err
		},
		want: "parse hami.io/gpu-allocation: malformed value: missing required fields: containers[0].init, containers[0].gpus[0].memoryMiB, containers[0].gpus[0].coresPercent",
	}, {
		name: "unknown version",
		parse: func() error {
			_, err := vgpu.ParseNodeInventory(`{"version":2}`)
			return err
		},
		want: "parse hami.io/node-gpu-inventory: unknown version: version=2: this reader knows version 1 only",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.parse()
			if err == nil || err.Error() != tt.want {
				t.Errorf("error = %v\nwant    %s", err, tt.want)
			}
		})
	}
}
