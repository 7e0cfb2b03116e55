// Package kafkatest runs an in-process Kafka broker (franz-go's kfake) for
// tests, and reads back what was produced to it.
//
// The broker listens on a fixed loopback port and keeps its data in a
// directory, so Stop and Start behave like a broker restart: a relay started
// as a separate process can be pointed at Addrs, lose its connection, and
// find its topics and records again afterwards.
package kafkatest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Options configures a Cluster. The zero value is one broker that does not
// auto-create topics, with 3 partitions for topics created without a count.
type Options struct {
	// DefaultPartitions is the partition count of topics created with the
	// broker's default. Default 3.
	DefaultPartitions int
	// Dir keeps the broker's data. Default a new temporary directory,
	// removed by Close.
	Dir string
	// Extra are more kfake options, such as kfake.SeedTopics.
	Extra []kfake.Opt
	// CountProduce counts the produce requests the broker receives (see
	// ProduceRequests). Default false.
	CountProduce bool
}

// Cluster is a one-broker kfake cluster that can be stopped and started
// again on the same address with its data. Its methods are safe for
// concurrent use.
type Cluster struct {
	port   int
	dir    string
	ownDir bool
	opts   []kfake.Opt

	mu sync.Mutex
	c  *kfake.Cluster

	count    bool
	produces atomic.Int64 // produce requests received, when count
}

// Start starts a cluster on a free loopback port.
func Start(o Options) (*Cluster, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	c := &Cluster{port: port, dir: o.Dir, count: o.CountProduce}
	if c.dir == "" {
		if c.dir, err = os.MkdirTemp("", "kafkatest-"); err != nil {
			return nil, err
		}
		c.ownDir = true
	}
	parts := o.DefaultPartitions
	if parts <= 0 {
		parts = 3
	}
	c.opts = append([]kfake.Opt{kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(c.dir),
		kfake.DefaultNumPartitions(parts)}, o.Extra...)
	if err := c.Start(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Addrs returns the broker's address, for sink.kafka.brokers.
func (c *Cluster) Addrs() []string { return []string{"127.0.0.1:" + strconv.Itoa(c.port)} }

// Start starts the broker again after Stop, with the data it had. It is a
// no-op while the broker runs.
func (c *Cluster) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.c != nil {
		return nil
	}
	var err error
	for range 100 { // the port may be busy for a moment after a stop
		if c.c, err = kfake.NewCluster(c.opts...); err == nil {
			c.countProduce()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("start kfake on port %d: %w", c.port, err)
}

// countProduce makes the running broker count the produce requests it
// receives, with Options.CountProduce.
func (c *Cluster) countProduce() {
	if !c.count {
		return
	}
	c.c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.produces.Add(1)
		return nil, nil, false // observed, not handled: the broker answers it
	})
}

// ProduceRequests returns how many produce requests the broker received
// since Start first ran, with Options.CountProduce; 0 without.
func (c *Cluster) ProduceRequests() int64 { return c.produces.Load() }

// Stop stops the broker, keeping its data; clients see refused
// connections until Start.
func (c *Cluster) Stop() {
	c.mu.Lock()
	k := c.c
	c.c = nil
	c.mu.Unlock()
	if k != nil {
		k.Close()
	}
}

// Kfake returns the running kfake cluster, for faults and controls, or nil
// while stopped.
func (c *Cluster) Kfake() *kfake.Cluster {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.c
}

// Close stops the broker and removes its data directory if Start made it.
func (c *Cluster) Close() {
	c.Stop()
	if c.ownDir {
		os.RemoveAll(c.dir)
	}
}

// Record is one record as a consumer reads it.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       []byte
	// Headers lists every header in record order.
	Headers []kgo.RecordHeader
	Value   []byte
	// Raw is the record as franz-go decoded it.
	Raw *kgo.Record
}

