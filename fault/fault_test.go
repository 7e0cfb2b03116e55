package fault

import (
	"errors"
	"fmt"
	"testing"
)

func TestClassOf(t *testing.T) {
	base := errors.New("boom")
	for _, tc := range []struct {
		err  error
		want Class
	}{
		{base, Transient},
		{AsPermanent(base), Permanent},
		{AsUnavailable(base), Unavailable},
		{fmt.Errorf("publish batch: %w", AsPermanent(base)), Permanent},
	} {
		if got := ClassOf(tc.err); got != tc.want {
			t.Errorf("%v: got %s, want %s", tc.err, got, tc.want)
		}
	}
}
