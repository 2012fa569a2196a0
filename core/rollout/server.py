"""The rollout server of `rollout.mode: async` (issue 53): the HF engine (`core.rollout.generate`)
in a process of its own, sampling the groups of the next steps while the trainer updates.

Why a process and not a thread: generation and the update both hold the GIL for long stretches
of Python between kernels, and a crashed or hung sampler must cost a restart, not the job.

The two sides and what travels between them:
- requests (parent to server): a step's prompt ids and sampling settings, in order. The trainer
  draws the prompts (its prompt generator, checkpointed) and grades the completions; the server
  only samples. A request for step s carries `min_version = s - max_off_policy_steps`: the server
  waits for that policy version before sampling it (`server_wait_s`), so a sample cannot start
  out older than the bound;
- weights (parent to server): after every optimizer step the trainable weights (`CausalLM.
  snapshot`: with LoRA the adapter's tensors only, the frozen base never travels) serialized
  into one payload with its version, the number of updates done. The server keeps running and
  loads the newest payload between two requests (`weight_sync_s`, `weight_sync_bytes`: the
  trainer's cost of one publish, and the payload's size);
- results (server to parent): the batch with its behaviour log-probs and top-K view, computed by
  the server's copy, the version that sampled it, and the sampling generator's state after it.

The parent (`RolloutServer`) keeps what it sent and did not get back yet: a server that dies
(SIGKILL, OOM) is started again from the newest weights and the generator state after the last
batch received, and is sent the requests again, so the run goes on (`MAX_RESTARTS` in a row
without a batch between them, then `RolloutServerError`). `take(step)` returns the oldest
finished batch no older than the bound, dropping and counting (`dropped_samples`) those older;
a dropped request is sent again with its prompts.

Every sample of one request shares its version; with `max_off_policy_steps: 0` the server samples
step s with the policy after s updates and the sampling generator the synchronous loop would use,
so an async run equals the synchronous one (tests/core/test_async_rollout.py).

The server is started by torch.multiprocessing's spawn context, which imports the parent's main
module again in the child (as `__mp_main__`): a script that calls `train` with `rollout.mode:
async` must do so under `if __name__ == "__main__":` (pdppo's CLI, its workers and pytest do).

Not yet (issue 53's later items): partial rollouts (a request finishes under the version it
started with), vLLM as the server, data-parallel ranks, a GPU for the server (it samples on CPU).
"""

from __future__ import annotations

import contextlib
import io
import os
import queue
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as tmp

from core.config import TrainConfig
from core.objective.behavior import BehaviorView
from core.rollout import RolloutBatch, SamplingOptions, StopRequested, generate

STARTUP_SECONDS = 120.0
"""How long a new server may take to import torch and load its copy of the model."""

MAX_RESTARTS = 3
"""Restarts after a crash with no batch received between them, before the run fails."""

POLL_SECONDS = 0.05
"""How often a wait (the trainer's for a batch, the server's for a request or weights) looks at
a stop, the other side's death or a timeout."""

START_FAILED = "rollout_server_start_failed"
CRASHED = "rollout_server_crashed"
SERVER_ERROR = "rollout_server_error"


