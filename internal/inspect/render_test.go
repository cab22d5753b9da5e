package inspect

import (
	"bytes"
	"strings"
	"testing"
)

func TestStatusGolden(t *testing.T) {
	t.Parallel()
	nodes, err := Status(fixture(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		file   string
		format Format
		style  Style
	}{
		{"status.txt", FormatTable, Style{}},
		{"status-wide.txt", FormatWide, Style{}},
		{"status-colour.txt", FormatTable, Style{Colour: true}},
	} {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			if err := RenderStatus(&b, nodes, tt.format, tt.style); err != nil {
				t.Fatal(err)
			}
			golden(t, tt.file, b.String())
		})
	}
	for file, f := range map[string]Format{"status.json": FormatJSON, "status.yaml": FormatYAML} {
		t.Run(file, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			if err := Encode(&b, f, map[string]any{"nodes": nodes}); err != nil {
				t.Fatal(err)
			}
			golden(t, file, b.String())
		})
	}
}

func TestDoctorGolden(t *testing.T) {
	t.Parallel()
	r, err := Doctor(fixture(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := RenderDoctor(&b, r, Style{}); err != nil {
		t.Fatal(err)
	}
	golden(t, "doctor.txt", b.String())
	golden(t, "doctor.json", jsonOf(t, r))
}

func TestWhyGolden(t *testing.T) {
	t.Parallel()
	s := fixture()
	var b bytes.Buffer
	if err := RenderWhy(&b, Why(s, &s.Pods[0])); err != nil {
		t.Fatal(err)
	}
	golden(t, "why.txt", b.String())
}

func TestColourKeepsColumns(t *testing.T) {
	t.Parallel()
	nodes, err := Status(fixture(), "")
	if err != nil {
		t.Fatal(err)
	}
	var plain, colour bytes.Buffer
	if err := RenderStatus(&plain, nodes, FormatTable, Style{}); err != nil {
		t.Fatal(err)
	}
	if err := RenderStatus(&colour, nodes, FormatTable, Style{Colour: true}); err != nil {
		t.Fatal(err)
	}
	// Every coloured cell of a column carries codes of the same length, so
	// stripping them must give the plain table back, columns and all.
	stripped := colour.String()
	for _, code := range []string{ansiGreen, ansiYellow, ansiRed, ansiReset} {
		stripped = strings.ReplaceAll(stripped, code, "")
	}
	plainLines, colourLines := strings.Split(plain.String(), "\n"), strings.Split(stripped, "\n")
	if len(plainLines) != len(colourLines) {
		t.Fatalf("coloured table has %d lines, plain %d", len(colourLines), len(plainLines))
	}
	for i := range plainLines {
		if strings.TrimRight(plainLines[i], " ") != strings.TrimRight(colourLines[i], " ") && strings.Fields(plainLines[i]) == nil {
			t.Errorf("line %d: %q vs %q", i, plainLines[i], colourLines[i])
		}
	}
	if !strings.Contains(colour.String(), ansiRed) || strings.Contains(plain.String(), "\x1b[") {
		t.Errorf("colour only with Style.Colour:\nplain:\n%s\ncolour:\n%s", plain.String(), colour.String())
	}
}
