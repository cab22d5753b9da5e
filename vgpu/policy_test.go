package vgpu

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// TestPolicyTable checks that every policy has one complete entry of
// policyTable, whose funcs keep the contracts the paths rely on, and that
// the policies no pod or configuration may name are refused where names
// are read.
func TestPolicyTable(t *testing.T) {
	t.Parallel()
	seen := map[Policy]bool{}
	for i := range policyTable {
		if p := policyTable[i].policy; p == "" || seen[p] {
			t.Errorf("entry %d: policy %q is empty or listed twice", i, p)
		}
		seen[policyTable[i].policy] = true
	}
	for i := range policyTable {
		r := &policyTable[i]
		t.Run(string(r.policy), func(t *testing.T) {
			t.Parallel()
			v := reflect.ValueOf(*r)
			for f := range v.NumField() {
				if v.Field(f).Kind() == reflect.Func && v.Field(f).IsNil() {
					t.Errorf("%s has no %s", r.policy, v.Type().Field(f).Name)
				}
			}
			if got := rulesOf(r.policy); got != r {
				t.Errorf("rulesOf(%q) is the entry of %q", r.policy, got.policy)
			}
			checkPolicyContracts(t, r)
		})
	}
	for _, p := range append(Policies(), PolicyFirstFit) {
		if !seen[p] {
			t.Errorf("policy %q has no entry", p)
		}
	}
	for _, p := range []Policy{"", "tetris"} {
		if got := rulesOf(p); got.policy != PolicyBinpack {
			t.Errorf("rulesOf(%q) is the entry of %q, want %q's", p, got.policy, PolicyBinpack)
		}
	}
}

// checkPolicyContracts checks r's funcs against the contracts stated on
// policyRules, on a grid of shares and fragmentation changes: value and tie
// never fall as their argument rises, and rawBound bounds nodeRaw.
func checkPolicyContracts(t *testing.T, r *policyRules) {
	t.Helper()
	shares := []float64{0, 0.125, 0.25, 0.5, 0.75, 1}
	changes := []float64{-2, -0.5, 0, 0.25, 1}
	for i := 1; i < len(shares); i++ {
		if r.tie(shares[i]) < r.tie(shares[i-1]) {
			t.Errorf("%s: tie(%v) < tie(%v)", r.policy, shares[i], shares[i-1])
		}
	}
	for i := 1; i < len(changes); i++ {
		if r.value(changes[i]) < r.value(changes[i-1]) {
			t.Errorf("%s: value(%v) < value(%v)", r.policy, changes[i], changes[i-1])
		}
	}
	for _, before := range shares {
		for _, after := range shares {
			for _, fall := range changes {
				if after < before || fall < 0 && r.fragmentation {
					continue
				}
				bound := r.rawBound(before, after, fall)
				for _, used := range shares {
					for _, rise := range changes {
						if used < before || used > after || r.fragmentation && rise < -fall || !r.fragmentation && rise != 0 {
							continue
						}
						if raw := r.nodeRaw(used, rise); raw > bound {
							t.Fatalf("%s: nodeRaw(%v, %v) = %v above rawBound(%v, %v, %v) = %v", r.policy, used, rise, raw, before, after, fall, bound)
						}
					}
				}
			}
		}
	}
}

// TestParsePolicy checks that each policy a pod or configuration may name
// parses to itself and that any other name, PolicyFirstFit's included, is
// refused, in ParsePolicy and in the placement annotations.
func TestParsePolicy(t *testing.T) {
	t.Parallel()
	for _, p := range Policies() {
		if got, err := ParsePolicy(string(p)); got != p || err != nil {
			t.Errorf("ParsePolicy(%q) = %q, %v, want %q", p, got, err, p)
		}
	}
	if got, err := ParsePolicy(""); got != "" || err != nil {
		t.Errorf(`ParsePolicy("") = %q, %v, want "" (not set)`, got, err)
	}
	for _, name := range []string{"tetris", string(PolicyFirstFit), "Binpack", " spread"} {
		got, err := ParsePolicy(name)
		if got != "" || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), PolicyList()) {
			t.Errorf("ParsePolicy(%q) = %q, %v, want an ErrMalformed listing %s", name, got, err, PolicyList())
		}
		for _, key := range []string{AnnotationNodePolicy, AnnotationGPUPolicy} {
			var ae *AnnotationError
			if _, err := ParseConstraints(map[string]string{key: name}); !errors.As(err, &ae) || ae.Key != key {
				t.Errorf("ParseConstraints(%s=%q) error = %v, want an AnnotationError for %s", key, name, err, key)
			}
		}
	}
	if got, want := PolicyList(), "binpack, spread, fragmentation"; got != want {
		t.Errorf("PolicyList() = %q, want %q", got, want)
	}
}
