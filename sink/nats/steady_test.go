package nats

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/testenv"
)

// serverEnv names the environment variable that makes the test binary a
// NATS server for BenchmarkSteadyPublish instead of running tests, and
// urlEnv the one that points the benchmark at a running server instead of
// starting one: for counting its process's system calls with perf stat.
const (
	serverEnv = "RELAY_NATS_BENCH_SERVER"
	urlEnv    = "RELAY_NATS_BENCH_URL"
)

func TestMain(m *testing.M) {
	if os.Getenv(serverEnv) == "1" {
		serveNATS()
		return
	}
	os.Exit(m.Run())
}

// serveNATS runs an embedded JetStream server, writes its URL on a line of
// stdout and serves until stdin closes.
func serveNATS() {
	srv, err := testenv.StartNATS(testenv.NATSOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer srv.Shutdown()
	fmt.Println(srv.URL())
	io.Copy(io.Discard, os.Stdin)
}

// startServerProcess starts a JetStream server in a child process, so that
// what the benchmark measures of its own process is the client's work only,
// and returns its URL.
func startServerProcess(b *testing.B) string {
	if url := os.Getenv(urlEnv); url != "" {
		return url
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), serverEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	url, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	return url[:len(url)-1]
}

// BenchmarkSteadyPublish publishes batches of a few events at 2,000 events
// per second, one call after the other, to a JetStream server in another
// process, as the relay does with a steady stream of small transactions.
// One op is one event. It reports what the publishing process spent per
// event: CPU time (cpu-µs/event) and context switches (ctxsw/event), which
// include the pacing's own sleeps.
func BenchmarkSteadyPublish(b *testing.B) {
	url := startServerProcess(b)
	s := newStreamSink(b, url, Options{})
	for _, size := range []int{1, 4} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			batch := testEvents(size, size)
			for _, e := range batch {
				e.Headers = map[string]string{"source": "bench"}
			}
			interval := time.Duration(size) * time.Second / 2000
			ctx := context.Background()
			b.ReportAllocs()
			before := usage(b)
			b.ResetTimer()
			next := time.Now()
			for i := 0; i < b.N; i += size {
				next = next.Add(interval)
				time.Sleep(time.Until(next))
				if err := s.Publish(ctx, batch[:min(size, b.N-i)]); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			after := usage(b)
			cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
			switches := after.Nvcsw + after.Nivcsw - before.Nvcsw - before.Nivcsw
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/event")
			b.ReportMetric(float64(switches)/float64(b.N), "ctxsw/event")
		})
	}
}

func usage(b *testing.B) syscall.Rusage {
	var u syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &u); err != nil {
		b.Fatal(err)
	}
	return u
}
