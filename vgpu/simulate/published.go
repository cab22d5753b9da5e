package simulate

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// PaperResult is one policy's published outcome on the trace's default
// workload.
type PaperResult struct {
	// Policy is the paper's name for the policy.
	Policy string
	// UnallocatedPercent is the mean over 10 seeds of the unallocated GPU
	// share at 100% arrived demand.
	UnallocatedPercent float64
}

// PaperResults returns the published means on openb_pod_list_default
// (Weng et al., ATC '23), best last.
func PaperResults() []PaperResult {
	return []PaperResult{
		{"Random", 13.70}, {"DotProduct", 9.38}, {"GpuClustering", 8.35},
		{"GpuPacking", 8.22}, {"BestFit", 7.14}, {"FGD", 4.77},
	}
}

// Published is one row of the simulator's analysis_allo_discrete.csv, read
// at 100% arrived demand.
type Published struct {
	// Policy is the simulator's policy name, e.g. "06-FGD".
	Policy string
	// Seed is the simulator's seed (42 to 51).
	Seed int
	// UnallocatedPercent is 100 minus the allocation ratio at 100%.
	UnallocatedPercent float64
}

// ReadPublished reads the rows of analysis_allo_discrete.csv (header
// workload,sc_policy,tune,seed,total_gpus,0,1,…,130) whose workload is
// workload, e.g. "openb_pod_list_default", in file order.
func ReadPublished(r io.Reader, workload string) ([]Published, error) {
	cr := csv.NewReader(r)
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("read published results: %w: header: %w", ErrMalformed, err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[h] = i
	}
	for _, name := range []string{"workload", "sc_policy", "seed", "100"} {
		if _, ok := col[name]; !ok {
			return nil, fmt.Errorf("read published results: %w: no column %q", ErrMalformed, name)
		}
	}
	var out []Published
	for line := 2; ; line++ {
		row, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read published results: %w: %w", ErrMalformed, err)
		}
		if row[col["workload"]] != workload {
			continue
		}
		seed, err1 := strconv.Atoi(row[col["seed"]])
		allocated, err2 := strconv.ParseFloat(row[col["100"]], 64)
		if err := errors.Join(err1, err2); err != nil {
			return nil, fmt.Errorf("read published results: %w: line %d: %w", ErrMalformed, line, err)
		}
		out = append(out, Published{Policy: row[col["sc_policy"]], Seed: seed, UnallocatedPercent: 100 - allocated})
	}
}

// PublishedMeans returns, per policy in the order first seen, the mean of
// rows' UnallocatedPercent over their seeds; Seed is 0.
func PublishedMeans(rows []Published) []Published {
	var out []Published
	count := map[string]int{}
	at := map[string]int{}
	for _, r := range rows {
		i, ok := at[r.Policy]
		if !ok {
			i = len(out)
			at[r.Policy] = i
			out = append(out, Published{Policy: r.Policy})
		}
		out[i].UnallocatedPercent += r.UnallocatedPercent
		count[r.Policy]++
	}
	for i := range out {
		out[i].UnallocatedPercent /= float64(count[out[i].Policy])
	}
	return out
}
