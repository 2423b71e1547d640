#!/usr/bin/env bash
# scripts/prereqs.sh: the system packages the project needs, installed with apt-get when missing
# (as root on a Debian-like system), or named in a clear refusal otherwise. scripts/test.sh and
# scripts/demo.sh run it first, so their commands work on a fresh machine; .ci/run through them.
#
# Checked by what is needed, not by package name, where that can be asked (a header through
# pkg-config, a command on PATH), so that another distribution's packages count too:
#   - Java 17 and Maven: scripts/kafka.sh fetches Apache Kafka's jars with Maven and runs them;
#   - a C toolchain, make, pkg-config and the OpenSSL, zlib and libcurl headers: rdkafka builds its
#     bundled librdkafka. Without libcurl's headers librdkafka still builds, silently without
#     OAUTHBEARER/OIDC (`sasl.oauthbearer.method` is then "not supported in this build" and the
#     OIDC tests fail): the reason this script exists;
#   - the prometheus package: promtool checks the alert rules, the server fires them
#     (tests/deploy.rs, tests/prometheus.rs);
#   - openssl (test certificates) and jq (scripts/test.sh reads cargo's list of test binaries);
#   - python3 with its venv module: scripts/validators.sh installs the deployment files'
#     validators (kubernetes-validate, check-jsonschema) from PyPI into a virtualenv.
# PostgreSQL's server binaries are scripts/postgres.sh's to find or install (it is run on its own
# too).
#
# A build of librdkafka made before its headers were installed lacks what they bring, and cargo
# does not build it again by itself: when this script installs a build header, it removes the
# earlier librdkafka build of this checkout (`cargo clean -p rdkafka-sys -p curl-sys`).
set -euo pipefail
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)

missing=() build_headers=0
need() { missing+=("$1"); }
has_pc() { command -v pkg-config >/dev/null && pkg-config --exists "$1"; }

command -v java >/dev/null || need openjdk-17-jre-headless
command -v mvn >/dev/null || need maven
command -v cc >/dev/null && command -v make >/dev/null || need build-essential
command -v pkg-config >/dev/null || need pkg-config
has_pc openssl || { need libssl-dev; build_headers=1; }
has_pc zlib || { need zlib1g-dev; build_headers=1; }
has_pc libcurl || { need libcurl4-openssl-dev; build_headers=1; }
{ command -v promtool >/dev/null && command -v prometheus >/dev/null; } || need prometheus
command -v openssl >/dev/null || need openssl
command -v jq >/dev/null || need jq
if ! command -v python3 >/dev/null; then need python3; need python3-venv
elif ! python3 -c 'import venv, ensurepip' 2>/dev/null; then need python3-venv; fi

[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "prereqs.sh: missing: ${missing[*]} (Debian's package names): install them (README, Requirements)" >&2
  exit 1
fi
echo "prereqs.sh: installing ${missing[*]}" >&2
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if [ "$build_headers" = 1 ] && [ -d "$ROOT/target" ] && command -v cargo >/dev/null; then
  echo "prereqs.sh: build headers installed: librdkafka is built again with them" >&2
  (cd "$ROOT" && cargo clean --quiet -p rdkafka-sys -p curl-sys) || true
fi
