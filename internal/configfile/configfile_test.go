package configfile

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

type testConfig struct {
	Name  string   `json:"name"`
	Count int      `json:"count"`
	List  []string `json:"list,omitempty"`
}

// TestParse checks the order of precedence (defaults, then the file, then
// the flags given) and the errors for a bad file or a positional argument.
func TestParse(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good.yaml", "name: file\ncount: 3\nlist: [x]\n")
	unknown := write("unknown.yaml", "name: file\ncolour: blue\n")
	defaults := testConfig{Name: "default", Count: 1, List: []string{"a", "b"}}
	cases := []struct {
		name    string
		args    func() []string
		want    testConfig
		wantErr string
	}{
		{name: "defaults", args: func() []string { return nil }, want: defaults},
		{name: "flag only", args: func() []string { return []string{"--count=7"} }, want: testConfig{Name: "default", Count: 7, List: []string{"a", "b"}}},
		{name: "file over defaults, list replaced", args: func() []string { return []string{"--config=" + good} }, want: testConfig{Name: "file", Count: 3, List: []string{"x"}}},
		{name: "flag over file, before or after --config", args: func() []string { return []string{"--name=flag", "--config=" + good} }, want: testConfig{Name: "flag", Count: 3, List: []string{"x"}}},
		{name: "unknown field", args: func() []string { return []string{"--config=" + unknown} }, wantErr: "colour"},
		{name: "missing file", args: func() []string { return []string{"--config=" + filepath.Join(dir, "none.yaml")} }, wantErr: "no such file"},
		{name: "positional argument", args: func() []string { return []string{"extra"} }, wantErr: `unexpected argument "extra"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := defaults
			cfg.List = append([]string(nil), defaults.List...)
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			file := fs.String("config", "", "")
			fs.StringVar(&cfg.Name, "name", cfg.Name, "")
			fs.IntVar(&cfg.Count, "count", cfg.Count, "")
			err := Parse(fs, tc.args(), &cfg, defaults, file)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Parse error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if diff := cmp.Diff(tc.want, cfg); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
		})
	}
}

// TestList checks the comma-list flag value: blanks dropped, empty is empty,
// and String round-trips through Set.
func TestList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"  ", nil},
		{"a", []string{"a"}},
		{"a, b ,c", []string{"a", "b", "c"}},
	} {
		var l List
		if err := l.Set(tc.in); err != nil {
			t.Fatalf("Set(%q): %v", tc.in, err)
		}
		if diff := cmp.Diff(tc.want, []string(l)); diff != "" {
			t.Errorf("Set(%q) (-want +got):\n%s", tc.in, diff)
		}
		var again List
		if err := again.Set(l.String()); err != nil || !cmp.Equal([]string(l), []string(again)) {
			t.Errorf("Set(String()) of %q = %v, %v; want %v", tc.in, again, err, l)
		}
	}
}

// TestPort checks which addresses have a usable port.
func TestPort(t *testing.T) {
	for _, tc := range []struct {
		addr string
		port int
		ok   bool
	}{
		{":8080", 8080, true},
		{"127.0.0.1:0", 0, true},
		{"[::1]:65535", 65535, true},
		{"host:65536", 0, false},
		{"host:-1", 0, false},
		{"host:http", 0, false},
		{"8080", 0, false},
		{"", 0, false},
	} {
		port, ok := Port(tc.addr)
		if port != tc.port || ok != tc.ok {
			t.Errorf("Port(%q) = %d, %t; want %d, %t", tc.addr, port, ok, tc.port, tc.ok)
		}
	}
}
