// Package embedded starts throwaway servers for the demo, the bench command
// and the tests: a PostgreSQL cluster (initdb with wal_level=logical on a
// free loopback port, run as user postgres when the process is root; any
// supported major version through PostgresBin; a synchronous physical
// standby to promote, for failover tests) and an embedded NATS JetStream
// server. Every server it starts is stopped and its files removed by the
// matching Stop or Shutdown method. It does not import package testing, so
// the relay binary can link it.
package embedded
