"""Multi-turn episodes with tools (issue 54, item 2): token in, token out, the loss mask, and the
limits that keep a faulty environment from taking the job down.

Every test runs a real Hugging Face Llama (`make_chat_hf` with the tool tags as added tokens) and
the real driver (`core.rollout.episodes`); the trainer tests run `core.training.trainer.train`.
The `tool_model` fixture teaches a small model, by a few hundred supervised steps on one scripted
episode, to call the calculator and answer with its result, so that its sampled episodes use the
tool; it writes the tags character by character, which is what a model that has never been
trained on the added tag tokens does, and what a re-encoding of its text does not give back.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

import core.rollout.episodes as episodes_module
import core.training.run as run_module
from core.config import ModelConfig, TrainConfig
from core.environments import (
    Done,
    Environment,
    Episode,
    EpisodeLimits,
    Observation,
    Turn,
    make_environment,
    register_environment,
)
from core.environments.calculator import evaluate, final_answer
from core.environments.task import EnvironmentTask
from core.environments.tools import format_tool_call, parse_tool_calls
from core.models.base import encode_example
from core.models.hf import HFLM
from core.models.local_hf import TOOL_TOKENS, LlamaShape, make_chat_hf
from core.objective.loss import policy_loss
from core.objective.masks import TrustRegion
from core.rollout import RolloutBatch, response_logits
from core.rollout.episodes import (
    ChatDelta,
    EpisodeBatch,
    SamplingOptions,
    format_episode,
    run_episodes,
)
from core.tasks import Example, make_task
from core.training.trainer import train
from tests.support.trainer_runs import read_metrics

ROOT = Path(__file__).resolve().parents[2]
SHAPE = LlamaShape(hidden=64, heads=1, kv_heads=1, layers=2, intermediate=128, max_positions=512)
CALC_ARGS = {"min_value": 7, "max_value": 7, "ops": "*", "system_prompt": "calc"}
"""One question, 7*7: the scripted episode the fixture teaches."""
LIMITS = EpisodeLimits(max_turns=3, max_tokens=200, step_timeout=10.0)
SAMPLING = SamplingOptions(max_new_tokens=80, temperature=1.0, top_k=20)
SFT_STEPS = 400  # loss 0.0015 after them on one thread, 8 s on a loaded 2-core machine


@dataclass
class ToolModel:
    lm: HFLM
    environment: Environment
    example: Example
    folder: Path


def _chars(lm: HFLM, text: str) -> list[int]:
    """`text` one character per id, as a model that never uses the added tag tokens writes it."""
    hf = lm.tokenizer.tok  # type: ignore[attr-defined]
    return [int(hf.convert_tokens_to_ids(c)) for c in text]


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ToolModel]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = make_chat_hf(tmp_path_factory.mktemp("tools") / "model", shape=SHAPE, tool_tokens=True)
    torch.manual_seed(0)
    lm = HFLM(ModelConfig(name=f"hf:{folder}"))
    tok = lm.tokenizer
    env = make_environment("calculator", CALC_ARGS)
    example = env.sample(random.Random(0))
    prompt = encode_example(tok, example)
    turn1 = [*_chars(lm, format_tool_call("calculator", {"expression": "7*7"})), tok.eos_id]
    tool = ChatDelta(tok).ids([{"role": "tool", "content": "49"}])
    turn2 = [*_chars(lm, "<answer>49</answer>"), tok.eos_id]
    seq = torch.tensor([prompt + turn1 + tool + turn2])
    learn = [0] * len(prompt) + [1] * len(turn1) + [0] * len(tool) + [1] * len(turn2)
    target = torch.tensor([learn[1:]], dtype=torch.bool)
    opt = torch.optim.Adam(lm.module.parameters(), lr=3e-3)
    positions = torch.arange(seq.shape[1] - 1)[None]
    for _ in range(SFT_STEPS):
        logits, _ = lm.forward(
            seq[:, :-1], torch.ones_like(seq[:, :-1]), positions, use_cache=False
        )
        logp = torch.log_softmax(logits.float(), -1).gather(-1, seq[:, 1:, None])[..., 0]
        loss = -logp[target].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.01
    lm.module.eval()
    yield ToolModel(lm, env, example, folder)
    torch.set_num_threads(threads)


def _play(tool_model: ToolModel, n: int = 8, seed: int = 0) -> EpisodeBatch:
    return run_episodes(
        tool_model.lm,
        tool_model.environment,
        [tool_model.example] * n,
        limits=LIMITS,
        sampling=SAMPLING,
        generator=torch.Generator().manual_seed(seed),
    )


# -- (a) a re-encoding is not what was sampled ------------------------------------------------


def test_reencoding_a_tool_episode_gives_other_ids_than_sampled(tool_model: ToolModel) -> None:
    """The trainer avoids this: decode a tool-using episode and encode it again, turn by turn or
    re-rendered whole through the chat template, and `<tool_call>`, sampled as 11 characters,
    comes back as one added token (Qwen's tokenizer has the same two tags as single ids)."""
    played = _play(tool_model)
    tok = tool_model.lm.tokenizer
    tool_ids = ChatDelta(tok).ids([{"role": "tool", "content": "49"}])
    used = [
        r for r in played.episodes if r.reward == 1.0 and r.segments[1:2] == [(tool_ids, False)]
    ]
    assert used, [r.info for r in played.episodes]  # the taught model calls the tool
    record = used[0]
    hf = tok.tok  # type: ignore[attr-defined]
    open_id, close_id = (int(hf.convert_tokens_to_ids(t)) for t in TOOL_TOKENS)
    call = record.sampled_turns[0]
    text = tok.decode(call)
    assert text.startswith("<tool_call>") and text.endswith("</tool_call>")
    assert open_id not in call and close_id not in call  # sampled character by character
    again = tok.encode(text)
    assert again[0] == open_id and again[-1] == close_id
    assert len(call) - 1 - len(again) == len("<tool_call>") - 1 + len("</tool_call>") - 1
    # the whole episode re-rendered from its messages, as a trainer that keeps text would
    messages = [
        *(tool_model.example.messages or ()),
        {"role": "assistant", "content": text},
        {"role": "tool", "content": "49"},
        {"role": "assistant", "content": tok.decode(record.sampled_turns[1][:-1])},
    ]
    rendered = tok.encode(hf.apply_chat_template(messages, tokenize=False))
    trained = record.prompt + record.ids
    assert rendered != trained
    assert len(trained) - len(rendered) == 21  # the two tags' 23 characters vs 2 ids
    # what the trainer trains on: the sampled ids, in the batch row as they were sampled
    row = played.episodes.index(record)
    real = played.batch.attention_mask[row]
    assert played.batch.input_ids[row][real].tolist() == trained


# -- (b) trained ids are the sampled ids; the loss mask is on them alone --------------------


def test_trained_ids_are_the_sampled_ids_and_the_mask_is_on_them_alone(
    tool_model: ToolModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    sampled: list[tuple[list[int], list[int], list[float]]] = []
    real_generate = episodes_module.generate

    def spy(lm: Any, prompts: list[list[int]], **kw: Any) -> RolloutBatch:
        batch = real_generate(lm, prompts, **kw)
        counts = batch.response_mask.sum(1).tolist()
        lps = batch.behavior.token_logprobs.split(counts)
        for ctx, row, alive, lp in zip(
            prompts, batch.responses.tolist(), batch.response_mask.tolist(), lps, strict=True
        ):
            ids = [t for t, keep in zip(row, alive, strict=True) if keep]
            sampled.append((list(ctx), ids, lp.tolist()))
        return batch

    monkeypatch.setattr(episodes_module, "generate", spy)
    played = _play(tool_model, seed=1)
    batch = played.batch
    assert sum(r.turns for r in played.episodes) == len(sampled)
    unmatched = list(sampled)
    tok = tool_model.lm.tokenizer
    tool_ids = ChatDelta(tok).ids([{"role": "tool", "content": "49"}])
    turns_seen = 0
    trained_tokens: list[int] = []
    trained_lps: list[float] = []
    for i, record in enumerate(played.episodes):
        ctx = list(record.prompt)
        for ids, was_sampled in record.segments:
            if was_sampled:  # exactly what generate returned for this context, and its log-probs
                match = next(s for s in unmatched if s[0] == ctx and s[1] == ids)
                unmatched.remove(match)
                trained_tokens += ids
                trained_lps += match[2]
                turns_seen += 1
            elif record.reward == 1.0:  # the tool's answer, as the template renders it
                assert ids == tool_ids
            ctx += ids
        p = batch.prompt_len
        real = batch.attention_mask[i, p:]
        assert batch.input_ids[i, p:][real].tolist() == record.ids
        assert batch.response_mask[i][real].long().tolist() == record.loss_mask
        assert not batch.response_mask[i][~real].any()
        expected = [int(s) for ids, s in record.segments for _ in ids]
        assert record.loss_mask == expected
    assert turns_seen == len(sampled) and not unmatched
    assert batch.tokens.tolist() == trained_tokens  # what the loss reads, row after row
    assert batch.behavior.token_logprobs.tolist() == trained_lps
    # a tool episode's mask: its two turns 1, the tool's tokens 0
    used = next(r for r in played.episodes if r.reward == 1.0 and r.turns == 2)
    a, b = (len(t) for t in used.sampled_turns)
    assert used.loss_mask == [1] * a + [0] * len(tool_ids) + [1] * b
    print("\n" + format_episode(used, tok))


# -- (d) the masked loss is the loss over the sampled tokens alone ---------------------------


def test_masked_loss_equals_the_loss_over_sampled_tokens_alone(tool_model: ToolModel) -> None:
    """The trainer's loss over the padded multi-turn batch (shared prompts, the environment's
    tokens in the context and out of the mask) against a float64 reference that runs each
    episode alone, unpadded, and sums over its sampled tokens only."""
    played = _play(tool_model, n=4, seed=2)
    batch = played.batch
    assert any(r.turns == 2 for r in played.episodes)  # some episode holds a tool's tokens
    adv_seq = torch.tensor([1.0, -0.5, 0.25, -2.0])
    keep = batch.response_mask
    adv_tok = adv_seq[:, None].expand_as(keep)[keep]
    region = TrustRegion()  # the default: predictive mask, TV, top-K
    lm = tool_model.lm
    with torch.no_grad():
        logits = response_logits(lm, batch, SAMPLING.temperature)
        out = policy_loss(logits, batch.tokens, batch.behavior, adv_tok, region)
    assert bool(out.keep.all())  # on-policy: nothing masked, the comparison is the sums
    lm64 = lm.copy_as(torch.float64)
    terms, everything = [], []
    mu = iter(batch.behavior.token_logprobs.double().tolist())
    for record, a in zip(played.episodes, adv_seq.double().tolist(), strict=True):
        seq = torch.tensor([record.prompt + record.ids])
        n = seq.shape[1]
        with torch.no_grad():
            logp, _ = lm64.forward(
                seq, torch.ones_like(seq), torch.arange(n)[None], use_cache=False
            )
        logp = torch.log_softmax(logp[0].double(), -1)
        for j, (tok_id, m) in enumerate(zip(record.ids, record.loss_mask, strict=True)):
            lp = float(logp[len(record.prompt) + j - 1, tok_id])
            everything.append(a * lp)
            if m:
                ratio = torch.tensor(lp - next(mu)).exp().item()
                terms.append(a * ratio * lp)
    reference = -sum(terms) / len(terms)
    assert len(terms) == int(keep.sum())
    assert float(out.loss) == pytest.approx(reference, rel=1e-5, abs=1e-6)
    # the environment's tokens counted too would give another loss: this test can fail
    assert abs(-sum(everything) / len(everything) - reference) > 1e-2


# -- (c) faulty environments: their episodes score 0 and are counted, the run goes on --------

RELEASE = threading.Event()
"""Set when the hanging environment's threads may end (they are daemons either way)."""


class FaultyEpisode(Episode):
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def step(self, turn: Turn) -> Observation | Done:
        if self.kind == "raises":
            raise RuntimeError("the environment broke")
        if self.kind == "hangs":
            RELEASE.wait(60)
            return Done(1.0)
        if self.kind == "floods":  # a tool result for every turn, whatever the model says
            return Observation(messages=({"role": "tool", "content": "0"},))
        return Done(float(turn.ids[0] % 2) if turn.ids else 0.0)  # rewards that differ


class FaultyEnvironment(Environment):
    """Rows cycle through `args["kinds"]`: a well-behaved episode ("ok"), one whose step raises,
    one that hangs past its limit, one that answers every turn with a tool result (a flood of
    calls past max_turns), and one whose start raises."""

    name = "test_faulty"

    def __init__(self, args: Mapping[str, Any]) -> None:
        self.kinds = list(args["kinds"])
        self.drawn = 0

    def sample(self, rng: random.Random) -> Example:
        kind = self.kinds[self.drawn % len(self.kinds)]
        self.drawn += 1
        messages = ({"role": "user", "content": f"{kind} {rng.randint(0, 9)}"},)
        return Example(kind, messages=messages, record={"kind": kind})

    def start(self, example: Example) -> Episode:
        if example.record["kind"] == "start_raises":
            raise ValueError("no episode today")
        return FaultyEpisode(str(example.record["kind"]))


register_environment("test_faulty", FaultyEnvironment)
KINDS = ["ok", "raises", "hangs", "floods"]


def test_faulty_episodes_score_zero_and_are_counted(tool_model: ToolModel) -> None:
    env = make_environment("test_faulty", {"kinds": [*KINDS, "start_raises"]})
    rng = random.Random(0)
    examples = [e for e in (env.sample(rng) for _ in range(5)) for _ in range(2)]
    limits = EpisodeLimits(max_turns=3, max_tokens=120, step_timeout=0.5)
    try:
        played = run_episodes(
            tool_model.lm,
            env,
            examples,
            limits=limits,
            sampling=SamplingOptions(max_new_tokens=6),
            generator=torch.Generator().manual_seed(0),
        )
    finally:
        RELEASE.set()
    outcomes = [r.outcome for r in played.episodes]
    assert outcomes == [
        *("done", "done"),
        *("error", "error"),
        *("timeout", "timeout"),
        *("turn_limit", "turn_limit"),
        *("error", "error"),
    ]
    assert played.rewards[2:] == [0.0] * 8
    assert [r.turns for r in played.episodes] == [1, 1, 1, 1, 1, 1, 3, 3, 0, 0]
    assert "the environment broke" in played.episodes[2].info["error"]
    assert "no episode today" in played.episodes[8].info["error"]
    m = played.metrics
    assert (m["env_errors"], m["env_timeouts"], m["env_turn_limits"]) == (0.4, 0.2, 0.2)
    assert m["env_token_limits"] == 0.0
    assert m["episode_turns_mean"] == pytest.approx(1.2)
    # the flood's episodes hold their turns and the tool's tokens, masked
    flood = played.episodes[6]
    assert [s for _, s in flood.segments] == [True, False, True, False, True]
    # the episode that never started holds its prompt alone
    assert played.episodes[8].ids == [] and not played.batch.response_mask[8].any()


def test_token_limit_ends_an_episode_with_zero(tool_model: ToolModel) -> None:
    env = make_environment("test_faulty", {"kinds": ["floods"]})
    played = run_episodes(
        tool_model.lm,
        env,
        [env.sample(random.Random(0))] * 2,
        limits=EpisodeLimits(max_turns=8, max_tokens=20, step_timeout=5.0),
        sampling=SamplingOptions(max_new_tokens=4),
        generator=torch.Generator().manual_seed(0),
    )
    assert [r.outcome for r in played.episodes] == ["token_limit", "token_limit"]
    assert played.metrics["env_token_limits"] == 1.0 and played.rewards == [0.0, 0.0]
    assert all(r.used <= 20 for r in played.episodes)


def test_the_models_positions_end_an_episode_too(
    tool_model: ToolModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model of few positions: the episode holds at most what fits after the prompt, and an
    observation that would pass the model's last position ends it (env_token_limits)."""
    env = make_environment("test_faulty", {"kinds": ["floods"]})
    example = env.sample(random.Random(0))
    prompt = encode_example(tool_model.lm.tokenizer, example)
    monkeypatch.setattr(tool_model.lm, "max_seq_len", len(prompt) + 6)
    played = run_episodes(
        tool_model.lm,
        env,
        [example] * 2,
        limits=EpisodeLimits(max_turns=8, max_tokens=200, step_timeout=5.0),
        sampling=SamplingOptions(max_new_tokens=4),
        generator=torch.Generator().manual_seed(0),
    )
    assert [r.outcome for r in played.episodes] == ["token_limit", "token_limit"]
    assert [r.turns for r in played.episodes] == [1, 1]
    assert all(r.used <= 4 for r in played.episodes)


def _faulty_run(
    folder: Path, environment: dict[str, Any], *, prompts: int, lr: float, steps: int
) -> TrainConfig:
    """A run of the local chat model on `test_faulty` with `environment`'s settings."""
    return TrainConfig.model_validate(
        {
            "model": {"name": f"hf:{folder}"},
            "task": {"name": "environment", "environment": {"name": "test_faulty", **environment}},
            "rollout": {"prompts_per_step": prompts, "group_size": 2, "max_new_tokens": 4},
            "algorithm": {"top_k": 8},
            "optim": {"lr": lr},
            "steps": steps,
            "checkpoint_every": 0,
            "device": "cpu",
        }
    )


def test_a_run_with_faulty_environments_trains_to_the_end(
    tool_model: ToolModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`train` on the faulty environment: every step has one group of each kind; the failed
    episodes score 0 and are counted, the run saves its final model; and each update trains on
    exactly the ids the rollout sampled and the environment inserted."""
    RELEASE.clear()
    trained: list[RolloutBatch] = []
    real_update = run_module.update_policy

    def spy(lm: Any, optimizer: Any, batch: RolloutBatch, *a: Any, **kw: Any) -> Any:
        trained.append(batch)
        return real_update(lm, optimizer, batch, *a, **kw)

    played: list[EpisodeBatch] = []
    real_run = run_module.run_episodes

    def spy_run(*a: Any, **kw: Any) -> EpisodeBatch:
        played.append(real_run(*a, **kw))
        return played[-1]

    monkeypatch.setattr(run_module, "update_policy", spy)
    monkeypatch.setattr(run_module, "run_episodes", spy_run)
    cfg = _faulty_run(
        tool_model.folder,
        {"args": {"kinds": KINDS}, "max_turns": 3, "max_tokens": 60, "step_timeout_seconds": 0.5},
        prompts=4,
        lr=1e-3,
        steps=3,
    )
    try:
        result = train(cfg, tmp_path / "run")
    finally:
        RELEASE.set()
    assert result.step == 3 and result.final_model is not None and result.final_model.is_dir()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1.0, 2.0, 3.0]
    for r in rows:
        assert (r["env_errors"], r["env_timeouts"], r["env_turn_limits"]) == (0.25, 0.25, 0.25)
        assert r["episode_turns_mean"] == 1.5  # 1 + 1 + 1 + 3 turns, per group
    assert len(trained) == len(played) == 3
    for batch, ep in zip(trained, played, strict=True):
        assert batch is ep.batch
        for i, record in enumerate(ep.episodes):
            p = batch.prompt_len
            real = batch.attention_mask[i, p:]
            assert batch.input_ids[i, p:][real].tolist() == record.ids
            assert batch.response_mask[i][real].long().tolist() == record.loss_mask


# -- the pieces: tool calls, the calculator, the spec ----------------------------------------


def test_tool_calls_parse_in_the_hermes_format() -> None:
    text = 'a <tool_call>{"name":"calculator","arguments":{"expression":"2*3"}}</tool_call> b'
    text += "<tool_call>{oops}</tool_call><tool_call>[1]</tool_call>"
    calls = parse_tool_calls(text)
    assert calls[0].name == "calculator" and calls[0].arguments == {"expression": "2*3"}
    assert calls[1].error == "not JSON: JSONDecodeError"
    assert calls[2].error is not None and calls[2].name == ""
    assert parse_tool_calls("no call") == []
    assert json.loads(format_tool_call("c", {"x": 1})[11:-12]) == {
        "name": "c",
        "arguments": {"x": 1},
    }


def test_the_calculator_evaluates_arithmetic_only() -> None:
    assert evaluate("(2+3)*-4 - 7//2 % 3") == -20 - 0
    for bad in ("__import__('os')", "2**10", "1/2", "a+1", "9" * 61, "1//0", "x" * 300):
        with pytest.raises(ValueError):
            evaluate(bad)
    assert final_answer("so <answer> 12 </answer>") == "12"
    assert final_answer("it is 3 or 41") == "41" and final_answer("none") is None
    env = make_environment("calculator", {})
    episode = env.start(Example("", "6"))
    call = format_tool_call("calculator", {"expression": "2*3"})
    obs = episode.step(Turn((), call + call, True, 0))
    assert isinstance(obs, Observation) and obs.messages == (
        {"role": "tool", "content": "6"},
        {"role": "tool", "content": "6"},
    )
    assert episode.step(Turn((), "<answer>6</answer>", True, 1)) == Done(
        1.0, {"answer": "6", "tool_calls": 2}
    )
    with pytest.raises(ValueError, match="its args"):
        make_environment("calculator", {"colour": 1})


def test_the_environment_spec_validates() -> None:
    from pdppo.spec import load_spec

    spec = load_spec(ROOT / "examples" / "environments" / "calculator.yaml")
    assert spec.train.task.environment is not None
    assert spec.train.task.environment.name == "calculator"
    base = {"name": "environment", "environment": {"name": "calculator"}}
    chat = {"name": "hf:x"}
    with pytest.raises(ValueError, match=r"task\.environment goes with"):
        TrainConfig.model_validate({"model": chat, "task": {"name": "environment"}})
    with pytest.raises(ValueError, match=r"task\.environment goes with"):
        TrainConfig.model_validate({"task": {"name": "reverse", "environment": {"name": "x"}}})
    with pytest.raises(ValueError, match=r"rollout\.engine='hf'"):
        TrainConfig.model_validate({"model": chat, "task": base, "rollout": {"engine": "vllm"}})
    with pytest.raises(ValueError, match="warm-up"):
        TrainConfig.model_validate({"model": chat, "task": {**base, "warmup_steps": 3}})
    with pytest.raises(ValueError, match="needs a model with a chat template"):
        TrainConfig.model_validate({"task": base})  # builtin:tiny
    with pytest.raises(ValueError, match=r"plays its episodes in the trainer's process"):
        TrainConfig.model_validate({"model": chat, "task": base, "rollout": {"mode": "async"}})
    assert TrainConfig.model_validate({"model": chat, "task": base}).rollout.mode == "sync"
    with pytest.raises(ValueError, match="eval_every=2 needs held-out data"):
        TrainConfig.model_validate({"model": chat, "task": base, "eval_every": 2})
    cfg = TrainConfig.model_validate(
        {"model": chat, "task": {**base, "environment": {"name": "nope"}}}
    )
    with pytest.raises(ValueError, match="known: calculator"):
        EnvironmentTask(cfg.task)
    with pytest.raises(ValueError, match="played in episodes"):
        make_task(cfg.task)


def test_a_stopped_environment_run_resumes_to_the_uninterrupted_one(
    tool_model: ToolModel, tmp_path: Path
) -> None:
    """Episodes draw from the run's generators only (the environment's threads decide nothing
    about sampling): a run stopped after step 2 and resumed writes the metrics and the final
    weights of the run that never stopped, multi-turn episodes and their masks included."""
    from safetensors.torch import load_file

    from tests.support.trainer_runs import TIMING, Recorder

    cfg = _faulty_run(  # 2 rows a step, of the 2 kinds: the same in each run
        tool_model.folder,
        {"args": {"kinds": ["ok", "floods"]}, "max_turns": 2, "max_tokens": 40},
        prompts=2,
        lr=1e-2,
        steps=4,
    )
    full, part = tmp_path / "full", tmp_path / "part"
    train(cfg, full)
    assert train(cfg, part, callback=Recorder(stop_after=2)).step == 2
    assert train(cfg, part, resume=True).step == 4
    strip = [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(full)]
    assert [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(part)] == strip
    assert all(r["episode_env_tokens_mean"] > 0 for r in strip)  # the floods' tool tokens
    assert any(r["grad_norm"] > 0 for r in strip)
    a = load_file(str(full / "final" / "model.safetensors"))
    b = load_file(str(part / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
