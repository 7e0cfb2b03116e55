package wal

import (
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// pacer is what a pacedReader sleeps on. Go's own timers wake an idle
// process twice for most sleeps: its poller waits in whole milliseconds,
// so it wakes before a timer a fraction of a millisecond past one, and
// waits again. On Linux a pacer sleeps on a timerfd read through Go's
// poller instead, which wakes the process once, on time. It is safe for
// concurrent use: the timer has one expiration, so a sleep that starts
// while another sleeps on it sleeps on Go's timers. After close, or when
// nil, it sleeps on Go's timers.
type pacer struct {
	f      *os.File
	asleep sync.Mutex // held by the sleep waiting on f
}

func newPacer() *pacer {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return &pacer{}
	}
	return &pacer{f: os.NewFile(uintptr(fd), "pace timer")}
}

// sleep returns after d (positive).
func (p *pacer) sleep(d time.Duration) {
	if p == nil || p.f == nil || !p.asleep.TryLock() {
		time.Sleep(d)
		return
	}
	defer p.asleep.Unlock()
	if p.arm(d) != nil {
		time.Sleep(d)
		return
	}
	var expirations [8]byte
	p.f.Read(expirations[:]) // fails only once closed: the sleep may end early then
}

// arm sets the timer to expire once, after d.
func (p *pacer) arm(d time.Duration) error {
	raw, err := p.f.SyscallConn()
	if err != nil {
		return err
	}
	spec := unix.ItimerSpec{Value: unix.NsecToTimespec(d.Nanoseconds())}
	if cerr := raw.Control(func(fd uintptr) { err = unix.TimerfdSettime(int(fd), 0, &spec, nil) }); cerr != nil {
		return cerr
	}
	return err
}

func (p *pacer) close() {
	if p != nil && p.f != nil {
		p.f.Close()
	}
}
