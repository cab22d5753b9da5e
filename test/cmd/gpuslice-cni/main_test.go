package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestAdd(t *testing.T) {
	var out bytes.Buffer
	conf := `{"cniVersion": "1.0.0", "name": "gpuslice-local", "type": "gpuslice-cni"}`
	if err := run("ADD", "c0ffee", "/var/run/netns/cni-1", strings.NewReader(conf), &out); err != nil {
		t.Fatal(err)
	}
	var got struct {
		CNIVersion string `json:"cniVersion"`
		Interfaces []struct {
			Name, Sandbox string
		} `json:"interfaces"`
		IPs []struct {
			Address   string `json:"address"`
			Interface int    `json:"interface"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("result %s: %v", out.String(), err)
	}
	if got.CNIVersion != "1.0.0" || len(got.Interfaces) != 1 || got.Interfaces[0].Name != "eth0" || got.Interfaces[0].Sandbox != "/var/run/netns/cni-1" {
		t.Errorf("result %s: want CNI 1.0.0 with interface eth0 in the pod's namespace", out.String())
	}
	if len(got.IPs) != 1 || !strings.HasPrefix(got.IPs[0].Address, "10.244.") || got.IPs[0].Interface != 0 {
		t.Errorf("result %s: want one 10.244.x.y address on interface 0", out.String())
	}
	var again bytes.Buffer
	if err := run("ADD", "c0ffee", "/var/run/netns/cni-1", strings.NewReader(conf), &again); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(out.String(), again.String()); diff != "" {
		t.Errorf("the same container got another result (-first +second):\n%s", diff)
	}
}

func TestCommands(t *testing.T) {
	for name, tt := range map[string]struct {
		command, id, conf string
		wantErr           string
		wantOut           string
	}{
		"version":         {command: "VERSION", wantOut: `"supportedVersions"`},
		"del":             {command: "DEL", id: "c0ffee"},
		"check":           {command: "CHECK", id: "c0ffee"},
		"unknown command": {command: "FROB", wantErr: `CNI_COMMAND="FROB"`},
		"add without id":  {command: "ADD", conf: `{"cniVersion": "1.0.0"}`, wantErr: "CNI_CONTAINERID is empty"},
		"add bad config":  {command: "ADD", id: "c0ffee", conf: `{`, wantErr: "network configuration"},
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(tt.command, tt.id, "", strings.NewReader(tt.conf), &out)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), tt.wantOut) {
				t.Errorf("output %q, want it to contain %q", out.String(), tt.wantOut)
			}
		})
	}
}
