package sink

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
	be := &BatchError{Errs: []error{nil, base}}
	if Failed(be, 0) != nil || Failed(be, 1) != base || Failed(base, 3) != base {
		t.Error("Failed does not index a BatchError")
	}
}
