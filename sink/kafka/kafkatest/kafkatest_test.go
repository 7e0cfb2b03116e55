package kafkatest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestRestartKeepsData produces to a cluster, restarts it and reads the
// records back, then produces again with the same client.
func TestRestartKeepsData(t *testing.T) {
	c, cl := startWithClient(t, Options{Extra: []kfake.Opt{kfake.SeedTopics(1, "kt.a")}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	produce := func(from, to int) {
		for i := from; i < to; i++ {
			r := &kgo.Record{Topic: "kt.a", Key: []byte("k"), Value: fmt.Append(nil, i), Headers: []kgo.RecordHeader{{Key: "n", Value: fmt.Append(nil, i)}}}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	produce(0, 5)
	c.Stop()
	if c.Kfake() != nil {
		t.Error("Kfake() is not nil while stopped")
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	produce(5, 8)
	recs, err := c.Records(ctx, "kt.")
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 8 {
		t.Fatalf("read %d records, want 8", len(recs))
	}
	for i, r := range recs {
		if v, _ := r.Header("n"); string(r.Value) != fmt.Sprint(i) || v != fmt.Sprint(i) || r.Offset != int64(i) {
			t.Errorf("record %d: offset %d value %q header %q", i, r.Offset, r.Value, v)
		}
	}
	if recs, err := c.Records(ctx, "none."); err != nil || recs != nil {
		t.Errorf("Records of no topic = %v, %v", recs, err)
	}
}

// TestCountProduce counts the produce requests of synchronous produces,
// one request each, across a restart; a cluster without CountProduce
// counts none.
func TestCountProduce(t *testing.T) {
	for _, count := range []bool{true, false} {
		c, cl := startWithClient(t, Options{CountProduce: count, Extra: []kfake.Opt{kfake.SeedTopics(1, "kt.c")}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		produce := func() {
			for range 3 {
				if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "kt.c", Value: []byte("v")}).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
		}
		produce()
		c.Stop()
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		produce()
		want := int64(0)
		if count {
			want = 6
		}
		if got := c.ProduceRequests(); got != want {
			t.Errorf("CountProduce %v: %d produce requests counted, want %d", count, got, want)
		}
	}
}

// startWithClient starts a cluster with o and a client of it, both closed
// when the test ends.
func startWithClient(t *testing.T, o Options) (*Cluster, *kgo.Client) {
	t.Helper()
	c, err := Start(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return c, cl
}
