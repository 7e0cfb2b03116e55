package demo

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/outboxrelay/relay/config"
	"github.com/outboxrelay/relay/internal/app"
	"github.com/outboxrelay/relay/pipeline"
)

// relay is the real relay running in a goroutine.
type relay struct {
	r      *app.Relay
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // Run's result, set before done is closed
	once   sync.Once
}

// startRelay opens a relay for cfg and runs it until stop is called or ctx
// is cancelled.
func startRelay(ctx context.Context, cfg *config.Config, log *slog.Logger) (*relay, error) {
	r, err := app.Open(ctx, cfg, log)
	if err != nil {
		return nil, fmt.Errorf("open relay: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	rl := &relay{r: r, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(rl.done)
		rl.err = r.Run(ctx)
	}()
	return rl, nil
}

// stats returns the relay's live counters.
func (rl *relay) stats() *pipeline.Stats { return rl.r.Stats() }

// stop cancels the relay, waits until it drained its in-flight work and
// closes it. It returns Run's error and is safe to call more than once.
func (rl *relay) stop() error {
	rl.once.Do(func() {
		rl.cancel()
		<-rl.done
		rl.r.Close()
	})
	return rl.err
}
