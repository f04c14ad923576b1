package metricsserver

import (
	"slices"
	"testing"
)

func TestExcludeHollow(t *testing.T) {
	const never = "kcp.overcommit.dev/hollow!=true"
	for _, tc := range []struct{ in, want []string }{
		{nil, []string{"--node-selector=" + never}},
		{[]string{"--v=2"}, []string{"--v=2", "--node-selector=" + never}},
		{[]string{"--node-selector=a=b", "--v=2"}, []string{"--v=2", "--node-selector=a=b," + never}},
		{[]string{"--node-selector", "a=b"}, []string{"--node-selector=a=b," + never}},
		{[]string{"-l", "a=b"}, []string{"--node-selector=a=b," + never}},
		{[]string{"-l=a=b"}, []string{"--node-selector=a=b," + never}},
		{[]string{"-la=b"}, []string{"--node-selector=a=b," + never}},
		{[]string{"-l=a=b", "--node-selector=c=d"}, []string{"--node-selector=c=d," + never}},
	} {
		if got := ExcludeHollow(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("ExcludeHollow(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
