package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// Format is an output format of the -o flag.
type Format string

// The formats: the table, the wide table, JSON and YAML.
const (
	FormatTable Format = ""
	FormatWide  Format = "wide"
	FormatJSON  Format = "json"
	FormatYAML  Format = "yaml"
)

// ParseFormat reads an -o value; allowed lists the values a command takes
// besides the table ("").
func ParseFormat(s string, allowed ...Format) (Format, error) {
	f := Format(s)
	if f == FormatTable {
		return f, nil
	}
	names := make([]string, 0, len(allowed))
	for _, a := range allowed {
		if a == f {
			return f, nil
		}
		names = append(names, string(a))
	}
	return "", fmt.Errorf("-o=%s: must be one of %s (or omitted for the table)", s, strings.Join(names, ", "))
}

// Encode writes v as JSON (indented) or YAML.
func Encode(w io.Writer, f Format, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %w", f, err)
	}
	if f == FormatYAML {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return fmt.Errorf("encode %s: %w", f, err)
		}
	} else {
		b = append(b, '\n')
	}
	_, err = w.Write(b)
	return err
}

// Style says how tables are drawn.
type Style struct {
	// Colour wraps figures in ANSI colours; only for a terminal.
	Colour bool
}

// ANSI colours. All have the same length, so a column whose every cell is
// coloured stays aligned in a tabwriter.
const (
	ansiGreen  = "\x1b[32m"
	ansiYellow = "\x1b[33m"
	ansiRed    = "\x1b[31m"
	ansiReset  = "\x1b[0m"
)

// paint colours s when st.Colour is set.
func (st Style) paint(colour, s string) string {
	if !st.Colour {
		return s
	}
	return colour + s + ansiReset
}

// level returns the colour of a share used: green below 70%, yellow below
// 90%, red from there.
func level(used, total int64) string {
	switch {
	case total <= 0 || used*10 >= total*9:
		return ansiRed
	case used*10 >= total*7:
		return ansiYellow
	}
	return ansiGreen
}

// barWidth is how many cells a memory bar has.
const barWidth = 10

// bar draws used of total as barWidth cells, rounded to the nearest cell;
// any use at all shows at least one.
func bar(used, total int64) string {
	filled := 0
	if total > 0 {
		filled = int((used*barWidth*2 + total) / (total * 2))
		if used > 0 && filled == 0 {
			filled = 1
		}
		filled = min(filled, barWidth)
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat(".", barWidth-filled) + "]"
}

// RenderStatus writes nodes as a table of one row per GPU: the GPU's model,
// memory held as a bar and in MiB, cores reserved, slices held and the pods
// holding them. Wide adds the UUID, health and the node's ready label and
// allocatable devices. A node without a readable inventory gets one row
// saying why.
func RenderStatus(w io.Writer, nodes []NodeStatus, f Format, st Style) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	head := "NODE\tGPU\tMODEL\tMEMORY\tCORES\tSLICES\tSTATE\tPODS"
	if f == FormatWide {
		head = "NODE\tGPU\tUUID\tMODEL\tMEMORY\tCORES\tSLICES\tSTATE\tREADY\tALLOCATABLE\tPODS"
	}
	fmt.Fprintln(tw, head)
	if len(nodes) == 0 {
		fmt.Fprintln(tw, "(no GPU nodes: no Node has the device plugin's inventory, ready label or hami.io/gpu capacity)")
	}
	for _, n := range nodes {
		state := "ready"
		if !n.Ready {
			state = "not-ready"
		}
		if n.InventoryError != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t%s\t%s\n", n.Name, st.paint(ansiRed, "no-inventory"), n.InventoryError)
			continue
		}
		for _, g := range n.GPUs {
			gstate, colour := state, ansiGreen
			if g.Health != "Healthy" {
				gstate = "unhealthy"
			}
			if gstate != "ready" {
				colour = ansiRed
			}
			mem := st.paint(level(g.MemoryUsedMiB, g.MemoryMiB), bar(g.MemoryUsedMiB, g.MemoryMiB)) + fmt.Sprintf(" %d/%d MiB", g.MemoryUsedMiB, g.MemoryMiB)
			cores := fmt.Sprintf("%d/%d%%", g.CoresUsedPercent, g.CoresPercent)
			slices := fmt.Sprintf("%d/%d", g.Slices, g.SplitCount)
			switch {
			case n.Mode == ModeDRA:
				slices = draSummary(g)
			case g.Exclusive:
				slices = "whole"
			}
			pods := strings.Join(g.Pods, ",")
			if pods == "" {
				pods = "-"
			}
			if f == FormatWide {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%t\t%d\t%s\n", n.Name, g.Index, g.UUID, g.Model, mem, cores, slices, st.paint(colour, gstate), n.Ready, n.Allocatable, pods)
			} else {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, g.Index, g.Model, mem, cores, slices, st.paint(colour, gstate), pods)
			}
		}
	}
	return tw.Flush()
}

// RenderDoctor writes r: the checks grouped by node, then the cluster's,
// each "RESULT  check  message" with its fix on the next line, and a
// summary.
func RenderDoctor(w io.Writer, r Report, st Style) error {
	group := "\x00"
	for _, c := range r.Checks {
		if c.Node != group {
			group = c.Node
			title := "cluster"
			if c.Node != "" {
				title = "node " + c.Node
			}
			fmt.Fprintf(w, "%s\n", title)
		}
		colour := ansiGreen
		switch c.Result {
		case Warn:
			colour = ansiYellow
		case Fail:
			colour = ansiRed
		}
		fmt.Fprintf(w, "  %s  %-18s %s\n", st.paint(colour, string(c.Result)), c.Name, c.Message)
		if c.Fix != "" && c.Result != Pass {
			fmt.Fprintf(w, "        %-18s fix: %s\n", "", c.Fix)
		}
	}
	_, err := fmt.Fprintf(w, "\n%d checks: %d passed, %d warnings, %d failures\n", len(r.Checks), len(r.Checks)-r.Warnings-r.Failures, r.Warnings, r.Failures)
	return err
}
