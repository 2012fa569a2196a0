"""`core.rollout.completions.complete`: what a completion request gets from a model (stop strings,
the reason each completion ended, repeatable seeds, the model's context) and the sample worker's
model cache (`workers.sampling.ModelCache`)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import torch

from core.config.model import TinyModelConfig
from core.models.local_hf import make_chat_hf, make_tiny_hf
from core.models.tiny import TinyLM
from core.rollout.completions import PromptTooLong, _cut, complete
from pdppo.settings import Settings, get_settings
from tests.support.stack import RedisServer
from workers import sampling
from workers.sample_app import REPLY_TTL_SECONDS, reply_key
from workers.sampling import ModelCache, answer

SHAPE = TinyModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=24)


def tiny(seed: int = 0) -> TinyLM:
    torch.manual_seed(seed)
    lm = TinyLM(SHAPE)
    lm.module.eval()
    return lm


def test_cut_takes_the_earliest_stop() -> None:
    assert _cut("abc;de|f", ["|", ";"]) == "abc"
    assert _cut("abc", ["x", ""]) is None
    assert _cut("abc", []) is None


def test_greedy_length_and_stop_strings() -> None:
    lm = tiny()
    prompt = lm.tokenizer.encode_prompt("ab")
    out = complete(lm, prompt, max_tokens=6, temperature=0, n=2)
    assert out.prompt_tokens == 3 and out.max_tokens == 6
    first, second = out.choices
    assert first == second  # greedy: every choice the same
    text = first.text
    assert text, "this seed's model says nothing: pick another seed"
    if first.finish_reason == "length":
        assert first.tokens == 6
    stop = text[-1]
    cut = complete(lm, prompt, max_tokens=6, temperature=0, stop=[stop]).choices[0]
    assert cut.text == text[: text.index(stop)]
    assert cut.finish_reason == "stop"
    assert cut.tokens == len(lm.tokenizer.encode(cut.text))


def test_seeds_repeat_and_differ() -> None:
    lm = tiny()
    prompt = lm.tokenizer.encode_prompt("xy")
    a = complete(lm, prompt, max_tokens=8, n=3, seed=5)
    b = complete(lm, prompt, max_tokens=8, n=3, seed=5)
    c = complete(lm, prompt, max_tokens=8, n=3, seed=6)
    assert [x.text for x in a.choices] == [x.text for x in b.choices]
    assert [x.text for x in a.choices] != [x.text for x in c.choices]


def test_the_temperature_reaches_the_sampler() -> None:
    """The same seed draws other texts at another temperature (the tiny model's nearly flat
    logits: at 0.2 the draws sharpen enough to pick other tokens than at 1)."""
    lm = tiny()
    prompt = lm.tokenizer.encode_prompt("xy")
    sharp = complete(lm, prompt, max_tokens=8, n=3, temperature=0.2, seed=5)
    plain = complete(lm, prompt, max_tokens=8, n=3, temperature=1.0, seed=5)
    assert [c.text for c in sharp.choices] != [c.text for c in plain.choices]


def test_the_models_context_bounds_the_completion() -> None:
    lm = tiny()
    prompt = lm.tokenizer.encode_prompt("x" * 20)  # 21 of the 24 positions
    out = complete(lm, prompt, max_tokens=50, temperature=0)
    assert out.max_tokens == 3
    assert out.choices[0].tokens <= 3
    with pytest.raises(PromptTooLong, match="the prompt is 24 tokens"):
        complete(lm, lm.tokenizer.encode_prompt("x" * 23), max_tokens=1)


def test_the_cache_loads_once_reloads_a_replaced_folder_and_evicts(tmp_path: Path) -> None:
    for job in ("a", "b"):
        tiny().save_final(tmp_path / job / "final")
    cache = ModelCache(size=1)
    first, cold = cache.get("a", tmp_path / "a" / "final")
    again, warm = cache.get("a", tmp_path / "a" / "final")
    assert (cold, warm, cache.loads) == (True, False, 1) and again is first
    stat = (tmp_path / "a" / "final").stat()
    os.utime(tmp_path / "a" / "final", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    reloaded, cold = cache.get("a", tmp_path / "a" / "final")
    assert cold and reloaded is not first and len(cache.models) == 1
    cache.get("b", tmp_path / "b" / "final")
    assert [k[0] for k in cache.models] == ["b"] and cache.loads == 3
    _, cold = cache.get("a", tmp_path / "a" / "final")
    assert cold and cache.loads == 4


def _request(**fields: Any) -> dict[str, Any]:
    base = {
        "id": "cmpl-t",
        "job_id": "j1",
        "prompt": None,
        "messages": None,
        "max_tokens": 8,
        "temperature": 0,
        "top_p": 1.0,
        "n": 1,
        "seed": None,
        "stop": [],
    }
    return {**base, **fields}


def test_an_hf_final_model_answers_chat_turns_as_transformers_does(tmp_path: Path) -> None:
    """A `hf:` job's final folder (a Hugging Face folder with a chat template): the worker's
    answer to chat turns is the template's prompt and transformers' own greedy continuation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = make_chat_hf(tmp_path / "j1" / "final")
    settings = Settings(artifact_dir=tmp_path)
    turns = [{"role": "user", "content": "2+2="}]
    cache = ModelCache(size=1)
    reply = answer(_request(messages=turns), settings, cache)
    assert reply["status"] == 200, reply
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tok.apply_chat_template(turns, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    model = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=8, do_sample=False, attention_mask=torch.ones_like(ids)
        )
    expected = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    result = reply["result"]
    assert result["prompt_tokens"] == ids.shape[1]
    assert [c["text"] for c in result["choices"]] == [expected]
    assert result["cold"] is True and result["load_ms"] >= 1  # a load from disk: milliseconds
    # asked again, the model is the cache's: its load time is the lookup's, well under a second
    warm = answer(_request(messages=turns), settings, cache)["result"]
    assert warm["cold"] is False and 0 <= warm["load_ms"] < 1000
    assert [c["text"] for c in warm["choices"]] == [expected]


