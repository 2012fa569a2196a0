"""The memory estimate: the items `core.training.trainer` allocates, each blamed on a spec field,
and the peak they make together.

It exists apart because it is the part that mirrors the trainer and is calibrated against it
(`bench/budget_calibration.py`, against measured peak RSS); when the trainer changes what it
holds, this is the module to update. The estimate is an upper bound:

- persistent: the weights, their gradients, AdamW's two moments (fp32), the rollout copy of the
  policy when it differs (a lower-precision `rollout.dtype`, or `staleness > 0`), the
  `staleness + 1` stale-policy snapshots, and the KL penalty's reference policy (a frozen copy
  in the training dtype when `algorithm.kl_beta > 0`; none with LoRA, whose reference is the
  base with its adapters disabled);
- the phases that follow one another: the rollout (KV cache of the whole batch, sampling
  buffers, the per-token behavior record, the `exact` estimator's full log-probs), the update
  (activations of one micro-batch, a minibatch split in `optim.grad_accumulation` pieces, each
  distinct prompt counted once where the model shares prompts across rows; the loss's
  [tokens x vocabulary] logits and their gradients, or the fused loss's chunks of them where
  the trainer fuses it, by its own rule, `core.config.fused`; FSDP's gathered units; the
  rollout batch still held; with the KL penalty, the reference's no-grad forward pass over a
  micro-batch and its log-probs of the whole batch), the format warm-up, and saving (a
  serialized copy of the weights, gathered whole first when sharded). Only the largest counts:
  on CUDA the caching allocator reuses what a phase freed, and on CPU a phase's large tensors
  are mmapped and go back to the OS when freed;
- a fixed overhead for what no tensor shows (the first step's kernels and allocator arenas on
  CPU; the CUDA context).

Measured on CPU (`bench/budget_calibration.py`: built-in models from 47K to 26M parameters,
Hugging Face Llama and Qwen2 models of 19M, fused and unfused, LoRA, FSDP on two processes; 272
to 59K tokens per step) the estimate is 1.1-1.8x the real peak; the same spec's peak varies by
up to 135 MiB from run to run (glibc's arenas), which the lowest ratios absorb. On CUDA,
`bench/gpu_check.py`'s memory rows hold it to `torch.cuda.max_memory_allocated` when a GPU
session runs them (none has yet); the activations are counted from the tensors autograd keeps
on CPU, which CUDA's attention kernels (flash, memory-efficient) should not exceed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from core.budget.shapes import ModelShape
from core.budget.tokens import builtin_answer_chars
from core.budget.units import GIB, MIB
from core.config import BUILTIN_TASKS, TrainConfig
from core.config.fused import fused_loss_runs, projects_plainly

Queue = Literal["cpu", "gpu"]
Device = Literal["cpu", "cuda"]
Phase = Literal["persistent", "rollout", "update", "warmup", "checkpoint", "overhead"]

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# What no tensor accounts for. On CPU the first step itself adds about 130 MiB of RSS over the
# imports (code pages of the kernels it runs, allocator arenas, per-thread scratch; measured by
# bench/budget_calibration.py on its smallest spec); on CUDA the context and cuBLAS workspaces
# live outside torch's allocator.
OVERHEAD_BYTES: dict[str, int] = {"cpu": 160 * MIB, "cuda": GIB}
# Chunk of the full-vocabulary passes in core.objective.estimators (CHUNK_ELEMENTS fp32 entries).
_CHUNK_BYTES = (1 << 21) * 4
# The fused loss's chunk of logits and widest vocabulary chunk (core.objective.fused:
# CHUNK_ELEMENTS, VOCAB_CHUNK; this package imports no torch, so they are restated here).
_FUSED_CHUNK_BYTES = (1 << 22) * 4
_FUSED_VOCAB_CHUNK = 4096
# The architectures whose training forward `_forward_bytes` counts from measurements (the Llama
# family; others get a looser bound).
_MEASURED_TYPES = ("llama", "qwen2", "qwen3")
# Python objects per sequence of a rollout (prompt id lists, completions from `tolist()`, the
# examples): about 40 bytes per token and a few hundred per sequence, measured on CPython 3.11.
_HOST_BYTES_PER_TOKEN = 40
_HOST_BYTES_PER_SEQUENCE = 400
# Defaults of the fields a batch-sized memory item may blame (ratio to default picks the culprit).
_BATCH_DEFAULTS = {
    "train.rollout.prompts_per_step": 16,
    "train.rollout.group_size": 8,
    "train.rollout.max_new_tokens": 8,
    "train.task.max_len": 4,
}


@dataclass(frozen=True)
class MemoryItem:
    """One component of the memory estimate; `field` is the spec field that makes it large."""

    name: str
    phase: Phase
    bytes: int
    field: str


def job_device(cfg: TrainConfig, queue: Queue) -> Device:
    """Where the job's tensors live: a GPU worker trains on CUDA unless the spec pins the CPU."""
    return "cuda" if queue == "gpu" and cfg.device != "cpu" else "cpu"


