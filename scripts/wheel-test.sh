#!/usr/bin/env bash
# The wheel installs and works without a Rust toolchain: builds it (scripts/wheel.sh),
# installs it with pip into a fresh virtual environment whose PATH holds nothing but that
# environment (no cargo, rustc, cmake, nasm or C compiler), then runs the README's Python
# example there. torch is the one package taken from .venv (a .pth file added after the
# install, behind the fresh environment's own packages): the example trains with it, and
# its wheels are ~4 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
scripts/wheel.sh
wheel=$(ls "$repo"/dist/sluice-*manylinux*.whl)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
bare="$tmp/venv/bin"
for tool in cargo rustc cmake nasm cc gcc; do
  if PATH="$bare" command -v "$tool" >/dev/null; then
    echo "wheel-test: $tool is on the bare PATH" >&2; exit 1
  fi
done
start=$(date +%s%N)
PATH="$bare" "$bare/python" -m pip install -q --no-cache-dir "$wheel"
ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "==> installed $(basename "$wheel") ($(du -h "$wheel" | cut -f1)) into a fresh venv in ${ms} ms"
site=$("$bare/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
torch_site=$(.venv/bin/python -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))')
echo "$torch_site" > "$site/zz-torch-from-dot-venv.pth"
# The README's Python example: the first ```python block after "## Python".
awk '/^## Python/{p=1} p&&/^```python/{f=1; next} f&&/^```/{exit} f' README.md > "$tmp/readme_example.py"
grep -q "sluice.Loader" "$tmp/readme_example.py"
mkdir "$tmp/run"
(cd "$tmp/run" && PATH="$bare" "$bare/python" - <<PY
import runpy, sluice
assert sluice.__file__.startswith("$tmp/venv/"), f"sluice came from {sluice.__file__}, not the wheel"
runpy.run_path("$tmp/readme_example.py", run_name="__main__")
print("wheel-test: the README example ran on the installed wheel")
PY
)
