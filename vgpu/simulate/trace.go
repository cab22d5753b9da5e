package simulate

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ErrMalformed is wrapped by every error about a CSV file that does not
// have the trace's layout.
var ErrMalformed = errors.New("malformed trace")

// Node is one row of an openb node list: a machine with GPUs of one model.
type Node struct {
	// Name is the node's name (column sn).
	Name string
	// CPUMilli is the node's CPU in thousandths of a core.
	CPUMilli int64
	// MemoryMiB is the node's host memory.
	MemoryMiB int64
	// GPUs is how many GPUs the node has; 0 for CPU-only nodes.
	GPUs int
	// Model is the GPU model, e.g. "V100M32"; empty for CPU-only nodes.
	Model string
}

// Task is one row of an openb pod list.
type Task struct {
	// Name is the task's name.
	Name string
	// CPUMilli and MemoryMiB are the task's CPU (thousandths of a core) and
	// host memory requests.
	CPUMilli, MemoryMiB int64
	// GPUs is how many GPUs the task asks for, 0 to 8.
	GPUs int
	// GPUMilli is the share of each GPU, 1000 for a whole GPU; 0 when
	// GPUs is 0.
	GPUMilli int64
	// Models are the GPU models the task accepts (gpu_spec split at "|");
	// empty means any.
	Models []string
}

// DemandMilli is the GPU capacity the task asks for, in thousandths of a
// GPU.
func (t Task) DemandMilli() int64 {
	return int64(t.GPUs) * t.GPUMilli
}

// ReadNodes reads an openb node list (header sn,cpu_milli,memory_mib,gpu,
// model; columns found by name, extra columns ignored).
func ReadNodes(r io.Reader) ([]Node, error) {
	var nodes []Node
	err := readCSV(r, []string{"sn", "cpu_milli", "memory_mib", "gpu", "model"}, func(row rowReader) {
		nodes = append(nodes, Node{
			Name: row.str("sn"), CPUMilli: row.int("cpu_milli"), MemoryMiB: row.int("memory_mib"),
			GPUs: int(row.int("gpu")), Model: row.str("model"),
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read nodes: %w", err)
	}
	return nodes, nil
}

// ReadTasks reads an openb pod list (columns name, cpu_milli, memory_mib,
// num_gpu, gpu_milli and, when present, gpu_spec; others ignored).
func ReadTasks(r io.Reader) ([]Task, error) {
	var tasks []Task
	err := readCSV(r, []string{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"}, func(row rowReader) {
		t := Task{
			Name: row.str("name"), CPUMilli: row.int("cpu_milli"), MemoryMiB: row.int("memory_mib"),
			GPUs: int(row.int("num_gpu")), GPUMilli: row.int("gpu_milli"),
		}
		for m := range strings.SplitSeq(row.str("gpu_spec"), "|") {
			if m = strings.TrimSpace(m); m != "" {
				t.Models = append(t.Models, m)
			}
		}
		if t.GPUs > 1 {
			t.GPUMilli = 1000
		}
		if t.GPUs > 0 && (t.GPUMilli <= 0 || t.GPUMilli > 1000) {
			row.fail("gpu_milli", "must be from 1 to 1000 when num_gpu is above 0")
		}
		tasks = append(tasks, t)
	})
	if err != nil {
		return nil, fmt.Errorf("read tasks: %w", err)
	}
	return tasks, nil
}

// rowReader reads named columns of one CSV row, collecting errors.
type rowReader struct {
	line   int
	index  map[string]int
	fields []string
	errs   *[]error
}

func (r rowReader) str(col string) string {
	i, ok := r.index[col]
	if !ok || i >= len(r.fields) {
		return ""
	}
	return r.fields[i]
}

func (r rowReader) int(col string) int64 {
	s := r.str(col)
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		r.fail(col, fmt.Sprintf("%q must be an integer of 0 or more", s))
	}
	return v
}

func (r rowReader) fail(col, msg string) {
	*r.errs = append(*r.errs, fmt.Errorf("%w: line %d: %s: %s", ErrMalformed, r.line, col, msg))
}

func readCSV(r io.Reader, required []string, each func(rowReader)) error {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	header, err := cr.Read()
	if err != nil {
		return fmt.Errorf("%w: header: %w", ErrMalformed, err)
	}
	index := make(map[string]int, len(header))
	for i, h := range header {
		index[strings.TrimSpace(h)] = i
	}
	for _, col := range required {
		if _, ok := index[col]; !ok {
			return fmt.Errorf("%w: header %q lacks column %q", ErrMalformed, strings.Join(header, ","), col)
		}
	}
	var errs []error
	for line := 2; ; line++ {
		fields, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrMalformed, err)
		}
		each(rowReader{line: line, index: index, fields: fields, errs: &errs})
		if len(errs) >= 10 {
			break
		}
	}
	return errors.Join(errs...)
}
