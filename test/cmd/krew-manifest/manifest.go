package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"text/template"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Plugin is a krew plugin manifest (krew's pkg/index types, apiVersion
// krew.googlecontainertools.github.com/v1alpha2), the fields krew reads.
type Plugin struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              PluginSpec `json:"spec"`
}

// PluginSpec is a plugin's description and its archive per platform.
type PluginSpec struct {
	Version          string     `json:"version,omitempty"`
	ShortDescription string     `json:"shortDescription,omitempty"`
	Description      string     `json:"description,omitempty"`
	Caveats          string     `json:"caveats,omitempty"`
	Homepage         string     `json:"homepage,omitempty"`
	Platforms        []Platform `json:"platforms,omitempty"`
}

// Platform is the archive of one os/arch and the plugin's binary in it.
type Platform struct {
	URI      string                `json:"uri,omitempty"`
	Sha256   string                `json:"sha256,omitempty"`
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
	Files    []FileOperation       `json:"files"`
	Bin      string                `json:"bin"`
}

// FileOperation copies files of the archive into the installation.
type FileOperation struct {
	From string `json:"from,omitempty"`
	To   string `json:"to,omitempty"`
}

// krew's constants for a manifest.
const (
	krewAPIVersion = "krew.googlecontainertools.github.com/v1alpha2"
	krewKind       = "Plugin"
)

var (
	safeName = regexp.MustCompile(`^[\w-]+$`)
	sha256Re = regexp.MustCompile(`^[a-f0-9]{64}$`)
	// semverRe is a "v"-prefixed semantic version, as krew requires.
	semverRe = regexp.MustCompile(`^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$`)
)

// Render executes the manifest template for tag: .TagName is tag, and
// addURIAndSha(url, tag) renders url with the same .TagName and becomes
// "uri: URL" and, on the next line, "sha256: HASH" of the archive named by
// the URL's last element, read from archives.
func Render(tmpl []byte, tag, archives string) ([]byte, error) {
	data := struct{ TagName string }{tag}
	funcs := template.FuncMap{"addURIAndSha": func(url, tag string) (string, error) {
		u, err := template.New("url").Parse(url)
		if err != nil {
			return "", fmt.Errorf("addURIAndSha %q: %w", url, err)
		}
		var b strings.Builder
		if err := u.Execute(&b, struct{ TagName string }{tag}); err != nil {
			return "", fmt.Errorf("addURIAndSha %q: %w", url, err)
		}
		archive := filepath.Join(archives, path.Base(b.String()))
		content, err := os.ReadFile(archive) //nolint:gosec // G304: an archive in the folder named on the command line.
		if err != nil {
			return "", fmt.Errorf("addURIAndSha %s: the archive to hash: %w", b.String(), err)
		}
		sum := sha256.Sum256(content)
		return fmt.Sprintf("uri: %s\n    sha256: %s", b.String(), hex.EncodeToString(sum[:])), nil
	}}
	t, err := template.New("manifest").Funcs(funcs).Parse(string(tmpl))
	if err != nil {
		return nil, fmt.Errorf("manifest template: %w", err)
	}
	var out bytes.Buffer
	if err := t.Execute(&out, data); err != nil {
		return nil, fmt.Errorf("manifest template: %w", err)
	}
	return out.Bytes(), nil
}

// Parse reads a manifest strictly: an unknown field is an error, as a typo
// krew would ignore.
func Parse(manifest []byte) (Plugin, error) {
	var p Plugin
	if err := yaml.UnmarshalStrict(manifest, &p); err != nil {
		return Plugin{}, fmt.Errorf("manifest: %w", err)
	}
	return p, nil
}

// Validate applies krew's rules for the manifest of plugin name (its file
// name without .yaml): apiVersion and kind, a safe name equal to
// metadata.name, a one-line short description, a "v"-prefixed semantic
// version, and for each platform a uri, a sha256 of 64 hex digits, a bin,
// from/to on every file operation and a selector on os and arch only.
// Every broken rule is reported, each naming its field.
func Validate(name string, p Plugin) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if p.APIVersion != krewAPIVersion {
		bad("apiVersion=%q: must be %s", p.APIVersion, krewAPIVersion)
	}
	if p.Kind != krewKind {
		bad("kind=%q: must be %s", p.Kind, krewKind)
	}
	if !safeName.MatchString(name) {
		bad("plugin name %q: must match %s", name, safeName)
	}
	if p.Name != name {
		bad("metadata.name=%q: must be the file's name %q", p.Name, name)
	}
	switch d := p.Spec.ShortDescription; {
	case d == "":
		bad("spec.shortDescription: must be set")
	case strings.ContainsAny(d, "\r\n"):
		bad("spec.shortDescription: must be one line")
	}
	if !semverRe.MatchString(p.Spec.Version) {
		bad("spec.version=%q: must be a semantic version with a v prefix, e.g. v0.1.0", p.Spec.Version)
	}
	if len(p.Spec.Platforms) == 0 {
		bad("spec.platforms: must list at least one platform")
	}
	for i, pl := range p.Spec.Platforms {
		errs = append(errs, validatePlatform(fmt.Sprintf("spec.platforms[%d]", i), pl)...)
	}
	return errors.Join(errs...)
}

func validatePlatform(field string, p Platform) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(field+"."+format, args...)) }
	if p.URI == "" {
		bad("uri: must be set")
	}
	if !sha256Re.MatchString(p.Sha256) {
		bad("sha256=%q: must be 64 lower-case hex digits", p.Sha256)
	}
	if p.Bin == "" {
		bad("bin: must be set")
	}
	if p.Files != nil && len(p.Files) == 0 {
		bad("files: must be left out or not empty")
	}
	for i, f := range p.Files {
		if f.From == "" || f.To == "" {
			bad("files[%d]: from and to must be set", i)
		}
	}
	s := p.Selector
	if s == nil || (len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0) {
		bad("selector: must be set and not empty")
		return errs
	}
	for k := range s.MatchLabels {
		if k != "os" && k != "arch" {
			bad("selector.matchLabels: key %q: only os and arch are allowed", k)
		}
	}
	for _, e := range s.MatchExpressions {
		if e.Key != "os" && e.Key != "arch" {
			bad("selector.matchExpressions: key %q: only os and arch are allowed", e.Key)
		}
	}
	return errs
}
