package sink

import (
	"errors"
	"testing"
)

func TestFailed(t *testing.T) {
	base := errors.New("boom")
	be := &BatchError{Errs: []error{nil, base}}
	if Failed(be, 0) != nil || Failed(be, 1) != base || Failed(base, 3) != base {
		t.Error("Failed does not index a BatchError")
	}
}
