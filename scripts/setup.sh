#!/usr/bin/env bash
# Installs what a fresh Debian machine needs to build and test nvmf-rs. Idempotent: skips what
# is present. Works as root or through sudo. Fails with a clear message when it cannot install.
set -euo pipefail

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# Debian packages: verbs + rdmacm headers and providers for rdma-sys, libclang for its bindgen,
# pkg-config to find them, rdma-core/ibverbs-utils for the diagnostics users compare against,
# valgrind for scripts/bench.sh's instructions per I/O (callgrind).
PKGS=(libibverbs-dev librdmacm-dev ibverbs-providers rdma-core ibverbs-utils pkg-config clang libclang-dev valgrind)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  command -v apt-get >/dev/null || die "apt-get not found: this script supports Debian (and Ubuntu). Install by hand: ${missing[*]}"
  if [ "$(id -u)" -eq 0 ]; then SUDO=(); elif command -v sudo >/dev/null; then SUDO=(sudo); else
    die "need root or sudo to install: ${missing[*]}"; fi
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -q >/dev/null || die "apt-get update failed (is the Debian mirror reachable?)"
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install failed for: ${missing[*]}"
else
  say "Debian packages present"
fi

# Rust: the workspace needs cargo with edition 2024 (Rust >= 1.85). We do not download
# toolchains; rustup is the way to get one.
if ! command -v cargo >/dev/null; then
  [ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
fi
command -v cargo >/dev/null || die "cargo not found: install Rust >= 1.85 with rustup (https://rustup.rs), then re-run"
ver=$(rustc --version | awk '{print $2}')
major=${ver%%.*}; rest=${ver#*.}; minor=${rest%%.*}
if [ "$major" -lt 1 ] || { [ "$major" -eq 1 ] && [ "$minor" -lt 85 ]; }; then
  die "rustc $ver is too old: nvmf-rs needs Rust >= 1.85 (rustup update stable)"
fi
for comp in rustfmt clippy; do
  if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null; then
      say "adding rust component $comp"; rustup component add "$comp" >/dev/null || die "rustup component add $comp failed"
    else
      die "cargo ${comp/rustfmt/fmt} missing and no rustup to add it"
    fi
  fi
done
say "rust $ver ready"
