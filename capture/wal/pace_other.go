//go:build !linux

package wal

import "time"

// pacer is what a pacedReader sleeps on: Go's timers (see pace_linux.go).
type pacer struct{}

func newPacer() *pacer { return &pacer{} }

func (*pacer) sleep(d time.Duration) { time.Sleep(d) }

func (*pacer) close() {}
