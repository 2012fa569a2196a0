#!/usr/bin/env bash
# Builds the GPU worker image (deploy/Dockerfile.gpu) and checks it as far as a machine without
# a GPU can: it imports torch (a CUDA build), vLLM, the trackers and pdppo, and a container
# started from it with no GPU says so and starts no worker instead of crashing. No GPU is needed
# to build it.
#
#   deploy/build-gpu-image.sh [TAG] [more docker build arguments...]
#   BASE_IMAGE=pdppo-ci-base:bookworm deploy/build-gpu-image.sh pdppo-gpu:ci   # CI's base
#
# Prints the build time and the image size. DOCKER names the docker CLI (default: docker).
set -euo pipefail
cd "$(dirname "$0")/.."
docker_cli="${DOCKER:-docker}"
tag="${1:-pdppo-gpu:latest}"
shift || true
args=()
if [[ -n "${BASE_IMAGE:-}" ]]; then
    args+=(--build-arg "BASE_IMAGE=${BASE_IMAGE}")
fi

started=$SECONDS
DOCKER_BUILDKIT=1 "${docker_cli}" build -f deploy/Dockerfile.gpu -t "${tag}" "${args[@]}" "$@" .
size=$("${docker_cli}" image inspect -f '{{.Size}}' "${tag}" | numfmt --to=si)
echo "${tag}: built in $((SECONDS - started))s, ${size}B"

"${docker_cli}" run --rm "${tag}" python -c "
import importlib.util, torch, core, workers
import mlflow, tensorboard, wandb  # the trackers extra, as in the CPU image
vllm = importlib.util.find_spec('vllm')
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'vllm', 'present' if vllm else 'absent')
assert torch.version.cuda, 'torch is not a CUDA build'"

container=$("${docker_cli}" run -d "${tag}")
trap '"${docker_cli}" rm -f "${container}" >/dev/null' EXIT
sleep 10
state=$("${docker_cli}" inspect -f '{{.State.Status}}' "${container}")
logs=$("${docker_cli}" logs "${container}" 2>&1)
if [[ "${state}" != running || "${logs}" != *"no GPU visible"* ]]; then
    echo "without a GPU the container should idle and say so; it is ${state}: ${logs}" >&2
    exit 1
fi
"${docker_cli}" stop -t 10 "${container}" >/dev/null
code=$("${docker_cli}" inspect -f '{{.State.ExitCode}}' "${container}")
echo "without a GPU: idles, says \"${logs}\", stops with exit code ${code}"
[[ "${code}" == 0 ]]