class RolloutServerError(RuntimeError):
    """The rollout server could not do its work; `code` says how, for a caller to branch on:
    `rollout_server_start_failed` (it never became ready: its model did not load, no process
    could start, past `startup_seconds`), `rollout_server_crashed` (it died `MAX_RESTARTS` + 1
    times without a batch between), `rollout_server_error` (it raised while sampling: the same
    request would raise again, so it is not restarted)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass(frozen=True)
class Sampling:
    """What `generate` needs besides the prompts: each prompt's group size and the sampling
    options, read from the config at each request, so a steered temperature or length applies
    from the next request on."""

    group_size: int
    options: SamplingOptions

    @classmethod
    def of(cls, cfg: TrainConfig) -> Sampling:
        return cls(group_size=cfg.rollout.group_size, options=SamplingOptions.of(cfg))


@dataclass(frozen=True)
class Request:
    index: int  # the parent's count of requests: results come back in this order
    min_version: int  # the oldest policy the server may sample it with
    prompts: list[list[int]]  # one per group
    sampling: Sampling


@dataclass
class Finished:
    """A batch the server sampled, on the parent's side, with what the parent attached to its
    request (`tag`: the trainer's examples)."""

    tag: Any
    version: int  # the policy version (updates done) that sampled it
    batch: RolloutBatch
    seconds: float  # the server's sampling time
    server_wait_s: float  # the server's wait for weights before sampling it
    generator_state: torch.Tensor  # the sampling generator after this batch


@dataclass(frozen=True)
class Taken:
    """`RolloutServer.take`'s answer: the batch and the step's async metrics."""

    finished: Finished
    metrics: dict[str, float]


@dataclass(frozen=True)
class _Setup:
    """Everything the server process starts from (pickled by the spawn context)."""

    cfg: TrainConfig
    data_roots: list[str] | None
    model_dir: Path | None
    generator_state: bytes
    threads: int
    parent: int


@dataclass
class _Pending:
    request: Request
    tag: Any
    order: int  # the first submission's index: a resent request keeps it


@dataclass
class _Process:
    """One server process and its three queues (a killed server may leave a queue's lock held:
    a restart gets new ones)."""

    proc: Any
    requests: Any
    weights: Any
    results: Any

    def discard(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=10)
        for q in (self.requests, self.weights, self.results):
            q.cancel_join_thread()  # never wait on a pipe the dead server no longer reads
            q.close()


class RolloutServer:
    """The parent's side of the server: `submit` requests, `publish` weights, `take` batches,
    `close` (also at garbage collection and interpreter exit: no server outlives its run)."""

    def __init__(
        self,
        cfg: TrainConfig,
        *,
        generator_state: torch.Tensor,
        data_roots: Sequence[str] | None = None,
        model_dir: Path | None = None,
        startup_seconds: float = STARTUP_SECONDS,
        device: torch.device | None = None,
        on_log: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.bound = cfg.rollout.max_off_policy_steps
        self.data_roots = None if data_roots is None else list(data_roots)
        self.model_dir = model_dir
        self.startup_seconds = startup_seconds
        self.device = device
        self.on_log = on_log or (lambda message: None)
        self.generator_state = generator_state.clone()  # after the last batch received
        self.pending: deque[_Pending] = deque()  # sent, not received, in order
        self.ready: deque[tuple[_Pending, Finished]] = deque()  # received, not taken
        self.requested_through = -1  # the latest step a request was submitted for
        self.starts = 0
        self.restarts_in_a_row = 0
        self._next_index = 0
        self._weights: tuple[int, bytes] | None = None  # the newest publish
        self._server: _Process | None = None
        self._finalizer = weakref.finalize(self, _discard_quietly, [None])

    @property
    def pid(self) -> int | None:
        return None if self._server is None else int(self._server.proc.pid)

    # -- the parent's calls ------------------------------------------------------------

    def publish(self, weights: dict[str, torch.Tensor], version: int) -> dict[str, float]:
        """Send the policy after `version` updates; starts the server on the first call.
        Returns `weight_sync_s` (the trainer's time: serialization and the hand-over to the
        queue's pipe) and `weight_sync_bytes`."""
        t0 = time.perf_counter()
        buf = io.BytesIO()
        torch.save({k: v.detach().cpu() for k, v in weights.items()}, buf)
        payload = buf.getvalue()
        self._weights = (version, payload)
        if self._server is None:
            self._start()
        else:
            self._server.weights.put((version, payload))
        return {"weight_sync_s": time.perf_counter() - t0, "weight_sync_bytes": len(payload)}

    def submit(
        self, prompts: list[list[int]], target_step: int, sampling: Sampling, tag: Any = None
    ) -> None:
        """Ask for a batch for trainer step `target_step` (its prompts, one per group), sampled
        as the run's config says now (`Sampling.of`: steering applies to the next request)."""
        self._send(prompts, target_step, tag, sampling, order=self._next_index)
        self.requested_through = max(self.requested_through, target_step)

    def take(self, step: int, should_stop: Callable[[], bool] | None = None) -> Taken:
        """The oldest finished batch that trainer step `step` may train on (no more than the
        bound's versions old), waiting for one; older ones are dropped and their prompts asked
        for again. `should_stop` is asked while waiting: True raises `StopRequested`."""
        t0 = time.perf_counter()
        dropped = 0
        while True:
            while not self.ready:
                self._receive(should_stop, block=True)
            item, done = self.ready.popleft()
            if step - done.version <= self.bound:
                break
            dropped += len(done.batch.completions)
            self._send(item.request.prompts, step, item.tag, item.request.sampling, item.order)
        waited = time.perf_counter() - t0
        self.poll()  # what else is finished now: the buffer's depth
        age = float(step - done.version)
        return Taken(
            done,
            {
                "sample_age_mean": age,  # one request, one version: every sample has its age
                "sample_age_max": age,
                "dropped_samples": float(dropped),
                "buffer_depth": float(len(self.ready)),
                "trainer_wait_s": waited,
                "server_wait_s": done.server_wait_s,
            },
        )

    def close(self) -> None:
        """Stop the server and forget what was in flight. It is killed, not asked: it holds
        nothing worth saving, and a server with results still in its pipe would not exit before
        they are read."""
        server, self._server = self._server, None
        self._finalizer.detach()
        if server is not None:
            server.discard()

    def poll(self) -> int:
        """Receive what the server has finished, without waiting; the batches ready to take."""
        self._receive(None, block=False)
        return len(self.ready)

    def in_flight(self) -> list[Any]:
        """The tags of the requests asked for and not taken yet, the oldest submitted first
        (a dropped request, asked for again, keeps its place)."""
        items = [*self.pending, *(item for item, _ in self.ready)]
        return [item.tag for item in sorted(items, key=lambda item: item.order)]

    # -- starts and restarts -----------------------------------------------------------

    def _start(self) -> None:
        """A new server process, ready, holding the newest weights and the requests in flight."""
        ctx = tmp.get_context("spawn")
        setup = _Setup(
            cfg=self.cfg,
            data_roots=self.data_roots,
            model_dir=self.model_dir,
            generator_state=self.generator_state.numpy().tobytes(),
            threads=torch.get_num_threads(),
            parent=os.getpid(),
        )
        server = _Process(None, ctx.Queue(), ctx.Queue(), ctx.Queue())
        server.proc = ctx.Process(
            target=serve,
            args=(setup, server.requests, server.weights, server.results),
            name="pdppo-rollout-server",
            daemon=True,
        )
        try:
            server.proc.start()
        except OSError as exc:
            raise RolloutServerError(START_FAILED, f"could not start a process: {exc}") from exc
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _discard_quietly, [server])
        self._await_ready(server)
        self._server = server
        self.starts += 1
        self.on_log(f"rollout server started (pid {server.proc.pid}, start {self.starts})")
        if self._weights is not None:
            server.weights.put(self._weights)
        for item in self.pending:
            server.requests.put(item.request)

    def _await_ready(self, server: _Process) -> None:
        deadline = time.monotonic() + self.startup_seconds
        while True:
            try:
                message = server.results.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if not server.proc.is_alive():
                    server.discard()
                    raise RolloutServerError(
                        START_FAILED, f"the server exited with code {server.proc.exitcode}"
                    ) from None
                if time.monotonic() > deadline:
                    server.discard()
                    raise RolloutServerError(
                        START_FAILED, f"not ready within {self.startup_seconds:g} s"
                    ) from None
                continue
            if message[0] == "ready":
                return
            server.discard()
            raise RolloutServerError(START_FAILED, str(message[1]))

    def _restart(self) -> None:
        """The server died: start another, unless it died too often in a row."""
        server, self._server = self._server, None
        code = None
        if server is not None:
            server.discard()
            code = server.proc.exitcode
        self.restarts_in_a_row += 1
        if self.restarts_in_a_row > MAX_RESTARTS:
            raise RolloutServerError(
                CRASHED,
                f"the server died {self.restarts_in_a_row} times without sampling a batch in "
                f"between (last exit code {code})",
            )
        self.on_log(f"rollout server died (exit code {code}); restarting it")
        self._start()

    # -- the queues ----------------------------------------------------------------------

    def _send(
        self, prompts: list[list[int]], target_step: int, tag: Any, sampling: Sampling, order: int
    ) -> None:
        request = Request(self._next_index, target_step - self.bound, prompts, sampling)
        self._next_index += 1
        self.pending.append(_Pending(request, tag, order))
        if self._server is not None:
            self._server.requests.put(request)

    def _receive(self, should_stop: Callable[[], bool] | None, *, block: bool) -> None:
        """Move what the server finished into `ready`: at least one batch when `block`."""
        while True:
            if self._server is None:
                if not block:
                    return
                self._start()
            server = self._server
            assert server is not None
            try:
                if block:
                    message = server.results.get(timeout=POLL_SECONDS)
                else:
                    message = server.results.get_nowait()
            except queue.Empty:
                if not block:
                    return
                if should_stop is not None and should_stop():
                    raise StopRequested("stopped while waiting for the rollout server") from None
                if not server.proc.is_alive():
                    self._restart()
                continue
            except (EOFError, OSError):
                self._restart()
                continue
            self._accept(message)
            if block:
                return

    def _accept(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "error":
            raise RolloutServerError(SERVER_ERROR, str(message[1]))
        _, index, version, packed, seconds, waited, state = message
        item = self.pending.popleft()
        assert item.request.index == index, (item.request.index, index)
        generator_state = torch.frombuffer(bytearray(state), dtype=torch.uint8).clone()
        self.generator_state = generator_state
        self.restarts_in_a_row = 0
        batch = _unpack(packed, self.device or torch.device("cpu"))
        done = Finished(
            tag=item.tag,
            version=version,
            batch=batch,
            seconds=seconds,
            server_wait_s=waited,
            generator_state=generator_state,
        )
        self.ready.append((item, done))


def _discard_quietly(holder: list[_Process | None]) -> None:
    for server in holder:
        if server is not None:
            with contextlib.suppress(Exception):
                server.discard()


# -- the server process ----------------------------------------------------------------------


def serve(setup: _Setup, requests: Any, weights: Any, results: Any) -> None:
    """The server process's main: load the model, then sample request after request with the
    newest weights at least as new as each asks for. Exits on a `None` request, or when its
    parent is gone."""
    from core.models import load_model
    from core.process.parent_death import die_with_parent

    try:
        if not die_with_parent(setup.parent):
            return
        torch.set_num_threads(setup.threads)  # the trainer's: the same reductions, bit for bit
        cfg = setup.cfg
        torch.manual_seed(cfg.seed)  # the trainer's, before its load: the same frozen weights
        lm = load_model(
            cfg.model, torch.device("cpu"), data_roots=setup.data_roots, model_dir=setup.model_dir
        )
        dtype = _DTYPES[cfg.rollout.dtype]
        lm = lm.copy_as(dtype)  # frozen, eval mode; the dtype the config samples in
        gen = torch.Generator()
        gen.set_state(torch.frombuffer(bytearray(setup.generator_state), dtype=torch.uint8))
    except Exception:
        results.put(("error", traceback.format_exc(limit=8)))
        return
    results.put(("ready",))
    loader = _Weights(lm, weights, setup.parent)
    try:
        while True:
            request = _next(requests, setup.parent)
            if request is None:
                return
            waited = loader.at_least(request.min_version)
            if waited is None:
                return
            s = request.sampling
            t0 = time.perf_counter()
            batch = generate(
                lm,
                [p for p in request.prompts for _ in range(s.group_size)],
                **asdict(s.options),
                generator=gen,
            )
            seconds = time.perf_counter() - t0
            state = gen.get_state().numpy().tobytes()
            packed = _pack(batch)
            results.put(("batch", request.index, loader.version, packed, seconds, waited, state))
    except Exception:
        results.put(("error", traceback.format_exc(limit=8)))


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Weights:
    """The server's copy and the version it holds; loads the newest payload it was sent."""

    lm: Any
    queue: Any
    parent: int
    version: int = -1
    loaded: list[float] = field(default_factory=list)

    def at_least(self, min_version: int) -> float | None:
        """Load the newest weights sent, waiting until they are `min_version` or newer (and
        some at all); the seconds waited, or None when the parent is gone."""
        t0 = time.perf_counter()
        newest = self._drain(block=False)
        if newest is not None:
            self._load(newest)
        while self.version < max(min_version, 0):
            newest = self._drain(block=True)
            if newest is not None:
                self._load(newest)
            elif os.getppid() != self.parent:
                return None
        return time.perf_counter() - t0

    def _drain(self, *, block: bool) -> tuple[int, bytes] | None:
        newest = None
        try:
            newest = self.queue.get(timeout=POLL_SECONDS) if block else self.queue.get_nowait()
            while True:
                newest = self.queue.get_nowait()
        except queue.Empty:
            return newest

    def _load(self, item: tuple[int, bytes]) -> None:
        version, payload = item
        state = torch.load(io.BytesIO(payload), weights_only=True)
        self.lm.load_snapshot(state)
        self.version = version


def _next(requests: Any, parent: int) -> Request | None:
    while True:
        try:
            request: Request | None = requests.get(timeout=POLL_SECONDS * 4)
            return request
        except queue.Empty:
            if os.getppid() != parent:
                return None


def _pack(batch: RolloutBatch) -> bytes:
    """The batch as one bytes payload: a plain pipe, no shared-memory handles that die with a
    killed server."""
    view = batch.behavior
    buf = io.BytesIO()
    torch.save(
        {
            "input_ids": batch.input_ids,
            "attention_mask": batch.attention_mask,
            "prompt_len": batch.prompt_len,
            "response_mask": batch.response_mask,
            "token_logprobs": view.token_logprobs,
            "topk_ids": view.topk_ids,
            "topk_logprobs": view.topk_logprobs,
            "full_logprobs": view.full_logprobs,
            "completions": batch.completions,
        },
        buf,
    )
    return buf.getvalue()


def _unpack(packed: bytes, device: torch.device) -> RolloutBatch:
    d = torch.load(io.BytesIO(packed), map_location=device, weights_only=True)
    view = BehaviorView(d["token_logprobs"], d["topk_ids"], d["topk_logprobs"], d["full_logprobs"])
    return RolloutBatch(
        input_ids=d["input_ids"],
        attention_mask=d["attention_mask"],
        prompt_len=int(d["prompt_len"]),
        response_mask=d["response_mask"],
        behavior=view,
        completions=d["completions"],
    )
