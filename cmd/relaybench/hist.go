package main

import (
	"math"
	"math/bits"
	"time"
)

// histogram is an HDR-style log-linear histogram of durations: values are
// bucketed by their power of two, and each power of two is split into
// subBuckets linear sub-buckets, so every recorded value is kept to within
// 1/subBuckets (0.8 %) of itself from 1 µs to hours, in constant memory.
// The minimum and maximum are exact.
type histogram struct {
	counts   [64][2 * subBuckets]int64
	n        int64
	sum      float64 // nanoseconds
	min, max int64
}

const (
	subBucketBits = 7
	subBuckets    = 1 << subBucketBits
)

func (h *histogram) record(d time.Duration) {
	v := max(int64(d), 0)
	if h.n == 0 || v < h.min {
		h.min = v
	}
	h.max = max(h.max, v)
	h.n++
	h.sum += float64(v)
	e, s := bucketOf(v)
	h.counts[e][s]++
}

// bucketOf returns the bucket of v and its linear sub-bucket. Values below
// 2·subBuckets are exact (bucket 0); above, bucket e ≥ 1 holds the values
// whose top subBucketBits+1 bits are 1<<subBucketBits + s.
func bucketOf(v int64) (int, int) {
	if v < 2*subBuckets {
		return 0, int(v)
	}
	e := bits.Len64(uint64(v)) - (subBucketBits + 1)
	return e, int(v>>e) - subBuckets
}

// lowest returns the smallest value of bucket (e, s) and the bucket's width.
func lowest(e, s int) (int64, int64) {
	if e == 0 {
		return int64(s), 1
	}
	return int64(s+subBuckets) << e, 1 << e
}

// quantile returns the value at quantile q (0..1): the midpoint of the
// bucket holding it, clamped to the exact minimum and maximum.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if q >= 1 {
		return time.Duration(h.max)
	}
	rank := int64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen int64
	for e := range h.counts {
		for s, c := range h.counts[e] {
			if c == 0 {
				continue
			}
			seen += c
			if seen >= rank {
				lo, w := lowest(e, s)
				v := lo + w/2
				return time.Duration(min(max(v, h.min), h.max))
			}
		}
	}
	return time.Duration(h.max)
}

// Percentiles summarise a latency histogram, in milliseconds.
type Percentiles struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P95   float64 `json:"p95_ms"`
	P99   float64 `json:"p99_ms"`
	P999  float64 `json:"p99_9_ms"`
	Max   float64 `json:"max_ms"`
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func (h *histogram) summary() Percentiles {
	p := Percentiles{Count: h.n}
	if h.n == 0 {
		return p
	}
	p.Mean = h.sum / float64(h.n) / 1e6
	p.P50, p.P95, p.P99, p.P999 = ms(h.quantile(0.50)), ms(h.quantile(0.95)), ms(h.quantile(0.99)), ms(h.quantile(0.999))
	p.Max = ms(time.Duration(h.max))
	return p
}
