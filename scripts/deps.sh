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

# Later: npm packages for the SQS/webhook emulators.
# if ! command -v npm >/dev/null 2>&1; then apt_install npm; fi
