package vgpu

import "fmt"

// FieldError is a configuration error of any gpuslice component: it names
// the field (as written in the config file), the value as set and what is
// allowed, on one line.
type FieldError struct {
	// Field is the field's name in the config file, e.g. "splitCount".
	Field string
	// Value is the value as set.
	Value string
	// Allowed says what would be accepted.
	Allowed string
}

// InvalidField returns a *FieldError for field set to value.
func InvalidField(field, value, allowed string) *FieldError {
	return &FieldError{Field: field, Value: value, Allowed: allowed}
}

// Error renders e as `invalid config: splitCount="0": must be …`.
func (e *FieldError) Error() string {
	return fmt.Sprintf("invalid config: %s=%q: %s", e.Field, e.Value, e.Allowed)
}
