package main

import (
	"context"
	"fmt"
)

// ScalePoint is one backlog drain of a scaling curve.
type ScalePoint struct {
	Curve      string  `json:"curve"` // payload, aggregates, relays
	Value      int     `json:"value"`
	Mode       string  `json:"mode"`
	Events     int     `json:"events"`
	Payload    int     `json:"payload_bytes"`
	Aggregates int     `json:"aggregates"`
	Relays     int     `json:"relays"`
	PerSecond  float64 `json:"events_per_second"`
	MBPerSec   float64 `json:"payload_mb_per_second"`
	PeakRSSMB  float64 `json:"peak_rss_mb"`
	CPUPer100k float64 `json:"relay_cpu_seconds_per_100k_events"`
	Complete   bool    `json:"complete"`
	CPU        cpuUse  `json:"machine"`
}

// scaleVariant is one point to measure.
type scaleVariant struct {
	curve                              string
	value, payload, aggregates, relays int
	events                             int
}

// scaleVariants are the scaling curves: payload size, number of
// aggregates, number of poll relays; the other settings stay at 200-byte
// payloads, 10,000 aggregates and one relay. One aggregate allows one event
// in flight at a time, so its backlog is a tenth of the others'.
func scaleVariants(events int) []scaleVariant {
	var out []scaleVariant
	for _, p := range []int{100, 1024, 16384} {
		out = append(out, scaleVariant{"payload", p, p, 10_000, 1, events})
	}
	for _, a := range []int{1, 100, 10_000} {
		n := events
		if a == 1 {
			n = max(events/10, 1000)
		}
		out = append(out, scaleVariant{"aggregates", a, 200, a, 1, n})
	}
	for _, r := range []int{1, 2, 4} {
		out = append(out, scaleVariant{"relays", r, 200, 10_000, r, events})
	}
	return out
}

// measureScaling drains one backlog per variant, into NATS, in each mode
// (the relays curve in poll mode only: wal relays stand by).
func (e *env) measureScaling(ctx context.Context, modes []string) ([]ScalePoint, error) {
	var out []ScalePoint
	for _, mode := range modes {
		for _, v := range scaleVariants(e.opts.ScaleEvents) {
			if v.curve == "relays" && mode != "poll" {
				continue
			}
			sub := *e
			sub.opts.Events, sub.opts.Payload, sub.opts.Aggregates = v.events, v.payload, v.aggregates
			d, err := e.newDatabase(ctx, fmt.Sprintf("bench_scale_%s_%s_%d", mode, v.curve, v.value), mode)
			if err != nil {
				return out, err
			}
			if err := e.initRelay(ctx, d); err != nil {
				e.dropDatabase(d)
				return out, err
			}
			e.opts.logf("scaling %s=%d (%s): %d events of %d bytes over %d aggregates, %d relay(s)", v.curve, v.value, mode,
				v.events, v.payload, v.aggregates, v.relays)
			dr, err := sub.measureDrain(ctx, d, v.relays, nil, nil)
			e.dropDatabase(d)
			p := ScalePoint{Curve: v.curve, Value: v.value, Mode: mode, Events: v.events, Payload: v.payload,
				Aggregates: v.aggregates, Relays: v.relays, PerSecond: dr.Drain.PerSecond,
				MBPerSec: dr.Drain.PerSecond * float64(v.payload) / 1e6, PeakRSSMB: dr.PeakRSSMB,
				CPUPer100k: dr.CPUPer100k, Complete: dr.Complete, CPU: dr.CPU}
			out = append(out, p)
			if err != nil {
				return out, fmt.Errorf("scaling %s=%d: %w", v.curve, v.value, err)
			}
		}
	}
	return out, nil
}
