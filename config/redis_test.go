package config

import (
	"reflect"
	"strings"
	"testing"
)

// redisCase is a valid config with a redis sink whose keys are section,
// indented under sink.redis from line 8.
func redisCase(section string) string {
	return sinkCase("redis", "  redis:\n"+section)
}

func TestRedisAccepts(t *testing.T) {
	yaml := redisCase(`    url: rediss://redis-1:6380/2
    stream: "orders:{aggregate_type}"
    username: relay
    password: ${REDIS_PASSWORD}
    tls:
      enabled: true
      ca_file: /etc/redis/ca.pem
    sentinel:
      master: mymaster
      addrs: [s1:26379, s2:26379]
      password: ${SENTINEL_PASSWORD}
    max_len: 100000
`)
	c, err := Parse([]byte(yaml), env(map[string]string{"REDIS_PASSWORD": "s3cret", "SENTINEL_PASSWORD": "t0p"}))
	if err != nil {
		t.Fatal(err)
	}
	want := Redis{
		URL: "rediss://redis-1:6380/2", Stream: "orders:{aggregate_type}", Username: "relay", Password: "s3cret",
		TLS:      TLS{Enabled: true, CAFile: "/etc/redis/ca.pem"},
		Sentinel: RedisSentinel{Master: "mymaster", Addrs: []string{"s1:26379", "s2:26379"}, Password: "t0p"},
		MaxLen:   100000,
	}
	if !reflect.DeepEqual(c.Sink.Redis, want) {
		t.Errorf("got  %+v\nwant %+v", c.Sink.Redis, want)
	}
	c, err = Parse([]byte(redisCase("    cluster_addrs: [n2:6379, n3:6379]\n")), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Sink.Redis; got.URL != "redis://127.0.0.1:6379/0" || got.Stream != "outbox.{aggregate_type}" || len(got.ClusterAddrs) != 2 {
		t.Errorf("defaults: got %+v", got)
	}
}

func TestRedisErrors(t *testing.T) {
	tests := []struct {
		name, section string
		line          int
		key, msg      string
	}{
		{"scheme", "    url: http://r:6379\n", 8, "sink.redis.url", "must be a redis://, rediss:// or unix:// URL"},
		{"no host", "    url: redis:///0\n", 8, "sink.redis.url", "has no host"},
		{"cluster db", "    url: redis://r:6379/3\n    cluster_addrs: [a:1]\n", 8, "sink.redis.url", "a Redis Cluster has database 0 only"},
		{"template", "    stream: \"o.{nope}\"\n", 8, "sink.redis.stream", "template \"o.{nope}\": unknown placeholder {nope}"},
		{"empty password", "    password: ${UNSET:-}\n", 8, "sink.redis.password", "must not be empty (remove the key to connect without it)"},
		{"tls ca without enabled", "    tls:\n      ca_file: ca.pem\n", 9, "sink.redis.tls.ca_file", "has no effect unless sink.redis.tls.enabled is true"},
		{"cluster addr", "    cluster_addrs: [nohost]\n", 8, "sink.redis.cluster_addrs[0]", "must be host:port"},
		{"both", "    cluster_addrs: [a:1]\n    sentinel:\n      master: m\n      addrs: [s:26379]\n", 9, "sink.redis.sentinel", "set either sink.redis.cluster_addrs or sink.redis.sentinel"},
		{"master without addrs", "    sentinel:\n      master: m\n", 8, "sink.redis.sentinel.addrs", "required (the Sentinels' host:port addresses)"},
		{"addrs without master", "    sentinel:\n      addrs: [s:26379]\n", 8, "sink.redis.sentinel.master", "required (the master's name"},
		{"max_len", "    max_len: -1\n", 8, "sink.redis.max_len", "must be at least 0 (0: no trimming), got -1"},
		{"unknown key", "    streams: x\n", 8, "sink.redis.streams", "unknown key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { checkError(t, redisCase(tt.section), tt.line, tt.key, tt.msg) })
	}
}

func TestRedisErrorsHideSecrets(t *testing.T) {
	for _, section := range []string{
		"    url: http://u:s3cret@r:6379\n",
		"    url: redis://u:s3cret@r:6379/3\n    cluster_addrs: [a:1]\n",
		"    password: [s3cret]\n",
	} {
		_, err := Parse([]byte(redisCase(section)), env(nil))
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: %v", section, err)
		}
	}
}
