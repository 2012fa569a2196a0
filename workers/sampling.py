"""The sample worker's task (`pdppo sample-worker`): a few completions of a succeeded job's final
model, answered through Redis to the API request waiting for them (`workers.sample_app`).

The worker keeps the last PDPPO_SAMPLE_MODELS_CACHED models loaded, keyed by job id and the
final folder's mtime (a folder replaced in place is loaded again), so only a job's first
completion pays for loading it. A request whose deadline passed while it waited in the queue is
dropped unanswered: its API request has already said 504, and generating for nobody would delay
the requests behind it."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import redis
import torch

from core.config import ModelConfig
from core.models import CausalLM, load_model
from core.rollout.completions import PromptTooLong, complete
from pdppo.settings import Settings, get_settings
from workers.sample_app import COMPLETE_TASK, REPLY_TTL_SECONDS, reply_key, sample_app

log = logging.getLogger(__name__)


class ModelCache:
    """The last `size` loaded models, least recently used out first. One load at a time: two
    first requests for one job load it once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.models: OrderedDict[tuple[str, int], CausalLM] = OrderedDict()
        self.loads = 0
        self._lock = threading.Lock()

    def get(self, job_id: str, folder: Path) -> tuple[CausalLM, bool]:
        """The model and whether it was loaded now (cold)."""
        key = (job_id, folder.stat().st_mtime_ns)
        with self._lock:
            if key in self.models:
                self.models.move_to_end(key)
                return self.models[key], False
            lm = load_model(
                ModelConfig(name=f"job:{job_id}"), torch.device("cpu"), model_dir=folder
            )
            lm.module.eval()
            self.loads += 1
            for old in [k for k in self.models if k[0] == job_id]:
                del self.models[old]  # an older copy of a folder replaced in place
            self.models[key] = lm
            while len(self.models) > self.size:
                self.models.popitem(last=False)
            return lm, True


_cache: ModelCache | None = None
_redis: redis.Redis | None = None
_lock = threading.Lock()


def _state(settings: Settings) -> tuple[ModelCache, redis.Redis]:
    global _cache, _redis
    with _lock:
        if _cache is None or _redis is None:
            _cache = ModelCache(settings.sample_models_cached)
            _redis = redis.Redis.from_url(settings.redis_url)
        return _cache, _redis


def answer(request: dict[str, Any], settings: Settings, cache: ModelCache) -> dict[str, Any]:
    """The reply to one request: `{"status": 200, "result": {...}}`, or a status and `detail`."""
    folder = Path(settings.artifact_dir) / request["job_id"] / "final"
    if not folder.is_dir():
        return {
            "status": 404,
            "detail": f"job {request['job_id']!r} has no final model in the artifact store",
        }
    started = time.perf_counter()
    lm, cold = cache.get(request["job_id"], folder)
    load_ms = (time.perf_counter() - started) * 1000
    tok = lm.tokenizer
    if request.get("messages") is not None:
        try:
            prompt_ids = tok.encode_chat(request["messages"])
        except Exception as exc:  # the model's chat template refused these turns
            return {"status": 400, "detail": f"messages: the model's chat template: {exc}"}
    else:
        prompt_ids = tok.encode_prompt(request["prompt"])
    if len(prompt_ids) > settings.sample_max_prompt_tokens:
        return {
            "status": 400,
            "detail": f"the prompt is {len(prompt_ids)} tokens; this service accepts at most "
            f"{settings.sample_max_prompt_tokens} (PDPPO_SAMPLE_MAX_PROMPT_TOKENS)",
        }
    try:
        out = complete(
            lm,
            prompt_ids,
            max_tokens=request["max_tokens"],
            temperature=request["temperature"],
            top_p=request["top_p"],
            n=request["n"],
            seed=request.get("seed"),
            stop=request.get("stop") or [],
        )
    except PromptTooLong as exc:
        return {"status": 400, "detail": str(exc)}
    return {
        "status": 200,
        "result": {
            "choices": [
                {"text": c.text, "tokens": c.tokens, "finish_reason": c.finish_reason}
                for c in out.choices
            ],
            "prompt_tokens": out.prompt_tokens,
            "completion_tokens": sum(c.tokens for c in out.choices),
            "cold": cold,
            "load_ms": round(load_ms, 3),
            "generate_ms": round(out.generate_ms, 3),
        },
    }


@sample_app.task(name=COMPLETE_TASK)
def complete_task(request: dict[str, Any]) -> str:
    settings = get_settings()
    cache, conn = _state(settings)
    if time.time() > float(request["deadline"]):
        log.info("completion %s: its deadline passed in the queue; dropped", request["id"])
        return "expired"
    try:
        reply = answer(request, settings, cache)
    except Exception as exc:  # a bug or a broken model folder: the caller hears it now
        log.exception("completion %s failed", request["id"])
        reply = {"status": 500, "detail": f"the completion failed: {type(exc).__name__}: {exc}"}
    key = reply_key(request["id"])
    with conn.pipeline() as pipe:
        pipe.rpush(key, json.dumps(reply))
        pipe.expire(key, REPLY_TTL_SECONDS)
        pipe.execute()
    return str(reply["status"])