// Header returns the value of the first header named key, and whether
// there is one.
func (r Record) Header(key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// Records returns every record of the topics whose name starts with
// prefix, sorted by topic, partition and offset, so that each partition's
// records are in the order they were appended.
func (c *Cluster) Records(ctx context.Context, prefix string) ([]Record, error) {
	return Read(ctx, c.Addrs(), prefix)
}

// Read returns every record of the topics on brokers whose name starts
// with prefix, like Cluster.Records.
func Read(ctx context.Context, brokers []string, prefix string) ([]Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	all, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	var topics []string
	for _, name := range all.Names() {
		if strings.HasPrefix(name, prefix) {
			topics = append(topics, name)
		}
	}
	if len(topics) == 0 {
		return nil, nil
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("list end offsets: %w", err)
	}
	parts := map[string]map[int32]kgo.Offset{}
	want := 0
	var errs []error
	ends.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			errs = append(errs, fmt.Errorf("end offset of %s/%d: %w", o.Topic, o.Partition, o.Err))
			return
		}
		if o.Offset == 0 {
			return
		}
		if parts[o.Topic] == nil {
			parts[o.Topic] = map[int32]kgo.Offset{}
		}
		parts[o.Topic][o.Partition] = kgo.NewOffset().AtStart()
		want += int(o.Offset)
	})
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if want == 0 {
		return nil, nil
	}
	cl.AddConsumePartitions(parts)
	var recs []Record
	err = consume(ctx, cl, func(r Record) bool {
		recs = append(recs, r)
		return len(recs) >= want
	})
	if err != nil {
		return nil, fmt.Errorf("read %d of %d records: %w", len(recs), want, err)
	}
	slices.SortStableFunc(recs, func(a, b Record) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		if a.Partition != b.Partition {
			return int(a.Partition - b.Partition)
		}
		return int(a.Offset - b.Offset)
	})
	return recs, nil
}

// ReadCommitted returns the records of the topics on brokers whose name
// starts with prefix that a consumer with isolation.level read_committed
// sees, like Read. To know where the committed records end it first
// appends a marker record (header message_id "marker-" and a number) to
// every partition; markers are left out. Transactions still open hold a
// marker back until they end.
func ReadCommitted(ctx context.Context, brokers []string, prefix string) ([]Record, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	all, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("list topics: %w", err)
	}
	parts := map[string]map[int32]kgo.Offset{}
	left := 0
	mine := "marker-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	for _, d := range all.Sorted() {
		if !strings.HasPrefix(d.Topic, prefix) {
			continue
		}
		parts[d.Topic] = map[int32]kgo.Offset{}
		for _, p := range d.Partitions.Numbers() {
			marker := &kgo.Record{Topic: d.Topic, Partition: p, Headers: []kgo.RecordHeader{{Key: "message_id", Value: []byte(mine)}}}
			if err := cl.ProduceSync(ctx, marker).FirstErr(); err != nil {
				return nil, fmt.Errorf("append a marker to %s/%d: %w", d.Topic, p, err)
			}
			parts[d.Topic][p] = kgo.NewOffset().AtStart()
			left++
		}
	}
	if left == 0 {
		return nil, nil
	}
	cl.AddConsumePartitions(parts)
	var recs []Record
	err = consume(ctx, cl, func(r Record) bool {
		if id, _ := r.Header("message_id"); strings.HasPrefix(id, "marker-") {
			if id == mine {
				left--
			}
		} else {
			recs = append(recs, r)
		}
		return left == 0
	})
	if err != nil {
		return nil, fmt.Errorf("read committed records (%d partitions left): %w", left, err)
	}
	return recs, nil
}

// consume passes the records cl fetches to fn, in fetch order, until fn
// returns true, a fetch fails or ctx ends.
func consume(ctx context.Context, cl *kgo.Client, fn func(Record) bool) error {
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var errs []error
		fs.EachError(func(topic string, p int32, err error) {
			errs = append(errs, fmt.Errorf("fetch %s/%d: %w", topic, p, err))
		})
		if len(errs) > 0 {
			return errors.Join(errs...)
		}
		for _, r := range fs.Records() {
			if fn(Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: r.Key, Headers: r.Headers, Value: r.Value, Raw: r}) {
				return nil
			}
		}
	}
}
