package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"syscall"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/app"
)

// asRelay is `relay run --config cfgPath` inside this binary, with a CPU
// profile of the whole run written to dir/cpu.pprof and an allocation
// profile to dir/allocs.pprof when it stops. The bench re-executes itself
// this way (the relay has no pprof endpoint), so the profiled process holds
// only the relay, as in production.
func asRelay(cfgPath, dir string, stderr io.Writer) int {
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
	err = app.RunConfig(ctx, cfg, log)
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
