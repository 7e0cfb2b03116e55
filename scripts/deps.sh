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

# kcat (Debian package kcat, formerly kafkacat): sink/kafka's interop test
# reads with it what the relay wrote to an in-process kfake cluster.
if command -v kcat >/dev/null 2>&1; then
  echo "deps: kcat present"
else
  apt_install kcat
fi

# The SQS emulator (npm package local-aws-sqs) for sink/sqs's tests, installed
# into the cache internal/testenv runs it from (testenv.SQSCacheDir; keep the
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
