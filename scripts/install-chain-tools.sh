#!/usr/bin/env bash
# Installs the local chain tools that tests/billing/coins runs against (idempotent; root).
#   - litecoind (Debian, Litecoin Core 0.21)      -> regtest Core-RPC watcher tests
#   - monero (Debian, monerod + monero-wallet-rpc) -> regtest Monero tests when they can run
#   - @foundry-rs/anvil (npm, ships its binary)    -> local Ethereum chain, into <repo>/.chain-tools
#   - solc (npm, solc-js)                          -> offline compile of the test ERC-20
# A package that the apt sources do not carry is skipped with a note; the tests then skip.
# .chain-tools/ is a local install folder and is not committed.
set -uo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
TOOLS="$REPO/.chain-tools"

apt_updated=0
apt_install() {
  local pkg="$1" bin="$2"
  if command -v "$bin" >/dev/null 2>&1; then
    echo "install-chain-tools: $pkg already installed ($(command -v "$bin"))"
    return 0
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-chain-tools: no apt-get; skipping $pkg" >&2
    return 0
  fi
  if [ "$apt_updated" = 0 ]; then
    apt-get update -qq || echo "install-chain-tools: apt-get update failed" >&2
    apt_updated=1
  fi
  local cand
  cand="$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')"
  if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
    echo "install-chain-tools: NOTE: apt has no package '$pkg' here; skipping (its tests will skip)" >&2
    return 0
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$pkg" \
    || echo "install-chain-tools: apt-get install $pkg failed; its tests will skip" >&2
}

apt_install litecoind litecoind
apt_install monero monerod

if command -v npm >/dev/null 2>&1; then
  mkdir -p "$TOOLS"
  if [ -x "$TOOLS/node_modules/.bin/anvil" ] && [ -d "$TOOLS/node_modules/solc" ]; then
    echo "install-chain-tools: anvil and solc already in $TOOLS"
  else
    npm install --silent --no-audit --no-fund --prefix "$TOOLS" @foundry-rs/anvil solc \
      || echo "install-chain-tools: npm install failed; the Ethereum tests will skip" >&2
  fi
  if [ -x "$TOOLS/node_modules/.bin/anvil" ]; then
    "$TOOLS/node_modules/.bin/anvil" --version >/dev/null 2>&1 \
      || echo "install-chain-tools: NOTE: anvil is installed but does not run here" >&2
  fi
else
  echo "install-chain-tools: no npm; the Ethereum tests will skip" >&2
fi
exit 0
