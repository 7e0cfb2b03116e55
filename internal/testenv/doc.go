// Package testenv starts the real servers the tests, the demo and the bench
// command need: a throwaway PostgreSQL cluster (initdb with wal_level=logical
// on a free loopback port, run as user postgres when the process is root; any
// supported major version through PostgresBin; a synchronous physical standby
// to promote, for failover tests) and an embedded NATS JetStream server.
// Every server it starts is stopped and its files removed by the matching
// Stop method.
package testenv