def test_chat_turns_to_a_model_without_a_template_are_a_400(tmp_path: Path) -> None:
    make_tiny_hf(tmp_path / "j1" / "final")
    settings = Settings(artifact_dir=tmp_path)
    reply = answer(
        _request(messages=[{"role": "user", "content": "hi"}]), settings, ModelCache(size=1)
    )
    assert reply["status"] == 400
    assert reply["detail"].startswith("messages: the model's chat template: ")
    missing = answer(_request(job_id="j2", prompt="x"), settings, ModelCache(size=1))
    assert missing == {"status": 404, "detail": "job 'j2' has no final model in the artifact store"}
    long = answer(
        _request(prompt="x" * 40),
        Settings(artifact_dir=tmp_path, sample_max_prompt_tokens=8),
        ModelCache(size=1),
    )
    assert long["status"] == 400 and "PDPPO_SAMPLE_MAX_PROMPT_TOKENS" in long["detail"]


def test_a_completion_that_fails_is_answered_500_through_redis(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model folder no loader reads (an error, not a refusal): the sample worker's task answers
    the waiting API request 500 with the error, in the reply list it expires, rather than
    leaving it to its 504."""
    server = RedisServer(tmp_path / "redis")
    try:
        (tmp_path / "art" / "j1" / "final").mkdir(parents=True)
        monkeypatch.setenv("PDPPO_REDIS_URL", server.url(0))
        monkeypatch.setenv("PDPPO_ARTIFACT_DIR", str(tmp_path / "art"))
        get_settings.cache_clear()
        monkeypatch.setattr(sampling, "_cache", None)
        monkeypatch.setattr(sampling, "_redis", None)
        request = {**_request(prompt="ab"), "id": "r1", "deadline": time.time() + 60}
        assert sampling.complete_task(request) == "500"
        conn = redis.Redis.from_url(server.url(0), decode_responses=True)
        assert 0 < conn.ttl(reply_key("r1")) <= REPLY_TTL_SECONDS
        raw = conn.lpop(reply_key("r1"))
        assert isinstance(raw, str)
        reply = json.loads(raw)
        assert reply["status"] == 500
        assert reply["detail"].startswith("the completion failed: ")
        conn.close()
    finally:
        get_settings.cache_clear()
        server.stop()


def test_a_replaced_folder_drops_its_old_copy_from_a_roomy_cache(tmp_path: Path) -> None:
    """Room for two models: a job's folder replaced in place is loaded again and its old copy
    dropped at once, not kept until the size pushes it out."""
    tiny().save_final(tmp_path / "a" / "final")
    cache = ModelCache(size=2)
    cache.get("a", tmp_path / "a" / "final")
    stat = (tmp_path / "a" / "final").stat()
    os.utime(tmp_path / "a" / "final", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    cache.get("a", tmp_path / "a" / "final")
    assert list(cache.models) == [("a", stat.st_mtime_ns + 10**9)] and cache.loads == 2


def test_a_prompt_the_model_has_no_room_after_is_a_400(tmp_path: Path) -> None:
    """Within the operator's prompt limit but past the model's own context (the tiny model's
    24 positions): the request is refused with the reason, not failed."""
    tiny().save_final(tmp_path / "j1" / "final")
    settings = Settings(artifact_dir=tmp_path)
    reply = answer(_request(prompt="x" * 30), settings, ModelCache(size=1))
    assert reply == {
        "status": 400,
        "detail": "the prompt is 31 tokens and the model's context is 24 tokens: no room for a "
        "completion",
    }


def test_a_completion_that_reaches_eos_says_stop() -> None:
    """Seed 3's eight draws from "xy" (this tiny model): the first is EOS at once, the sixth
    after four tokens, both well within max_tokens: `stop`, not `length`, with their own
    token counts; the others run to the 8 tokens."""
    lm = tiny()
    out = complete(lm, lm.tokenizer.encode_prompt("xy"), max_tokens=8, n=8, seed=3)
    ended = [(i, c.tokens) for i, c in enumerate(out.choices) if c.finish_reason == "stop"]
    assert ended == [(0, 0), (5, 4)]
    assert all(c.tokens == 8 for c in out.choices if c.finish_reason == "length")


def test_a_prompt_that_leaves_one_position_gets_one_token() -> None:
    lm = tiny()
    out = complete(lm, lm.tokenizer.encode_prompt("x" * 22), max_tokens=5, temperature=0)
    assert out.max_tokens == 1 and out.choices[0].tokens <= 1
