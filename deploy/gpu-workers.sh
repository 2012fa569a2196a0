#!/usr/bin/env bash
# Entry point of the worker-gpu container: one `pdppo worker` per GPU, each seeing only its own
# device (CUDA_VISIBLE_DEVICES), because a worker runs one job at a time and a job owns its GPU.
# Docker does not schedule GPUs between replicas (`count: 1` on two replicas gives both GPU 0),
# so the container takes all of them and splits them here.
#
#   WORKER_GPUS=0,2   use only these devices (default: every GPU torch can see)
#
# SIGTERM/SIGINT (docker stop) reach every worker, which finishes its step and checkpoints. If one
# worker dies, the others are stopped too and the container exits non-zero, so that compose's
# restart policy brings the whole set back (their jobs resume from their checkpoints).
set -euo pipefail

if [[ -n "${WORKER_GPUS:-}" ]]; then
    IFS=, read -r -a gpus <<< "${WORKER_GPUS}"
else
    count=$(python -c "import torch; print(torch.cuda.device_count())")
    if [[ "${count}" -lt 1 ]]; then
        echo "gpu-workers: no GPU visible (is the NVIDIA Container Toolkit installed?)" >&2
        exit 1
    fi
    mapfile -t gpus < <(seq 0 $((count - 1)))
fi

pids=()
stop() {
    trap - TERM INT
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    exit "${1:-0}"
}
trap 'stop 0' TERM INT

for gpu in "${gpus[@]}"; do
    CUDA_VISIBLE_DEVICES="${gpu}" pdppo worker --queues gpu --name "pdppo-gpu${gpu}@$(hostname)" &
    pids+=("$!")
    echo "gpu-workers: worker on GPU ${gpu} (pid $!)"
done

# `wait -n` returns when any worker exits, or at once when a trapped signal arrives.
status=0
wait -n "${pids[@]}" || status=$?
echo "gpu-workers: a worker exited (status ${status}); stopping the others" >&2
stop $((status == 0 ? 1 : status))
