#!/usr/bin/env bash
# Wheels of what a lent GPU machine's image lacks for `python benchmarks/gpu.py`, downloaded here
# into .whl/ (ignored by git; sent with `carry: [".whl"]`). The image (Python 3.12, torch,
# transformers, accelerate, peft, numpy, pillow, matplotlib, rich, pyyaml, regex, sympy) has the
# rest; mmrft itself travels as the working tree and is installed there in editable mode.
#
#   scripts/gpu_wheelhouse.sh          # then, on the GPU machine (the device tool's run):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
#     && export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . \
#     && python3 benchmarks/gpu.py
#
# Checks that the working tree plus the wheels fit the 64 MiB that travels with a call.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
  "qwen-vl-utils==0.0.14"          # Qwen's vision preprocessing helpers
  "math-verify==0.8.0"             # accuracy mode=math
  "latex2sympy2_extended==1.10.2"  # math-verify's parser
  "antlr4-python3-runtime==4.13.2" # latex2sympy2's runtime
  "decord==0.6.0"                  # video decoding (FFmpeg bundled)
)
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux2010_x86_64 manylinux1_x86_64)
rm -rf .whl && mkdir -p .whl
args=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl)
for p in "${PLATFORMS[@]}"; do args+=(--platform "$p"); done
python3 -m pip download -q "${args[@]}" "${WHEELS[@]}"
wheels=$(du -cb .whl/*.whl | tail -1 | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
total=$((wheels + tree))
printf 'wheels %.1f MiB + working tree %.1f MiB = %.1f MiB (limit 64 MiB)\n' \
  "$(echo "$wheels / 1048576" | bc -l)" "$(echo "$tree / 1048576" | bc -l)" "$(echo "$total / 1048576" | bc -l)"
if [ "$total" -gt $((64 * 1048576)) ]; then echo "too large to carry" >&2; exit 1; fi
