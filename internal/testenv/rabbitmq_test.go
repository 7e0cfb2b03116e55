package testenv

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestRabbitMQ starts a node with a user of its own, connects as guest and
// as that user, and checks that Shutdown leaves no process of the node
// (beam, epmd) behind.
func TestRabbitMQ(t *testing.T) {
	t.Parallel()
	r, err := StartRabbitMQ(RabbitMQOptions{Users: []RabbitMQUser{{Name: "app", Password: "s3cret", Write: ".*"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Shutdown()
	for _, url := range []string{r.URL("guest", "guest"), r.URL("app", "s3cret")} {
		c, err := amqp.Dial(url)
		if err != nil {
			t.Fatalf("dial: %v\n%s", err, r.Log())
		}
		c.Close()
	}
	if _, err := amqp.Dial(r.URL("app", "wrong")); err == nil {
		t.Error("dial with a wrong password: no error")
	}
	name := "relaytest-" + strconv.Itoa(r.port)
	r.Shutdown()
	if pids := processesWith(t, name); len(pids) > 0 {
		t.Errorf("processes of the node left after Shutdown: %v", pids)
	}
	if _, err := os.Stat(r.dir); !os.IsNotExist(err) {
		t.Errorf("the node's directory is left: %v", err)
	}
}

// processesWith returns the pids of the live processes whose command line
// holds s.
func processesWith(t *testing.T, s string) []string {
	var pids []string
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(b), s) {
			pids = append(pids, filepath.Base(filepath.Dir(f)))
		}
	}
	return pids
}
