package main

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/outboxrelay/relay/internal/verify"
)

// pubsubFake is the Pub/Sub fake every relay of the package reaches
// through PUBSUB_EMULATOR_HOST, which parallel tests cannot set each for
// themselves; each test uses a project of its own (newPubSubProject).
var (
	pubsubFake     *pstest.Server
	pubsubProjects atomic.Int64
)

// startPubSubFake starts pubsubFake and points PUBSUB_EMULATOR_HOST at it.
// TestMain calls it before any test runs.
func startPubSubFake() {
	pubsubFake = pstest.NewServer()
	os.Setenv("PUBSUB_EMULATOR_HOST", pubsubFake.Addr)
}

// startPubSub returns the config's sink block for a fixed topic in a
// project of the test's own, which relay init creates, and a collector of
// the topic's messages in the order the fake received them.
func startPubSub(t *testing.T) (string, func() []verify.Delivery) {
	project := fmt.Sprintf("relay-e2e-%d", pubsubProjects.Add(1))
	collect := func() []verify.Delivery {
		var ds []verify.Delivery
		for _, m := range pubsubFake.Messages() {
			if !strings.HasPrefix(m.Topic, "projects/"+project+"/") {
				continue
			}
			d := payloadDelivery(m.Attributes["message_id"], m.Attributes["aggregate_id"], m.Data)
			if m.OrderingKey != d.AggregateID {
				d.Problem = "ordering key " + m.OrderingKey + " is not the aggregate_id"
			}
			ds = append(ds, d)
		}
		return ds
	}
	return fmt.Sprintf("sink:\n  type: pubsub\n  pubsub:\n    project_id: %s\n    topic: outbox-events\n", project), collect
}