def batch_field(cfg: TrainConfig) -> tuple[str, float]:
    """The batch-shaping field furthest above its default (what makes batch-sized memory and
    token counts big), and that ratio. Ties go to the group size."""
    values = {
        "train.rollout.prompts_per_step": cfg.rollout.prompts_per_step,
        "train.rollout.group_size": cfg.rollout.group_size,
        "train.rollout.max_new_tokens": cfg.rollout.max_new_tokens,
    }
    if cfg.task.name in BUILTIN_TASKS:
        values["train.task.max_len"] = cfg.task.max_len
    ratios = {f: v / _BATCH_DEFAULTS[f] for f, v in values.items()}
    best = max(ratios, key=lambda f: (ratios[f], f == "train.rollout.group_size"))
    return best, ratios[best]


def _width_field(cfg: TrainConfig) -> str:
    """Blame for items that scale with batch *and* the model's width x depth (KV cache,
    activations): builtin:tiny's dims when they are further above their defaults (d_model 64,
    2 layers) than any batch field, else the batch field."""
    batch, ratio = batch_field(cfg)
    t = cfg.model.tiny
    if cfg.model.name == "builtin:tiny" and (t.d_model * t.n_layers) / (64 * 2) > ratio:
        return "train.model.tiny"
    return batch


def model_field(cfg: TrainConfig) -> str:
    return "train.model.tiny" if cfg.model.name == "builtin:tiny" else "train.model.name"


def _forward_bytes(
    shape: ModelShape,
    rows: int,
    seq: int,
    width: int,
    *,
    grad: bool,
    prompt: int = 0,
    distinct: int | None = None,
    lora: bool = False,
) -> int:
    """Activations of a forward pass over rows x seq tokens, `width` bytes per element.

    With a gradient, every block keeps what its backward needs, per token (measured by
    `torch.autograd.graph.saved_tensors_hooks`, parameters aside, on the trainer's own training
    forward): for builtin:tiny about 20*d values (LayerNorm inputs and outputs, qkv, the
    attention output and its copy, the residuals, both MLP activations of 4*d; measured 76-82
    bytes per token, layer and unit of d in fp32); for the Llama family (`_MEASURED_TYPES`)
    11*h + 4*i (the norms' inputs and outputs, q and the keys and values repeated to the query
    heads, the attention output and its copy, the gate, up, their product and its activation)
    plus, below fp32, the RMSNorms' fp32 upcasts (8*h bytes) and, with LoRA, peft's fp32 copy
    of each adapted layer's input (4*(4*h + i) bytes): measured 22.1 KB per token and layer in
    fp32 and 12.0 KB in bf16 where these give 22.5 and 13.3 (h 256, i 704), 17.7 with LoRA in
    bf16 (20.2); other architectures 20*h + 4*i and 16*h bytes of upcasts. Plus about 20*d for the
    embeddings and the gradients in flight. With `distinct` (prefix sharing,
    `CausalLM.shares_prefix`) the first `prompt` tokens of the rows run once per distinct
    prompt, and each row holds its own copy of their keys and values. Attention runs a fused
    kernel (flash on CUDA, its CPU counterpart) that keeps no seq x seq scores, but the masks
    are (B, 1, T, T): three bool ones for builtin:tiny, one in the model's dtype for
    transformers. Without a gradient only one block's temporaries are alive (the KV cache is
    counted apart)."""
    d = shape.hidden or 0
    layers = shape.layers or 0
    inter = shape.intermediate or 4 * d
    mask = rows * seq * seq * (3 if shape.tiny else width + 2)
    if not grad:
        return rows * seq * (16 * d + 2 * inter) * width + mask
    tokens = rows * seq
    shared = distinct is not None and prompt > 0
    if distinct is not None and shared:
        tokens = distinct * prompt + rows * (seq - prompt)
    upcasts = 8 * d if width < 4 else 0  # bytes per token and layer
    if shape.tiny:
        per_layer = 20 * d * width
    elif shape.model_type in _MEASURED_TYPES:
        per_layer = (11 * d + 4 * inter) * width + upcasts
        if lora and width < 4:
            per_layer += 4 * (4 * d + inter)
    else:
        per_layer = (20 * d + 4 * inter) * width + 16 * d
    kv = rows * prompt * 2 * (shape.kv_dim or d) * width * layers if shared else 0
    return tokens * (layers * per_layer + 20 * d * width) + kv + mask


