package simulate

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
)

// Family is a kind of trace variant, made from a base pod list the way the
// FGD paper's simulator made its openb_pod_list_<family><NN>.csv files.
type Family string

const (
	// FamilyGPUSpec pins a share of the GPU tasks to GPU models: NN% of
	// the GPU tasks, drawn uniformly, get a model filter drawn from
	// SpecMix in place of theirs. The other tasks are the base's.
	FamilyGPUSpec Family = "gpuspec"
	// FamilyMultiGPU appends copies of the base's multi-GPU tasks, drawn
	// uniformly, until multi-GPU tasks ask for NN% of the GPU request.
	FamilyMultiGPU Family = "multigpu"
	// FamilyCPU keeps the base's GPU tasks and draws CPU-only tasks from
	// the base's, with replacement, until they are NNN/10 % of all tasks
	// (cpu250: 25.0%).
	FamilyCPU Family = "cpu"
)

// ErrVariant is wrapped by every error about a variant name or a base
// trace a variant cannot be made from.
var ErrVariant = errors.New("bad variant")

// VariantSpec names one variant: a family and its share.
type VariantSpec struct {
	Family Family
	// Percent is the family's share in hundredths of the whole: the NN of
	// gpuspecNN and multigpuNN; for FamilyCPU the NNN of cpuNNN over 10.
	Percent float64
	// Name is the variant's name as the paper's files spell it, e.g.
	// "gpuspec33" or "cpu050".
	Name string
}

// Variants lists the variants the paper's simulator ships, by family, in
// the order reports show them. The gpushare family is not made here: its
// files are given.
func Variants() []VariantSpec {
	var out []VariantSpec
	for _, n := range []string{"gpuspec05", "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
		"multigpu20", "multigpu30", "multigpu40", "multigpu50",
		"cpu050", "cpu100", "cpu200", "cpu250"} {
		v, _ := ParseVariant(n)
		out = append(out, v)
	}
	return out
}

// ParseVariant parses a variant name: gpuspecNN, multigpuNN (NN from 1 to
// 99) or cpuNNN (NNN from 0 to 990, tenths of a percent).
func ParseVariant(name string) (VariantSpec, error) {
	for _, f := range []Family{FamilyGPUSpec, FamilyMultiGPU, FamilyCPU} {
		num, ok := strings.CutPrefix(name, string(f))
		if !ok {
			continue
		}
		n, err := strconv.Atoi(num)
		limit := 99
		if f == FamilyCPU {
			limit = 990
		}
		if err != nil || n < 0 || n > limit || (f != FamilyCPU && n == 0) {
			break
		}
		pct := float64(n)
		if f == FamilyCPU {
			pct /= 10
		}
		return VariantSpec{Family: f, Percent: pct, Name: name}, nil
	}
	return VariantSpec{}, fmt.Errorf("%w: %q: want gpuspecNN or multigpuNN (NN 1 to 99) or cpuNNN (NNN 0 to 990, tenths of a percent)", ErrVariant, name)
}

// SpecModel is one model filter of SpecMix and how often it is drawn.
type SpecModel struct {
	Models []string
	Weight float64
}

// SpecMix is the mix of model filters FamilyGPUSpec draws from: that of the
// paper's openb_pod_list_gpuspec33.csv (T4 1291 tasks, G2 331, P100 279,
// V100M16|V100M32 141), whose filters name the scarce models most.
func SpecMix() []SpecModel {
	return []SpecModel{
		{[]string{"T4"}, 1291}, {[]string{"G2"}, 331}, {[]string{"P100"}, 279},
		{[]string{"V100M16", "V100M32"}, 141},
	}
}

// variantSeed is the seed every variant is drawn with, so that a variant
// name always means the same task list for the same base.
const variantSeed = 2023

// MakeVariant returns the variant v of the base task list. It is pure and
// deterministic: the same base and v give the same tasks, drawn with a
// fixed seed. Tasks copied or added get the name of their original with a
// suffix "-vN", N counting from 1. It returns an error wrapping ErrVariant
// when the base lacks the tasks the family draws from.
func MakeVariant(base []Task, v VariantSpec) ([]Task, error) {
	rng := rand.New(rand.NewPCG(variantSeed, uint64(len(base))))
	out := make([]Task, len(base))
	for i, t := range base {
		out[i] = t
		out[i].Models = slices.Clone(t.Models)
	}
	var gpuTasks, multi, cpuOnly []int
	var request, multiRequest int64
	for i, t := range base {
		switch {
		case t.GPUs == 0:
			cpuOnly = append(cpuOnly, i)
		case t.GPUs > 1:
			multi = append(multi, i)
			multiRequest += t.DemandMilli()
			fallthrough
		default:
			gpuTasks = append(gpuTasks, i)
			request += t.DemandMilli()
		}
	}
	added := 0
	addCopy := func(t Task) {
		added++
		t.Name += "-v" + strconv.Itoa(added)
		t.Models = slices.Clone(t.Models)
		out = append(out, t)
	}
	switch v.Family {
	case FamilyGPUSpec:
		if len(gpuTasks) == 0 {
			return nil, fmt.Errorf("%w: %s: the base has no GPU task", ErrVariant, v.Name)
		}
		mix := SpecMix()
		var total float64
		for _, m := range mix {
			total += m.Weight
		}
		rng.Shuffle(len(gpuTasks), func(i, j int) { gpuTasks[i], gpuTasks[j] = gpuTasks[j], gpuTasks[i] })
		want := int(float64(len(gpuTasks))*v.Percent/100 + 0.5)
		for _, i := range gpuTasks[:want] {
			x := rng.Float64() * total
			k := 0
			for ; k < len(mix)-1 && x >= mix[k].Weight; k++ {
				x -= mix[k].Weight
			}
			out[i].Models = slices.Clone(mix[k].Models)
		}
	case FamilyMultiGPU:
		if len(multi) == 0 {
			return nil, fmt.Errorf("%w: %s: the base has no multi-GPU task", ErrVariant, v.Name)
		}
		for float64(multiRequest) < float64(request)*v.Percent/100 {
			t := base[multi[rng.IntN(len(multi))]]
			addCopy(t)
			multiRequest += t.DemandMilli()
			request += t.DemandMilli()
		}
	case FamilyCPU:
		if len(cpuOnly) == 0 && v.Percent > 0 {
			return nil, fmt.Errorf("%w: %s: the base has no CPU-only task", ErrVariant, v.Name)
		}
		all := out
		out = make([]Task, 0, len(base))
		for _, i := range gpuTasks {
			out = append(out, all[i])
		}
		// The base's CPU-only tasks first, in a random order, then copies.
		rng.Shuffle(len(cpuOnly), func(i, j int) { cpuOnly[i], cpuOnly[j] = cpuOnly[j], cpuOnly[i] })
		for n := 0; float64(n) < v.Percent/100*float64(len(gpuTasks)+n); n++ {
			if n < len(cpuOnly) {
				out = append(out, all[cpuOnly[n]])
				continue
			}
			addCopy(base[cpuOnly[rng.IntN(len(cpuOnly))]])
		}
	default:
		return nil, fmt.Errorf("%w: family %q", ErrVariant, v.Family)
	}
	return out, nil
}
