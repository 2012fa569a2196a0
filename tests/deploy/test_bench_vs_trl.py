"""bench/vs_trl.py without TRL: its help and its refusal work on the project's own install (TRL
is an optional extra), and the work it asks of pdppo is the work it claims to compare."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "vs_trl.py"
# runs the script as `python bench/vs_trl.py ARGS` would, with `import trl` failing
# (sys.modules[name] = None makes the import raise ImportError even where TRL is installed)
WITHOUT_TRL = (
    "import runpy, sys; sys.modules['trl'] = None; sys.argv = [{script!r}, *{args!r}]\n"
    "try:\n"
    "    runpy.run_path({script!r}, run_name='__main__')\n"
    "finally:\n"
    "    print('imported:', sorted(m for m in ('trl', 'torch') if sys.modules.get(m)))\n"
)


def _without_trl(*args: str) -> subprocess.CompletedProcess[str]:
    code = WITHOUT_TRL.format(script=str(SCRIPT), args=list(args))
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vs_trl", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["vs_trl"] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def test_help_needs_neither_trl_nor_torch() -> None:
    done = _without_trl("--help")
    assert done.returncode == 0, done.stderr
    for flag in ("--task", "--steps", "--repeats", "--quick"):
        assert flag in done.stdout
    assert "imported: []" in done.stdout


def test_a_run_without_trl_says_how_to_install_it() -> None:
    done = _without_trl("--quick")
    assert done.returncode == 2, done.stderr
    assert "pip install -e '.[bench]'" in done.stderr
    assert "imported: []" in done.stdout  # refused before building a model


def test_the_pdppo_row_does_the_stated_work(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from core.models.local_hf import make_chat_hf

    bench = _load()
    model_dir = make_chat_hf(tmp_path / "model")
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    short, long = bench.records("short"), bench.records("long")
    assert len(short) == len(long) == 110
    assert short[0] == {"prompt": "0+0=", "answer": "0"}
    for rec in short + long:  # every answer is right
        found = re.search(r"(\d) ?([+-]) ?(\d) ?=$", rec["prompt"])
        assert found, rec
        a, op, b = found.groups()
        assert int(rec["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))
    assert long[0]["prompt"].startswith(bench.LONG_INSTRUCTION)
    long_tokens = {len(tok(r["prompt"])["input_ids"]) for r in long}
    assert long_tokens == {60}  # the long task's prompt: 7.5x the completion
    assert {len(tok(r["prompt"])["input_ids"]) for r in short} == {5}

    setup = bench.Setup(
        row="pdppo",
        task="long",
        model_dir=model_dir,
        data_path=tmp_path / "d.jsonl",
        out_dir=tmp_path,
        total_steps=7,
        lr=1e-3,
        seed=0,
        device="cpu",
    )
    cfg = bench.pdppo_config(setup)
    r, alg = cfg.rollout, cfg.algorithm
    assert (r.prompts_per_step, r.group_size, r.max_new_tokens) == (8, 8, 8)
    assert (r.temperature, r.top_p, r.staleness, r.dtype) == (1.0, 1.0, 0, "float32")
    assert (alg.minibatches, alg.epochs, alg.kl_beta, alg.normalize_std) == (1, 1, 0.0, True)
    assert (cfg.optim.lr, cfg.optim.schedule, cfg.optim.max_grad_norm) == (1e-3, "constant", 1.0)
    assert (cfg.steps, cfg.model.name) == (7, f"hf:{model_dir}")
