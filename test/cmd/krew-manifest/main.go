package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run returns the exit code: 0 when the manifest was written, 1 when it
// could not be, 2 for bad usage.
func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("krew-manifest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	tmpl := fs.String("template", "", "the manifest template (hack/krew/gpuslice.yaml); required")
	tag := fs.String("tag", "", "the release tag, e.g. v0.1.0; required")
	archives := fs.String("archives", "", "folder with the archives the template names; required")
	out := fs.String("out", "", "where to write the manifest; required")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	for name, v := range map[string]string{"template": *tmpl, "tag": *tag, "archives": *archives, "out": *out} {
		if v == "" {
			fmt.Fprintf(stderr, "krew-manifest: --%s: required\n", name)
			return 2
		}
	}
	if err := write(*tmpl, *tag, *archives, *out); err != nil {
		fmt.Fprintf(stderr, "krew-manifest: %v\n", err)
		return 1
	}
	return 0
}

// write renders template for tag, validates it and writes it to out.
func write(template, tag, archives, out string) error {
	t, err := os.ReadFile(template) //nolint:gosec // G304: the template named on the command line.
	if err != nil {
		return err
	}
	m, err := Render(t, tag, archives)
	if err != nil {
		return err
	}
	p, err := Parse(m)
	if err != nil {
		return err
	}
	if err := Validate(strings.TrimSuffix(filepath.Base(template), ".yaml"), p); err != nil {
		return fmt.Errorf("%s for %s breaks krew's rules:\n%w", template, tag, err)
	}
	return os.WriteFile(out, m, 0o600)
}
