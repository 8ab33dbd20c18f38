#!/usr/bin/env bash
# Installs the local chain tools that tests/billing/payments/coins runs against (idempotent; root).
#   - litecoind (Debian, Litecoin Core 0.21)      -> regtest Core-RPC watcher tests
#   - monero (Debian, monerod + monero-wallet-rpc) -> regtest Monero tests when they can run
#   - @foundry-rs/anvil (npm, ships its binary)    -> local Ethereum chain, into <repo>/.chain-tools
#   - solc (npm, solc-js)                          -> offline compile of the test ERC-20
# Locally, a tool that cannot be installed is skipped with a note (its tests then skip).
# With CI=true every failure is collected and the script exits non-zero at the end, so CI
# never goes green by skipping the chain tests (tests/tools.py fails them there too).
# .chain-tools/ is a local install folder and is not committed.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="$REPO/.chain-tools"

apt_updated=0
failures=()
case "${CI:-}" in 1|true|TRUE|yes) IN_CI=1 ;; *) IN_CI=0 ;; esac

fail() {  # a tool could not be installed: a note locally, an error (collected) in CI
  echo "install-chain-tools: $1" >&2
  failures+=("$1")
}
apt_install() {
  local pkg="$1" bin="$2"
  if command -v "$bin" >/dev/null 2>&1; then
    echo "install-chain-tools: $pkg already installed ($(command -v "$bin"))"
    return 0
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    fail "no apt-get; cannot install $pkg"
    return 0
  fi
  if [ "$apt_updated" = 0 ]; then
    apt-get update -qq || fail "apt-get update failed"
    apt_updated=1
  fi
  local cand
  cand="$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')"
  if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
    fail "apt has no package '$pkg' here (its tests skip locally, fail in CI)"
    return 0
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" \
    || fail "apt-get install $pkg failed"
}

apt_install litecoind litecoind
apt_install monero monerod

if command -v npm >/dev/null 2>&1; then
  mkdir -p "$TOOLS"
  if [ -x "$TOOLS/node_modules/.bin/anvil" ] && [ -d "$TOOLS/node_modules/solc" ]; then
    echo "install-chain-tools: anvil and solc already in $TOOLS"
  else
    npm install --silent --no-audit --no-fund --prefix "$TOOLS" @foundry-rs/anvil solc \
      || fail "npm install of anvil/solc failed"
  fi
  if [ -x "$TOOLS/node_modules/.bin/anvil" ]; then
    "$TOOLS/node_modules/.bin/anvil" --version >/dev/null 2>&1 \
      || fail "anvil is installed but does not run here"
  fi
else
  fail "no npm: cannot install anvil/solc"
fi

if [ "${#failures[@]}" -gt 0 ] && [ "$IN_CI" = 1 ]; then
  echo "install-chain-tools: CI=true and ${#failures[@]} install(s) failed:" >&2
  printf '  - %s\n' "${failures[@]}" >&2
  exit 1
fi
exit 0
