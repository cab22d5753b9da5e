package webhook

import "strings"

// JSONPatchOp is one RFC 6902 operation. Mutate writes "add" and
// "replace", whose Value is always set (a string: a scheduler name or a
// quantity; or a map[string]string: a whole resource list), and, with
// Config.HAMiCompat, "move" (From set, no Value) and "remove" (no Value).
type JSONPatchOp struct {
	// Op is "add", "replace", "move" or "remove".
	Op string `json:"op"`
	// From is the pointer a "move" takes its value from.
	From string `json:"from,omitempty"`
	// Path is an RFC 6901 JSON pointer into the Pod, e.g.
	// "/spec/containers/0/resources/limits/hami.io~1gpu".
	Path string `json:"path"`
	// Value is the new value at Path; nil (left out) for "move" and
	// "remove".
	Value any `json:"value,omitempty"`
}

// pointer joins tokens into an RFC 6901 JSON pointer, escaping "~" as "~0"
// and then "/" as "~1" in each: pointer("spec", "hami.io/gpu") is
// "/spec/hami.io~1gpu".
func pointer(tokens ...string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteByte('/')
		b.WriteString(strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1"))
	}
	return b.String()
}
