#!/usr/bin/env bash
# Entry point of the worker-gpu container: `pdppo worker`s that split the GPUs between them, each
# seeing only its own devices (CUDA_VISIBLE_DEVICES), because a worker runs one job at a time and
# a job owns every device of its worker. Docker does not schedule GPUs between replicas (`count: 1`
# on two replicas gives both GPU 0), so the container takes all of them and splits them here.
#
#   WORKER_GPUS=0,2      use only these devices (default: every GPU torch can see)
#   GPUS_PER_WORKER=1    one worker per GPU, one-GPU jobs (the default);
#   GPUS_PER_WORKER=4    one worker per 4 GPUs, which takes jobs of up to 4 (resources.gpus);
#                        set PDPPO_MAX_JOB_DEVICES to the same on the API
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
        # Exiting would only make the restart policy start us again, forever: stay up, idle,
        # with no worker, so no gpu job is taken here and the healthcheck says why.
        echo "gpu-workers: no GPU visible (is the NVIDIA driver and Container Toolkit installed," \
            "and does the service reserve GPUs?); no worker started, no gpu job will run here." \
            "Idle until stopped." >&2
        sleeper=""
        trap 'kill ${sleeper} 2>/dev/null; exit 0' TERM INT
        while true; do
            sleep 3600 &
            sleeper=$!
            wait "${sleeper}" || true
        done
    fi
    mapfile -t gpus < <(seq 0 $((count - 1)))
fi

per="${GPUS_PER_WORKER:-1}"
if ! [[ "${per}" =~ ^[1-9][0-9]*$ ]] || (( ${#gpus[@]} % per )); then
    echo "gpu-workers: ${#gpus[@]} GPUs (${gpus[*]}) do not split into workers of GPUS_PER_WORKER=${per}" >&2
    exit 1
fi

pids=()
stop() {
    trap - TERM INT
    kill -TERM "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    exit "${1:-0}"
}
trap 'stop 0' TERM INT

# The workers share the container's cores: each job's torch threads are its share (core/process/threads.py).
export PDPPO_WORKER_JOBS_AT_ONCE="${PDPPO_WORKER_JOBS_AT_ONCE:-$(( ${#gpus[@]} / per ))}"

for ((first = 0; first < ${#gpus[@]}; first += per)); do
    group=$(IFS=,; echo "${gpus[*]:first:per}")
    CUDA_VISIBLE_DEVICES="${group}" pdppo worker --queues gpu --devices "${per}" --name "pdppo-gpu${group//,/-}@$(hostname)" &
    pids+=("$!")
    echo "gpu-workers: worker on GPUs ${group} (pid $!)"
done

# `wait -n` returns when any worker exits, or at once when a trapped signal arrives.
status=0
wait -n "${pids[@]}" || status=$?
echo "gpu-workers: a worker exited (status ${status}); stopping the others" >&2
stop $((status == 0 ? 1 : status))
