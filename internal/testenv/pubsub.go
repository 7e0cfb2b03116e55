package testenv

import (
	"context"
	"strings"
	"testing"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// PubSub is Google's in-process Pub/Sub fake (pstest) behind a Proxy, so
// that Stop and Start make it unreachable and reachable again on the same
// address without losing its topics and messages.
type PubSub struct {
	Server *pstest.Server
	proxy  *Proxy
}

// StartPubSub starts a fake on a free loopback port with opts (error
// injection, say) and a proxy in front of it; both end with the test.
func StartPubSub(t testing.TB, opts ...pstest.ServerReactorOption) *PubSub {
	t.Helper()
	srv := pstest.NewServer(opts...)
	p, err := StartProxy(srv.Addr)
	if err != nil {
		srv.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		p.Close()
		srv.Close()
	})
	return &PubSub{Server: srv, proxy: p}
}

// Addr returns the host:port clients dial (the proxy's), the value of
// PUBSUB_EMULATOR_HOST for a relay.
func (ps *PubSub) Addr() string { return ps.proxy.Addr() }

// Proxy returns the proxy in front of the fake, to cut or stall it.
func (ps *PubSub) Proxy() *Proxy { return ps.proxy }

// Stop makes the fake unreachable: connections are cut and refused.
func (ps *PubSub) Stop() { ps.proxy.Down() }

// Start makes it reachable again on the same address.
func (ps *PubSub) Start(t testing.TB) {
	t.Helper()
	if err := ps.proxy.Up(); err != nil {
		t.Fatal(err)
	}
}

// ClientOptions returns the client options that reach the fake through
// addr without credentials, as PUBSUB_EMULATOR_HOST does.
func ClientOptions(addr string) []option.ClientOption {
	return []option.ClientOption{option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials()))}
}

// CreateTopic creates topic ID id in project.
func (ps *PubSub) CreateTopic(t testing.TB, project, id string) {
	t.Helper()
	_, err := ps.Server.GServer.CreateTopic(context.Background(), &pb.Topic{Name: "projects/" + project + "/topics/" + id})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		t.Fatal(err)
	}
}

// Messages returns the messages published to topics of project whose IDs
// start with prefix, in the order the fake received them.
func (ps *PubSub) Messages(project, prefix string) []*pstest.Message {
	want := "projects/" + project + "/topics/" + prefix
	var out []*pstest.Message
	for _, m := range ps.Server.Messages() {
		if strings.HasPrefix(m.Topic, want) {
			out = append(out, m)
		}
	}
	return out
}
