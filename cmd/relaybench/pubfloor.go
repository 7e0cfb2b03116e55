package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// floorTopic is where the publishing poll floor publishes: a NATS subject
// of the bench stream, or a Kafka topic counted with the bench topics.
const floorTopic = "bench.floor"

// floorLinger is the publishing poll floor's Kafka linger, the relay's
// default sink.kafka.linger.
const floorLinger = 5 * time.Millisecond

// floorRow is what the publishing poll floor sends of a deleted row.
type floorRow struct{ id, payload []byte }

// publishFunc publishes rows and returns once the sink acknowledged all.
type publishFunc func(ctx context.Context, rows []floorRow) error

// prepareFloorSink makes the sink of d ready for the publishing poll
// floor: for NATS a fresh bench stream holding floorTopic, for Kafka
// floorTopic created on kfake.
func (b *bench) prepareFloorSink(ctx context.Context, d *database) error {
	if d.sink == "kafka" {
		cl, err := kgo.NewClient(kgo.SeedBrokers(d.brokers...))
		if err != nil {
			return err
		}
		defer cl.Close()
		_, err = kadm.NewClient(cl).CreateTopic(ctx, 3, 1, nil, floorTopic)
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("create topic %s: %w", floorTopic, err)
		}
		return nil
	}
	b.deleteStream(ctx)
	_, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: benchStream, Subjects: []string{"bench.>"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute})
	return err
}

// floorSinkArgs are the -as-floor arguments naming the sink of d.
func floorSinkArgs(d *database) []string {
	if d.sink == "kafka" {
		return []string{"kafka", strings.Join(d.brokers, ",")}
	}
	return []string{"nats", d.natsURL}
}

// floorPublisher connects to the sink (nats or kafka) at target (a NATS
// URL, or Kafka brokers separated by commas). It returns the publishing
// poll floor's publish function and what closes the connection.
func floorPublisher(sink, target string) (publishFunc, func(), error) {
	switch sink {
	case "nats":
		nc, err := nats.Connect(target)
		if err != nil {
			return nil, nil, err
		}
		js, err := jetstream.New(nc)
		if err != nil {
			nc.Close()
			return nil, nil, err
		}
		return natsFloorPublish(js), nc.Close, nil
	case "kafka":
		cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(target, ",")...),
			kgo.DefaultProduceTopic(floorTopic), kgo.ProducerLinger(floorLinger))
		if err != nil {
			return nil, nil, err
		}
		return kafkaFloorPublish(cl), cl.Close, nil
	}
	return nil, nil, fmt.Errorf("unknown sink %q (nats, kafka)", sink)
}

// natsFloorPublish publishes each row asynchronously with its id as
// Nats-Msg-Id, then waits for every acknowledgement.
func natsFloorPublish(js jetstream.JetStream) publishFunc {
	return func(ctx context.Context, rows []floorRow) error {
		acks := make([]jetstream.PubAckFuture, 0, len(rows))
		for _, r := range rows {
			msg := &nats.Msg{Subject: floorTopic, Data: r.payload, Header: nats.Header{jetstream.MsgIDHeader: {string(r.id)}}}
			f, err := js.PublishMsgAsync(msg)
			if err != nil {
				return err
			}
			acks = append(acks, f)
		}
		for _, f := range acks {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
}

// kafkaFloorPublish produces each row as a record keyed by its id and
// waits until all are acknowledged.
func kafkaFloorPublish(cl *kgo.Client) publishFunc {
	return func(ctx context.Context, rows []floorRow) error {
		recs := make([]*kgo.Record, len(rows))
		for i, r := range rows {
			recs[i] = &kgo.Record{Key: r.id, Value: r.payload}
		}
		return cl.ProduceSync(ctx, recs...).FirstErr()
	}
}

// deleteRows runs query, a rawDelete, and returns the id and payload of
// every returned row.
func deleteRows(ctx context.Context, conn *pgx.Conn, query string) ([]floorRow, error) {
	rows, err := conn.Query(ctx, query)
	if err != nil {
		return nil, err
	}
	id, payload := -1, -1
	for i, f := range rows.FieldDescriptions() {
		switch f.Name {
		case "id":
			id = i
		case "payload":
			payload = i
		}
	}
	if id < 0 || payload < 0 {
		rows.Close()
		return nil, errors.New("the outbox returned no id or payload column")
	}
	var out []floorRow
	for rows.Next() {
		v := rows.RawValues()
		out = append(out, floorRow{id: append([]byte(nil), v[id]...), payload: append([]byte(nil), v[payload]...)})
	}
	rows.Close()
	return out, rows.Err()
}