def _distinct_prompts(rows: int, prompts: int, group: int, minibatches: int) -> int:
    """The most distinct prompts among the `rows` rows of one training forward, of a batch
    of `prompts` groups of `group` rows laid out one after another. A minibatch of a shuffled
    batch (minibatches > 1) may hold a row of every prompt; one minibatch of the whole batch is
    split (`optim.grad_accumulation`) in runs of consecutive rows, which touch at most
    ceil((rows - 1) / group) + 1 groups."""
    most = max(prompts, 1)
    if minibatches > 1:
        return min(rows, most)
    return min(-(-(rows - 1) // group) + 1, most)


def memory_items(
    cfg: TrainConfig, shape: ModelShape, prompt: int, device: Device, devices: int = 1
) -> list[MemoryItem]:
    assert shape.params is not None and shape.trainable is not None
    r, a, task = cfg.rollout, cfg.algorithm, cfg.task
    width = _DTYPE_BYTES[cfg.model.dtype]
    rwidth = _DTYPE_BYTES[r.dtype]
    lora = cfg.model.lora is not None
    twidth = 4 if lora else width  # peft keeps adapters in fp32
    params, trainable = shape.params, shape.trainable
    vocab = shape.vocab or 0
    layers = shape.layers or 0
    kv_dim = shape.kv_dim or 0
    k = a.top_k
    sequences = r.prompts_per_step * r.group_size // devices  # this device's share
    mb = max(sequences // a.minibatches // cfg.optim.grad_accumulation, 1)  # rows of a forward
    # sharded (core.parallel.sharding): a device keeps 1/devices of the weights, gradients and AdamW
    # state; a rollout gathers the whole model on every device
    shards = devices if cfg.sharding == "fsdp" else 1
    new = r.max_new_tokens
    seq = prompt + new
    model_f = "train.model.lora" if lora else model_field(cfg)
    batch_f, _ = batch_field(cfg)
    width_f = _width_field(cfg)
    separate = r.staleness > 0 or rwidth != width
    exact = a.estimator == "exact"
    items: list[MemoryItem] = []

    def add(name: str, phase: Phase, n: int, blame: str) -> None:
        if n > 0:
            items.append(MemoryItem(name, phase, int(n), blame))

    # persistent: alive from the first step to the end
    frozen = params - (trainable if lora else 0)
    add("weights", "persistent", frozen * width // shards, model_field(cfg))
    if lora:
        add("adapters", "persistent", trainable * twidth, model_f)
    add("gradients", "persistent", trainable * twidth // shards, model_f)
    add("optimizer", "persistent", 2 * trainable * 4 // shards, model_f)  # exp_avg, exp_avg_sq
    if shards > 1:
        gathered = params * width * (shards - 1) // shards  # the other devices' shards
        add("gathered_weights", "rollout", gathered, "resources.gpus")
    if separate:
        blame = "train.rollout.dtype" if rwidth != width else "train.rollout.staleness"
        add("rollout_copy", "persistent", params * rwidth, blame)
        snaps = min(r.staleness + 1, cfg.steps)
        add("snapshots", "persistent", snaps * trainable * twidth, "train.rollout.staleness")
    kl = a.kl_beta > 0
    if kl and not lora:  # core.training.reference: a frozen copy of the loaded weights
        add("reference", "persistent", params * width, "train.algorithm.kl_beta")

    # the rollout: generation of the whole batch, step by step with a KV cache
    # builtin:tiny concatenates each block's cache, so old and new caches coexist for a step
    kv_copies = 2 if shape.tiny else 1
    add("kv_cache", "rollout", kv_copies * 2 * layers * sequences * seq * kv_dim * rwidth, width_f)
    add(
        "prefill",
        "rollout",
        _forward_bytes(shape, sequences, prompt, rwidth, grad=False),
        width_f,
    )
    sampling = sequences * vocab * (rwidth + 4 * 4)  # logits, log mu, mu, top-k scratch (fp32)
    if r.top_p < 1.0:
        sampling += sequences * vocab * (4 * 3 + 8 + 1)  # sorted, cumsum, scatter, order, drop
    add("sampling", "rollout", sampling, batch_f)
    per_token = 8 + 1 + 4 + k * 12  # token, alive, log mu(a), top-K ids (int64) and log-probs
    add("behavior_record", "rollout", 2 * sequences * new * per_token, batch_f)  # lists + stack
    if exact:
        # one (B, V) fp32 row per step, stacked, then masked: three copies at the end
        add(
            "exact_logprobs",
            "rollout",
            3 * sequences * new * vocab * 4,
            "train.algorithm.estimator",
        )
    if device == "cpu":
        host = sequences * (seq * _HOST_BYTES_PER_TOKEN + _HOST_BYTES_PER_SEQUENCE)
        add("python_objects", "rollout", host, batch_f)

    # the update: one minibatch at a time, with the rollout batch still held
    held = sequences * (seq * 9 + new) + sequences * new * (4 + k * 12)
    add("rollout_batch", "update", 2 * held, batch_f)  # the batch and its minibatch selection
    if exact:
        add(
            "exact_logprobs", "update", 2 * sequences * new * vocab * 4, "train.algorithm.estimator"
        )
    distinct = None  # prefix sharing: the prompts among a forward's rows, each run once
    if shape.shares_prefix:
        distinct = _distinct_prompts(mb, r.prompts_per_step // devices, r.group_size, a.minibatches)
    add(
        "activations",
        "update",
        _forward_bytes(
            shape, mb, seq, width, grad=True, prompt=prompt, distinct=distinct, lora=lora
        ),
        width_f,
    )
    n_mb = mb * new  # response tokens of a minibatch (upper bound)
    rows_mb = mb * (new + 1)
    # fp32 [N, V] at the backward's peak: the log-softmax (kept by cross-entropy), its gradient
    # and the gradient through the temperature; below fp32 that gradient cast back; the
    # (B, T+1, V) logits' gradient in the model's dtype, and the chunked scratch of the
    # full-vocab passes. Measured (bench/budget_calibration.py's V32K rows, the update alone):
    # 2.7 [N, V] fp32 in all for builtin:tiny, 1.9 for a Llama
    chunks = 8 if a.estimator in ("exact", "topk_tail") else 2
    logits = 3 * n_mb * vocab * 4 + rows_mb * vocab * width
    logits += n_mb * vocab * width if width < 4 else 0
    logits += min(n_mb * vocab * 4, _CHUNK_BYTES) * chunks
    fused = runs_fused_loss(cfg, shape)
    if fused:
        logits = _fused_bytes(n_mb, vocab, shape.hidden or 0)
    add("logits", "update", logits, batch_f)
    if device == "cuda" and not lora:
        add("optimizer_step", "update", trainable * 4 // shards, model_f)  # AdamW temporaries
    if cfg.sharding == "fsdp":
        # FSDP2 gathers a unit (a block, or the root: embeddings, final norm, output layer) for
        # its forward and backward, the root for the whole pass and a block with the next one
        # prefetched; each gathered unit's weights and unsharded gradients come with a copy in
        # the collectives' buffers. Measured (gloo, 2 ranks, a Llama 85% root): 290 MiB a rank
        # over the unsharded update where this counts 272
        root = shape.root_params if shape.root_params is not None else params
        block = max(params - root, 0) // max(layers, 1)
        add("fsdp_buffers", "update", 4 * (root + 2 * block) * width, "train.sharding")
    if kl:
        # before the updates, one micro-batch at a time under no_grad: its forward pass, its
        # logits (B, T+1, V) in the model's dtype and two fp32 [N, V] (scaled, log-softmax);
        # the (B, T) fp32 log-probs of the whole batch stay for the step
        ref = _forward_bytes(shape, mb, seq, width, grad=False) + sequences * new * 4
        ref += _fused_bytes(n_mb, vocab, 0) if fused else rows_mb * vocab * width
        ref += 0 if fused else 2 * n_mb * vocab * 4
        add("reference_forward", "update", ref, "train.algorithm.kl_beta")

    # the format warm-up: its own AdamW and batches of warmup_batch_size
    if task.warmup_steps and task.name in BUILTIN_TASKS:
        wb = task.warmup_batch_size
        wnew = builtin_answer_chars(task) + 1
        wf = "train.task.warmup_batch_size"
        add("warmup_optimizer", "warmup", 2 * trainable * 4, model_f)
        add(
            "warmup_activations",
            "warmup",
            _forward_bytes(
                shape,
                wb,
                prompt + wnew,
                width,
                grad=True,
                prompt=prompt,
                distinct=wb if shape.shares_prefix else None,
                lora=lora,
            ),
            wf,
        )
        warm_logits = 4 * wb * wnew * vocab * 4
        if _fused_warmup(cfg, shape):
            warm_logits = _fused_bytes(wb * wnew, vocab, shape.hidden or 0)
        add("warmup_logits", "warmup", warm_logits, wf)

    # checkpoints and the final model: safetensors serializes into one buffer; a sharded run's
    # final model is gathered whole on rank 0 first (`core.parallel.sharding`)
    if cfg.sharding == "fsdp":
        add("gathered_state", "checkpoint", params * width, "train.sharding")
    if lora and cfg.save_merged:  # core.models.hf_final: a deep copy, adapters merged in
        add("merged_copy", "checkpoint", params * width, "train.save_merged")
    add("serialized_weights", "checkpoint", params * width, model_field(cfg))
    add("overhead", "overhead", OVERHEAD_BYTES[device], "train")
    return items


def runs_fused_loss(cfg: TrainConfig, shape: ModelShape) -> bool:
    """Whether the trainer's RL loss is fused, by the trainer's own rule
    (`core.config.fused.fused_loss_runs`): an `hf:` model whose config.json names no
    architecture counts unfused, an upper bound."""
    return fused_loss_runs(cfg, builtin=shape.tiny, model_type=shape.model_type)


def _fused_warmup(cfg: TrainConfig, shape: ModelShape) -> bool:
    """Whether the format warm-up's cross-entropy is fused (`core.training.warmup`): with
    `algorithm.fused_loss` whatever the estimator, never sharded, on a plain projection."""
    plain = projects_plainly(builtin=shape.tiny, model_type=shape.model_type, lora=cfg.model.lora)
    return cfg.algorithm.fused_loss and cfg.sharding != "fsdp" and plain


def _fused_bytes(tokens: int, vocab: int, hidden: int) -> int:
    """What the fused loss holds instead of [N, V] logits: three chunk buffers (two in the
    statistics pass, one in the backward), the hidden states' fp32 copy and gradient, and one
    vocabulary chunk of the projection and of its gradient in fp32."""
    chunk = min(tokens * (vocab + 1) * 4, _FUSED_CHUNK_BYTES)
    return 3 * chunk + 2 * tokens * hidden * 4 + 2 * min(vocab, _FUSED_VOCAB_CHUNK) * hidden * 4


def peak_of(items: list[MemoryItem]) -> tuple[int, tuple[Phase, ...]]:
    """The peak and the phases that make it: persistent + overhead + the largest phase, on
    CUDA (the caching allocator reuses what the previous phase freed) and on CPU alike (a
    phase's large tensors are mmapped and go back to the OS when freed). Measured on CPU
    (bench/budget_calibration.py, 22 specs) this is 1.1-1.8x the real peak; adding the phases
    up, as this estimate did before issue 49, gave up to 2.4x (1.0x for FSDP, which it
    undercounted)."""
    phases: dict[Phase, int] = {}
    for m in items:
        phases[m.phase] = phases.get(m.phase, 0) + m.bytes
    fixed: list[Phase] = [p for p in ("persistent", "overhead") if p in phases]
    transient = {p: b for p, b in phases.items() if p not in fixed}
    if not transient:
        return sum(phases.values()), tuple(phases)
    chosen = (*fixed, max(transient, key=lambda p: transient[p]))
    return sum(phases[p] for p in chosen), chosen
