#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian 12 machine: system packages, .venv, the project in
# editable mode (torch from /opt/wheels when that CPU wheel exists), and the Java gateway jar.
# Fast when everything is already in place: each stage checks a stamp or a probe first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
log() { printf '[bootstrap] %s\n' "$*" >&2; }

# --- Debian packages -------------------------------------------------------------------------
missing=()
java_ok() { command -v javac >/dev/null 2>&1 && javac -version 2>&1 | grep -Eq 'javac (1[7-9]|2[0-9])'; }
java_ok || missing+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null 2>&1 || { missing+=(python3 python3-venv); PY=python3; }
if command -v "$PY" >/dev/null 2>&1 && ! "$PY" -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
# Services the tests run for real on loopback: Graphite, Docker, PostgreSQL, systemd-nspawn.
for pkg in graphite-carbon graphite-web docker.io docker-compose busybox-static systemd-container postgresql; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
  || { log "Python >= 3.11 is required ($PY is $("$PY" -V 2>&1))"; exit 1; }

# --- Python virtual environment ----------------------------------------------------------------
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  "$PY" -m venv .venv
fi
VPY="$ROOT/.venv/bin/python"
stamp_src=$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)
stamp=.venv/.samm-installed
if [ "$(cat "$stamp" 2>/dev/null)" != "$stamp_src" ]; then
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  "$VPY" -m pip install -q --upgrade pip setuptools wheel
  if ! "$VPY" -c 'import torch' >/dev/null 2>&1; then
    wheel=$(ls /opt/wheels/torch-*.whl 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -n "$wheel" ]; then
      log "installing torch from $wheel"
      "$VPY" -m pip install -q "$wheel"
    else
      log "installing torch from PyPI (no /opt/wheels wheel found)"
      "$VPY" -m pip install -q torch
    fi
  fi
  log "installing samm[dev,train,testbed,ray] (editable)"
  "$VPY" -m pip install -q -e ".[dev,train,testbed,ray]"
  echo "$stamp_src" > "$stamp"
fi

# --- Java gateway ---------------------------------------------------------------------------
JAR=java/target/samm-gateway.jar
if [ ! -f "$JAR" ] || [ -n "$(find java/pom.xml java/src -newer "$JAR" -type f 2>/dev/null | head -n 1)" ]; then
  log "building the Java gateway (mvn package)"
  (cd java && mvn -q -B package ${SAMM_MVN_FLAGS:-})
fi
test -f "$JAR" || { log "gateway jar missing after the build: $JAR"; exit 1; }
log "ready"
