package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/app"
)

// watchHeapPeak writes an in-use heap profile to path whenever the heap
// grew 10 % past its largest size so far, so that the file holds the heap
// near its peak (what the peak RSS is made of). It returns a function that
// stops watching.
func watchHeapPeak(path string) func() {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		var peak uint64
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse < peak+peak/10 {
				continue
			}
			peak = ms.HeapInuse
			if f, err := os.Create(path); err == nil {
				pprof.Lookup("heap").WriteTo(f, 0)
				f.Close()
			}
		}
	}()
	return func() { close(done); <-stopped }
}

// asRelay is `relay run --config cfgPath` inside this binary, with a CPU
// profile of the whole run written to dir/cpu.pprof and an allocation
// profile to dir/allocs.pprof when it stops. The bench re-executes itself
// this way (the relay has no pprof endpoint), so the profiled process holds
// only the relay, with the relay's runtime and garbage collector settings,
// as in production.
func asRelay(cfgPath, dir string, stderr io.Writer) int {
	app.TuneGC()
	cfg, err := config.Load(cfgPath)
	if err != nil {
		fmt.Fprintf(stderr, "relaybench -as-relay: %v\n", err)
		return 2
	}
	log := app.NewLogger(cfg.Log, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	f, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err != nil {
		fmt.Fprintf(stderr, "relaybench -as-relay: %v\n", err)
		return 1
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		fmt.Fprintf(stderr, "relaybench -as-relay: %v\n", err)
		return 1
	}
	stopPeak := watchHeapPeak(filepath.Join(dir, "heap-peak.pprof"))
	err = app.RunConfig(ctx, cfg, log)
	stopPeak()
	pprof.StopCPUProfile()
	f.Close()
	if af, aerr := os.Create(filepath.Join(dir, "allocs.pprof")); aerr == nil {
		pprof.Lookup("allocs").WriteTo(af, 0)
		af.Close()
	}
	if err != nil {
		fmt.Fprintf(stderr, "relaybench -as-relay: %v\n", err)
		return 1
	}
	return 0
}
