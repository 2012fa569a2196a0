"""core.budget: parameter counts that match the real models, hand-computed token counts, memory
items that follow the config, and problems that name the field, the estimate and the limit."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from core.budget import (
    GIB,
    MIB,
    OVERHEAD_BYTES,
    Limits,
    check,
    estimate,
    format_bytes,
    format_count,
    read_safetensors_header,
    render,
    tiny_param_count,
)
from core.config import TinyModelConfig, TrainConfig
from core.models.hf import make_tiny_hf
from core.models.tiny import ByteTokenizer, TinyTransformer
from core.tasks import make_task
from pdppo.settings import Settings

REPO = Path(__file__).resolve().parents[2]
CPU = Limits("cpu", 12 * GIB, 1_000_000_000, 16_000_000, 50_000_000_000)
SMOKE: dict[str, Any] = {
    "model": {"tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2, "max_seq_len": 32}},
    "task": {"name": "reverse", "min_len": 2, "max_len": 3},
    "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
    "algorithm": {"top_k": 8},
    "steps": 8,
}


def cfg(**overrides: Any) -> TrainConfig:
    data: dict[str, Any] = json.loads(json.dumps(SMOKE))
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    return TrainConfig.model_validate(data)


def item(budget: Any, name: str) -> int:
    return int(sum(m.bytes for m in budget.memory if m.name == name))


# -- parameters ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("d", "layers", "heads", "seq"),
    [(8, 1, 1, 8), (32, 1, 2, 32), (64, 2, 4, 128), (96, 3, 6, 40), (256, 4, 8, 512)],
)
def test_tiny_param_count_is_the_built_models(d: int, layers: int, heads: int, seq: int) -> None:
    shape = TinyModelConfig(d_model=d, n_layers=layers, n_heads=heads, max_seq_len=seq)
    real = sum(p.numel() for p in TinyTransformer(shape).parameters())
    assert tiny_param_count(d, layers, seq) == real


def test_known_tiny_param_counts() -> None:
    # 2*512*32 + 32*32 + (12*32^2 + 13*32) + 2*32
    assert estimate(cfg()).params == 46_560
    assert estimate(TrainConfig()).params == 173_824  # the defaults: d=64, 2 layers, 128 positions
    big = {"tiny": {"d_model": 4096, "n_layers": 64, "n_heads": 64, "max_seq_len": 8192}}
    assert estimate(TrainConfig.model_validate({"model": big})).params == 12_926_066_688


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_hf(tmp_path_factory.mktemp("tiny-llama"))


def hf_cfg(path: Path, lora: dict[str, Any] | None = None) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": {"name": f"hf:{path}", "lora": lora},
            "task": {"name": "reverse", "min_len": 2, "max_len": 4},
            "rollout": {"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 4},
        }
    )


def test_hf_params_from_safetensors_headers_and_from_config_json(
    hf_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    real = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(str(hf_dir)).parameters())
    headers = read_safetensors_header(hf_dir / "model.safetensors")
    assert headers["model.embed_tokens.weight"] == [604, 32]  # 4 specials, 95 chars, 505 fillers
    from_headers = estimate(hf_cfg(hf_dir))
    assert from_headers.params == from_headers.trainable_params == real
    assert "safetensors headers" in from_headers.model_source
    assert from_headers.vocab_size == 604

    no_weights = tmp_path / "config-only"
    shutil.copytree(hf_dir, no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    from_config = estimate(hf_cfg(no_weights))
    assert from_config.params == real
    assert from_config.model_source.endswith("config.json")


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]])
def test_lora_trains_only_the_adapters_peft_adds(hf_dir: Path, targets: Any) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(hf_dir)),
        LoraConfig(r=4, lora_alpha=8, target_modules=targets, task_type="CAUSAL_LM"),
    )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    budget = estimate(hf_cfg(hf_dir, {"r": 4, "alpha": 8, "target_modules": targets}))
    assert (budget.trainable_params, budget.params) == (trainable, total)
    # frozen base in the model's dtype; adapters, their gradients and AdamW state in fp32
    assert item(budget, "optimizer") == 8 * trainable
    assert item(budget, "weights") == 4 * (total - trainable)


def test_unknown_hub_model_has_no_memory_estimate_but_tokens_still_count() -> None:
    budget = estimate(hf_cfg(Path("no-such-org/no-such-model-4f1c")), queue="gpu")
    assert budget.params is None and budget.peak_memory_bytes is None and not budget.memory
    assert any("no memory estimate" in note for note in budget.notes)
    assert budget.tokens_per_step == 16 * (len("reverse 1234=") + 4 + 4)  # +4: HF specials bound
    assert check(budget, Limits("gpu", 1, 1, 10**9, 10**12)) == []


def test_hf_files_outside_the_data_roots_are_not_read(hf_dir: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "root"
    elsewhere.mkdir()
    budget = estimate(hf_cfg(hf_dir), data_roots=[str(elsewhere)])
    assert budget.params is None
    link = elsewhere / "model"
    link.symlink_to(hf_dir)  # a symlink out of the root is no way in either
    assert estimate(hf_cfg(link), data_roots=[str(elsewhere)]).params is None
    assert estimate(hf_cfg(link), data_roots=[str(elsewhere), str(hf_dir)]).params is not None


# -- tokens -------------------------------------------------------------------------------------


def test_tokens_per_step_by_hand() -> None:
    budget = estimate(cfg())
    # "reverse " + 3 digits + "=" is 12 bytes, + BOS = 13 tokens; + 4 new tokens = 17
    assert (budget.prompt_tokens, budget.sequence_tokens) == (13, 17)
    assert budget.sequences_per_step == 16
    assert budget.tokens_per_step == 16 * 17 == 272
    assert budget.total_tokens == 272 * 8 == 2176
    arithmetic = estimate(cfg(task={"name": "arithmetic", "min_len": 1, "max_len": 5}))
    assert arithmetic.prompt_tokens == len("12345+67890=") + 1 == 13


@pytest.mark.parametrize("name", ["copy", "sort", "reverse", "arithmetic"])
def test_prompt_bound_is_the_longest_prompt_the_task_makes(name: str) -> None:
    config = cfg(task={"name": name, "min_len": 1, "max_len": 6})
    tok = ByteTokenizer()
    task = make_task(config.task)
    rng = random.Random(0)
    longest = max(len(tok.encode_prompt(task.sample(rng).prompt)) for _ in range(3000))
    assert estimate(config).prompt_tokens == longest


def test_jsonl_prompts_from_the_file_or_the_model_length(tmp_path: Path) -> None:
    data = tmp_path / "qa.jsonl"
    data.write_text(
        json.dumps({"prompt": "short", "answer": "1"})
        + "\n"
        + json.dumps({"prompt": "é" * 10, "answer": "2"})  # 20 UTF-8 bytes
        + "\n"
    )
    config = cfg(task={"name": "jsonl", "path": str(data), "min_len": 2, "max_len": 3})
    assert estimate(config).prompt_tokens == 21  # bytes + BOS
    assert not estimate(config).notes
    blind = estimate(config, read_files=False)
    assert blind.prompt_tokens == 32 - 4  # max_seq_len less the response
    assert "not readable here" in blind.notes[0]


# -- memory -------------------------------------------------------------------------------------


def test_persistent_memory_follows_params_dtype_and_staleness() -> None:
    p = 46_560
    plain = estimate(cfg())
    assert item(plain, "weights") == 4 * p and item(plain, "gradients") == 4 * p
    assert item(plain, "optimizer") == 8 * p
    assert item(plain, "rollout_copy") == item(plain, "snapshots") == 0
    stale = estimate(cfg(rollout={"staleness": 3}))
    assert item(stale, "rollout_copy") == 4 * p  # the sampler's own copy of the policy
    assert item(stale, "snapshots") == 4 * 4 * p  # staleness + 1 fp32 snapshots
    assert stale.peak_memory_bytes == plain.peak_memory_bytes + 20 * p  # type: ignore[operator]
    low = estimate(cfg(rollout={"dtype": "bfloat16"}))
    assert item(low, "rollout_copy") == 2 * p and item(low, "snapshots") == 4 * p
    assert item(low, "kv_cache") * 2 == item(plain, "kv_cache")  # sampled in bf16
    # on CPU as on CUDA, the largest phase on top of what stays (bench/budget_calibration.py)
    phases = plain.phase_bytes()
    largest = max(v for k, v in phases.items() if k not in ("persistent", "overhead"))
    assert plain.peak_memory_bytes == phases["persistent"] + largest + OVERHEAD_BYTES["cpu"]
    assert plain.peak_memory_bytes < sum(m.bytes for m in plain.memory)


def test_each_device_holds_its_share_of_the_batch_and_with_fsdp_of_the_model() -> None:
    p = 46_560
    one = estimate(cfg(rollout={"group_size": 8}))
    two = estimate(cfg(rollout={"group_size": 8}), devices=2)
    assert item(two, "kv_cache") * 2 == item(one, "kv_cache")  # half the rows per device
    assert item(two, "activations") * 2 == item(one, "activations")
    assert item(two, "weights") == item(one, "weights") == 4 * p  # replicas
    assert two.tokens_per_step == one.tokens_per_step  # the job's, not a device's
    sharded = estimate(cfg(rollout={"group_size": 8}, sharding="fsdp"), devices=2)
    assert item(sharded, "weights") == item(sharded, "gradients") == 2 * p
    assert item(sharded, "optimizer") == 4 * p
    assert item(sharded, "gathered_weights") == 2 * p  # the other half, for the rollout
    assert item(estimate(cfg(sharding="fsdp")), "gathered_weights") == 0  # one device


def test_batch_memory_scales_and_minibatches_split_the_update() -> None:
    small = estimate(cfg())
    double = estimate(cfg(rollout={"group_size": 8}))
    assert item(double, "kv_cache") == 2 * item(small, "kv_cache")
    # twice the rows, each with its 4 new tokens, its copy of the prompt's keys and values and
    # its masks; the 4 prompts' 13 positions still run once each (prefix sharing)
    rows = 32 - 16
    extra = rows * 4 * (20 * 32 * 4) * 2 + rows * 13 * 2 * 32 * 4 + rows * 17 * 17 * 3
    assert item(double, "activations") == item(small, "activations") + extra
    split = estimate(cfg(rollout={"group_size": 8}, algorithm={"top_k": 8, "minibatches": 2}))
    assert item(split, "activations") == item(small, "activations")
    assert item(split, "kv_cache") == item(double, "kv_cache")  # the rollout is still whole


def test_exact_estimator_keeps_full_logprobs() -> None:
    exact = estimate(cfg(algorithm={"top_k": 8, "estimator": "exact"}))
    n_times_v = 16 * 4 * 512
    assert item(exact, "exact_logprobs") == (3 + 2) * n_times_v * 4
    assert item(estimate(cfg()), "exact_logprobs") == 0


def test_the_gpu_checks_0_8b_llama_fits_the_default_gpu_limit(tmp_path: Path) -> None:
    """bench/gpu_check.py's Llama (hidden 1536, 16 layers, vocabulary 128,256, bf16) trains with
    the fused loss, which never holds the [tokens, vocabulary] logits. Counted unfused, they
    were 47 GiB of a 106 GiB estimate, and the default GPU limit (70 GiB) refused a job that an
    80 GB GPU runs."""
    from bench.gpu_check import GPU, estimated_spec

    spec = TrainConfig.model_validate(estimated_spec(tmp_path, GPU, cuda=True))
    budget = estimate(spec, queue="gpu")
    assert budget.params == 796_706_304 and budget.fused_loss
    # 16 prompts x 8, 128 new tokens each: 16,384 response tokens of the minibatch; the fused
    # loss holds 3 chunks of 2^22 fp32 logits, the hidden states' fp32 copy and gradient
    # (16,384 x 1536) and one 4096-row chunk of the projection and of its gradient
    n, h = 16 * 8 * 128, 1536
    assert item(budget, "logits") == 3 * 16 * MIB + 2 * n * h * 4 + 2 * 4096 * h * 4
    limit = Settings(_env_file=None).budget_limits("gpu")  # type: ignore[call-arg]
    assert limit.max_memory_bytes == 70 * GIB
    assert check(budget, limit) == []
    assert budget.peak_memory_bytes is not None and budget.peak_memory_bytes < 70 * GIB


def test_gpu_peak_is_the_largest_phase_plus_persistent() -> None:
    budget = estimate(cfg(device="auto"), queue="gpu")
    assert budget.device == "cuda"
    phases = budget.phase_bytes()
    largest = max(v for k, v in phases.items() if k not in ("persistent", "overhead"))
    assert budget.peak_memory_bytes == phases["persistent"] + largest + OVERHEAD_BYTES["cuda"]
    assert estimate(cfg(device="cpu"), queue="gpu").device == "cpu"


# -- problems -----------------------------------------------------------------------------------


def test_poison_specs_are_over_budget_naming_the_field() -> None:
    thirteen_b = TrainConfig.model_validate(
        {"model": {"tiny": {"d_model": 4096, "n_layers": 64, "n_heads": 64, "max_seq_len": 8192}}}
    )
    problems = {p.kind: p for p in check(estimate(thirteen_b), CPU)}
    assert set(problems) == {"memory", "params"}
    memory = problems["memory"]
    assert memory.field == "train.model.tiny" and memory.limit == 12 * GIB
    # weights, gradients and AdamW alone are 16 B/param, then the largest phase
    budget = estimate(thirteen_b)
    phases = budget.phase_bytes()
    assert phases["persistent"] == 16 * 12_926_066_688
    largest = max(v for k, v in phases.items() if k not in ("persistent", "overhead"))
    assert memory.estimate == phases["persistent"] + largest + OVERHEAD_BYTES["cpu"]
    assert str(memory) == (
        f"train.model.tiny: the job would need about {format_bytes(memory.estimate)} of memory "
        "(limit 12 GiB on cpu workers)"
    )
    assert str(problems["params"]) == (
        "train.model.tiny: the model has about 12.9B parameters (limit 1B on cpu workers)"
    )

    wide = TrainConfig.model_validate(
        {"steps": 2, "rollout": {"prompts_per_step": 32, "group_size": 4096}}
    )
    [problem] = check(estimate(wide), CPU)
    assert (problem.field, problem.kind) == ("train.rollout.group_size", "memory")
    assert problem.estimate > 12 * GIB

    huge = TrainConfig.model_validate({"rollout": {"prompts_per_step": 65536, "group_size": 4096}})
    by_kind = {p.kind: p for p in check(estimate(huge), CPU)}
    assert set(by_kind) == {"memory", "tokens_per_step", "total_tokens"}
    tokens = by_kind["tokens_per_step"]
    assert tokens.estimate == 65536 * 4096 * (len("reverse 1234=") + 1 + 8)
    assert tokens.field == "train.rollout.prompts_per_step"  # 4096x its default, group 512x
    assert str(tokens) == (
        "train.rollout.prompts_per_step: a step would process about 5.9B tokens "
        "(limit 16M per step)"
    )


def test_a_long_run_blames_the_steps() -> None:
    config = TrainConfig.model_validate({"steps": 10_000_000, "rollout": {"prompts_per_step": 64}})
    [problem] = check(estimate(config), CPU)
    assert problem.kind == "total_tokens" and problem.field == "train.steps"
    assert problem.estimate == 64 * 8 * 22 * 10_000_000
    assert (
        str(problem) == "train.steps: the run would process about 113B tokens (limit 50B per job)"
    )


def test_limits_of_none_or_zero_check_nothing() -> None:
    budget = estimate(TrainConfig(steps=10_000_000))
    assert check(budget, Limits("cpu")) == []
    settings = Settings(_env_file=None, max_total_tokens=0, max_job_memory_gb_cpu=0)  # type: ignore[call-arg]
    limits = settings.budget_limits("cpu")
    assert limits.max_total_tokens is None and limits.max_memory_bytes is None
    assert check(budget, limits) == []


def test_settings_limits_per_queue_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PDPPO_MAX_JOB_MEMORY_GB_CPU", "0.5")
    monkeypatch.setenv("PDPPO_MAX_PARAMS_GPU", "7000000000")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.budget_limits("cpu").max_memory_bytes == GIB // 2
    assert settings.budget_limits("gpu").max_params == 7_000_000_000
    assert settings.budget_limits("gpu").max_memory_bytes == 70 * GIB
    assert settings.budget_limits("cpu").max_params == 1_000_000_000
    for name in (
        "max_job_memory_gb_cpu",
        "max_job_memory_gb_gpu",
        "max_params_cpu",
        "max_params_gpu",
        "max_tokens_per_step",
        "max_total_tokens",
    ):
        assert Settings.model_fields[name].description


def test_default_limits_take_the_examples() -> None:
    from pdppo.spec import load_spec

    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    for name in ("smoke", "demo", "quickstart"):
        spec = load_spec(REPO / "examples" / f"{name}.yaml")
        budget = estimate(spec.train, queue=spec.resources.device)
        assert check(budget, settings.budget_limits(spec.resources.device)) == [], name
        assert budget.peak_memory_bytes is not None and budget.peak_memory_bytes < 512 * MIB


def test_formatting() -> None:
    assert format_bytes(37.2 * GIB) == "37.2 GiB"
    assert format_bytes(12 * GIB) == "12 GiB"
    assert format_bytes(0.001 * GIB) == "1 MiB"
    assert format_bytes(640 * 1024) == "640 KiB"
    assert format_count(12_926_066_688) == "12.9B"
    assert format_count(46_560) == "46.6K"
    assert format_count(512) == "512"
    lines = list(render(estimate(cfg()).to_dict()))
    assert lines[1] == "parameters       46.6K (46,560)"
    assert lines[3].startswith("tokens/step      272 (272) = 16 sequences x 17 tokens")
    assert lines[-1] == "loss             fused (the [tokens x vocabulary] logits are never held)"
    unfused = estimate(cfg(algorithm={"top_k": 8, "fused_loss": False})).to_dict()
    assert list(render(unfused))[-1] == (
        "loss             unfused (the [tokens x vocabulary] logits are held)"
    )


def test_estimate_bounds_the_measured_peak_of_a_real_step() -> None:
    """bench/budget_calibration.py's child on the default config: an upper bound, within 3x."""
    config = {"steps": 1, "checkpoint_every": 0, "device": "cpu"}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "budget_calibration.py"),
            "--child",
            json.dumps(config),
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    measured = got["peak"] - got["base"]
    predicted = estimate(TrainConfig.model_validate(config)).peak_memory_bytes
    assert predicted is not None
    assert measured <= predicted <= 3 * measured, (predicted, measured)
    assert torch is not None
