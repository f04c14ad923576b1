package annotations

import (
	"reflect"
	"testing"
)

func TestParseBothFormats(t *testing.T) {
	raws := map[string]map[string]string{
		"cpu=4,memory=16Gi":           {"cpu": "4", "memory": "16Gi"},
		`{"cpu":"4","memory":"16Gi"}`: {"cpu": "4", "memory": "16Gi"},
		"example.com/gpu=2":           {"example.com/gpu": "2"},
		"":                            {},
	}
	for text, want := range raws {
		got, err := ParseRaw(text)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ParseRaw(%q) = %v, %v; want %v", text, got, err, want)
		}
	}
	applied := map[string]AppliedValue{
		"policy=batch;ratios=cpu=2,memory=1.5":                           {Policy: "batch", Ratios: map[string]string{"cpu": "2", "memory": "1.5"}},
		"policy=u;ratios=cpu=2;usage=cpu=6":                              {Policy: "u", Ratios: map[string]string{"cpu": "2"}, Usage: map[string]string{"cpu": "6"}},
		`{"policy":"batch","ratios":{"cpu":"2"}}`:                        {Policy: "batch", Ratios: map[string]string{"cpu": "2"}},
		"policy=b;ratios=cpu=2;generation=3":                             {Policy: "b", Ratios: map[string]string{"cpu": "2"}, Generation: 3},
		"policy=u;ratios=cpu=2;generation=4;maxRatios=cpu=3;usage=cpu=6": {Policy: "u", Ratios: map[string]string{"cpu": "2"}, Generation: 4, MaxRatios: map[string]string{"cpu": "3"}, Usage: map[string]string{"cpu": "6"}},
		"policy=u;ratios=cpu=2;generation=4;usage=cpu=6":                 {Policy: "u", Ratios: map[string]string{"cpu": "2"}, Generation: 4, Usage: map[string]string{"cpu": "6"}},
	}
	for text, want := range applied {
		got, err := ParseApplied(text)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ParseApplied(%q) = %+v, %v; want %+v", text, got, err, want)
		}
	}
	for _, bad := range []string{"cpu", "cpu=4,cpu=5", "cpu=4,"} {
		if _, err := ParseRaw(bad); err == nil {
			t.Errorf("ParseRaw(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"policy=a", "ratios=cpu=2;policy=a", "policy=a;ratios=cpu=2;usage=cpu=6;x=1", `{"policy":`, "policy=a;ratios=cpu=2;generation=0", "policy=a;ratios=cpu=2;generation=x", "policy=a;ratios=cpu=2;usage=cpu=6;generation=2", "policy=a;ratios=cpu=2;usage=cpu=6;maxRatios=cpu=3"} {
		if _, err := ParseApplied(bad); err == nil {
			t.Errorf("ParseApplied(%q) accepted", bad)
		}
	}
}
