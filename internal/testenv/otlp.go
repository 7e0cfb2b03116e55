package testenv

import (
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// OTLP is an in-process OTLP trace receiver: OTLP/gRPC on GRPCAddr and
// OTLP/HTTP (protobuf) on HTTPURL. It keeps every span it receives.
type OTLP struct {
	collectorpb.UnimplementedTraceServiceServer
	// GRPCAddr is the host:port of the gRPC receiver.
	GRPCAddr string
	// HTTPURL is the base URL of the HTTP receiver, which serves /v1/traces.
	HTTPURL string

	mu    sync.Mutex
	spans []Span
}

// Span is a received span, its ids in hex and its attribute values as text.
type Span struct {
	Name                          string
	Kind                          tracepb.Span_SpanKind
	TraceID, SpanID, ParentSpanID string
	Attrs                         map[string]string
	Links                         []Link
	Error                         bool // status code ERROR
	Resource                      map[string]string
	Transport                     string // "grpc" or "http"
}

// Link is a received span link.
type Link struct{ TraceID, SpanID string }

// StartOTLP starts a receiver on loopback ports; the test's cleanup stops it.
func StartOTLP(t testing.TB) *OTLP {
	t.Helper()
	r := &OTLP{}
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.GRPCAddr, r.HTTPURL = gl.Addr().String(), "http://"+hl.Addr().String()
	gs := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(gs, r)
	hs := &http.Server{Handler: http.HandlerFunc(r.serveHTTP), ReadHeaderTimeout: 10 * time.Second}
	go gs.Serve(gl)
	go hs.Serve(hl)
	t.Cleanup(func() {
		gs.Stop()
		hs.Close()
	})
	return r
}

// Export receives spans over gRPC.
func (r *OTLP) Export(_ context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	r.add(req, "grpc")
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// serveHTTP receives spans posted as protobuf to /v1/traces.
func (r *OTLP) serveHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	var msg collectorpb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &msg)
	}
	if req.URL.Path != "/v1/traces" || req.Method != http.MethodPost || err != nil {
		http.Error(w, fmt.Sprintf("want a protobuf POST to /v1/traces: %v", err), http.StatusBadRequest)
		return
	}
	r.add(&msg, "http")
	out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func (r *OTLP) add(req *collectorpb.ExportTraceServiceRequest, transport string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				sp := Span{Name: s.Name, Kind: s.Kind, TraceID: hex.EncodeToString(s.TraceId),
					SpanID: hex.EncodeToString(s.SpanId), ParentSpanID: hex.EncodeToString(s.ParentSpanId),
					Attrs: attrs(s.Attributes), Error: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
					Resource: res, Transport: transport}
				for _, l := range s.Links {
					sp.Links = append(sp.Links, Link{TraceID: hex.EncodeToString(l.TraceId), SpanID: hex.EncodeToString(l.SpanId)})
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		switch v := kv.Value.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.Key] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.Key] = fmt.Sprint(v.IntValue)
		default:
			m[kv.Key] = kv.Value.String()
		}
	}
	return m
}

// Spans returns the spans received so far.
func (r *OTLP) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Wait polls the received spans until done returns true for them, failing
// the test after timeout.
func (r *OTLP) Wait(t testing.TB, timeout time.Duration, what string, done func([]Span) bool) []Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		spans := r.Spans()
		if done(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("OTLP receiver: %s not received within %s (%d spans)", what, timeout, len(spans))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
