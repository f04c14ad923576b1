package hollownode

import (
	"slices"
	"testing"
)

func TestWithoutFlags(t *testing.T) {
	drop := []string{"prefix", "count", "run-dir"}
	for _, tc := range []struct{ in, want []string }{
		{nil, nil},
		{[]string{"--cpu=4", "--count=2", "--labels=a=b"}, []string{"--cpu=4", "--labels=a=b"}},
		{[]string{"--count", "2", "--cpu", "4"}, []string{"--cpu", "4"}},
		{[]string{"--run-dir=/r", "--prefix", "h", "--countx=1"}, []string{"--countx=1"}},
		{[]string{"--v=2", "--prefix=p"}, []string{"--v=2"}},
	} {
		if got := WithoutFlags(tc.in, drop); !slices.Equal(got, tc.want) {
			t.Errorf("WithoutFlags(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
