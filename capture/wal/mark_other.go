//go:build !linux

package wal

import (
	"io"
	"net"
)

// withMark returns c: the receive low-water mark is raised on Linux only
// (elsewhere a non-blocking read under the mark may find nothing).
func withMark(c net.Conn) net.Conn { return c }

// markRaiser returns nil: see withMark.
func markRaiser(io.Writer) func() { return nil }
