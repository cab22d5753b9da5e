// Package configfile reads a component's configuration from a YAML or JSON
// file and layers its command-line flags over it, the same way for every
// gpuslice binary: defaults, then the file, then the flags given.
package configfile

import (
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Load reads the YAML or JSON file at path over base: fields the file sets
// replace base's (a list replaces base's list), fields it leaves out keep
// base's values. Unknown fields are an error naming the field, so a misspelt
// key is reported rather than ignored. It does not validate the result.
func Load[T any](path string, base T) (T, error) {
	data, err := os.ReadFile(path) //nolint:gosec // G304: the operator names the file.
	if err != nil {
		return base, fmt.Errorf("config file: %w", err)
	}
	cfg := base
	if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
		return base, fmt.Errorf("config file %s: %w", path, err)
	}
	return cfg, nil
}

// Parse parses args into fs, whose flags are bound to the fields of *cfg.
// When *file names a file after parsing, the file is read over defaults, the
// result replaces *cfg, and every flag given on the command line is applied
// again: flags override the file, which overrides the defaults. Positional
// arguments are an error. It does not validate the result.
func Parse[T any](fs *flag.FlagSet, args []string, cfg *T, defaults T, file *string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags only)", fs.Arg(0))
	}
	if *file == "" {
		return nil
	}
	set := map[string]string{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = f.Value.String() })
	loaded, err := Load(*file, defaults)
	if err != nil {
		return err
	}
	*cfg = loaded
	for name, value := range set {
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("--%s: %w", name, err)
		}
	}
	return nil
}

// List is a flag.Value for a comma-separated list bound to a []string
// field: blanks around entries are dropped, an empty value is an empty list,
// and its String form sets it again to the same list.
type List []string

// String joins the entries with commas.
func (l *List) String() string { return strings.Join(*l, ",") }

// Set replaces the list with the entries of s.
func (l *List) Set(s string) error {
	*l = nil
	if strings.TrimSpace(s) == "" {
		return nil
	}
	for _, e := range strings.Split(s, ",") {
		*l = append(*l, strings.TrimSpace(e))
	}
	return nil
}

// Port returns the port of an address written host:port (the host may be
// empty, meaning every interface), and false when addr is not of that form
// or the port is not a number from 0 to 65535. Callers apply their own
// lower bound and name their field in the error.
func Port(addr string) (int, bool) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, false
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return 0, false
	}
	return n, true
}
