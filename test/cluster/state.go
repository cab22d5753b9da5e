package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// saveState writes the state file.
func (c *Cluster) saveState() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.saveStateLocked()
}

// saveStateLocked writes the state file atomically (a new file renamed over the old); c.mu is held.
func (c *Cluster) saveStateLocked() error {
	b, err := json.MarshalIndent(c.State, "", "  ")
	if err != nil {
		return fmt.Errorf("encode cluster state: %w", err)
	}
	path := c.StatePath()
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("write cluster state: %w", err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		return fmt.Errorf("write cluster state: %w", err)
	}
	return nil
}

// LoadState reads the state file at path, written by a Cluster in this or another process.
// A missing file wraps fs.ErrNotExist.
func LoadState(path string) (State, error) {
	var st State
	b, err := os.ReadFile(path) //nolint:gosec // G304: the caller names its state file
	if err != nil {
		return st, fmt.Errorf("read cluster state: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("parse cluster state %s: %w", path, err)
	}
	return st, nil
}

// Down stops the cluster whose state file is at path, from any process: each recorded process is
// stopped by PID (SIGTERM to its process group, then SIGKILL; a PID now held by another process is
// left alone) and the cluster's folder, state file included, is removed. A missing state file is
// not an error: there is nothing to stop.
func Down(path string) error {
	st, err := LoadState(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return stopState(st)
}
