package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
)

// auditPolicy logs every request but reads (get, list, watch) once complete, at level Metadata
// (who, what, when, the answer's code; no bodies).
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: None
  verbs: ["get", "list", "watch"]
- level: Metadata
`

// AuditLogPath returns the API server's audit log (Options.Audit).
func (c *Cluster) AuditLogPath() string {
	return filepath.Join(c.State.Dir, APIServerName, "audit.log")
}

// AuditWrites reads the audit log (Options.Audit): every request but reads the API server has
// answered so far, in the order logged (the API server's restarts append to it). The log is
// written before each answer is sent (mode blocking), so a request whose answer was seen is in it.
func (c *Cluster) AuditWrites() ([]auditv1.Event, error) {
	b, err := os.ReadFile(c.AuditLogPath())
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	lines := bytes.Split(b, []byte("\n"))
	// What follows the last newline is empty, or a line still being written.
	lines = lines[:len(lines)-1]
	events := make([]auditv1.Event, 0, len(lines))
	for i, line := range lines {
		var e auditv1.Event
		if err := json.Unmarshal(line, &e); err != nil {
			return nil, fmt.Errorf("audit log %s line %d: %w", c.AuditLogPath(), i+1, err)
		}
		events = append(events, e)
	}
	return events, nil
}
