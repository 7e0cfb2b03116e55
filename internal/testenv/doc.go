// Package testenv gives tests the servers they need: the PostgreSQL cluster
// and NATS server of internal/embedded (re-exported here), a database per
// test in one shared cluster (NewDB, with Main in TestMain), a nats-server
// process of its own for tests that reload its configuration
// (StartNATSProcess), the SQS emulator, redis-server processes (StartRedis:
// plain, TLS, cluster mode or Sentinel) and a TCP proxy that cuts or stalls
// connections. It imports
// package testing; code outside tests uses internal/embedded instead.
package testenv
