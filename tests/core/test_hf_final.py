"""A job's final model is used without pdppo: an `hf:` job's final/ loads with transformers'
`AutoModelForCausalLM` and `AutoTokenizer`, a LoRA job's final/adapter/ with PEFT on its base,
and each computes the logits the trained policy computed (the trainer's own model, taken at the
moment it is saved); a `builtin:tiny` final/ says in a README.md that it is none of those.

Measured on CPU float32 (this file's runs): the full model reloaded, and the adapter applied
by PEFT (`PeftModel` and `AutoPeftModelForCausalLM`), give the trainer's logits exactly (max
|difference| 0); the merged model differs from the adapter on its base by at most 2.4e-7
(merging rounds W + BA once). TOLERANCE is 1e-5.
tests/vllm/test_vllm_final.py loads the same folders with vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from core.config import ModelConfig
from core.models import load_model
from core.models.hf import HFLM
from core.models.hf_final import ADAPTER_DIR, adapter_only_base
from core.models.local_hf import make_chat_hf
from core.models.tiny import TINY_README, TinyLM
from tests.core.hf_runs import SHAPE, prompt_ids, train_hf, trainer_logits

TOLERANCE = 1e-5

MODEL_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
}
TOKENIZER_FILES = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
ADAPTER_FILES = {"adapter_config.json", "adapter_model.safetensors", "README.md"} | TOKENIZER_FILES
"""PEFT writes a model card (README.md) of its own."""


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def hf_logits(model: Any, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


def assert_logits(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got, want, atol=TOLERANCE, rtol=0)


def files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_a_full_job_saves_a_standard_folder_that_transformers_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Protects `HFLM.save_final` for a full fine-tune: weights, config, generation config and
    the base's tokenizer with its chat template, loaded by the Auto classes alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, final, trained, ids = train_hf(tmp_path, monkeypatch, lora=False)

    assert files(final) == MODEL_FILES
    model = AutoModelForCausalLM.from_pretrained(str(final))
    assert_logits(hf_logits(model, ids), trained)
    tok = AutoTokenizer.from_pretrained(str(final))
    assert tok.chat_template == AutoTokenizer.from_pretrained(str(base)).chat_template
    assert prompt_ids(tok).tolist() == ids.tolist()
    assert model.generation_config.eos_token_id == tok.eos_token_id == 2  # <|eot_id|>


def test_a_lora_job_saves_the_peft_adapter_beside_the_merged_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Protects the LoRA layout (`core.models.hf_final`): final/adapter/ is PEFT's format and,
    on the base, is the trained policy; final/ is the same policy merged, for transformers
    and for a later `job:<id>`."""
    from peft import AutoPeftModelForCausalLM, PeftModel
    from transformers import AutoModelForCausalLM

    base, final, trained, ids = train_hf(tmp_path, monkeypatch, lora=True)

    assert files(final) == MODEL_FILES | {ADAPTER_DIR}
    assert files(final / ADAPTER_DIR) == ADAPTER_FILES
    on_base = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(base)), str(final / ADAPTER_DIR)
    )
    adapter_logits = hf_logits(on_base, ids)
    assert_logits(adapter_logits, trained)
    auto = AutoPeftModelForCausalLM.from_pretrained(str(final / ADAPTER_DIR))
    assert_logits(hf_logits(auto, ids), trained)
    merged = hf_logits(AutoModelForCausalLM.from_pretrained(str(final)), ids)
    assert_logits(merged, adapter_logits)
    as_job = load_model(ModelConfig(name="job:earlier"), torch.device("cpu"), model_dir=final)
    assert isinstance(as_job, HFLM)
    assert_logits(trainer_logits(as_job, ids), trained)


def test_without_save_merged_a_later_job_applies_the_adapter_to_its_base(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Protects `save_merged: false` and `job:<id>` chaining from it (`adapter_only_base`):
    no merged copy is written, and the loader puts the adapter on the base it names."""
    _, final, trained, ids = train_hf(tmp_path, monkeypatch, lora=True, save_merged=False)

    assert files(final) == {ADAPTER_DIR}
    assert files(final / ADAPTER_DIR) == ADAPTER_FILES
    as_job = load_model(ModelConfig(name="job:earlier"), torch.device("cpu"), model_dir=final)
    assert isinstance(as_job, HFLM) and not as_job.lora
    assert_logits(trainer_logits(as_job, ids), trained)
    assert as_job.hf_tokenizer.has_chat_template


def test_a_gathered_state_saves_the_same_standard_folder(tmp_path: Path) -> None:
    """Protects `HFLM.save_final_state` (sharded runs save the gathered weights this way): the
    folder has the tokenizer and generation config too, not only the weights."""
    from transformers import AutoModelForCausalLM

    base = make_chat_hf(tmp_path / "base", shape=SHAPE)
    lm = HFLM(ModelConfig(name=f"hf:{base}"))
    # the state, not the module (a shard of it, in a sharded run), is what is saved: an output
    # projection twice the module's gives twice its logits
    state = {k: v.clone() for k, v in lm.module.state_dict().items()}
    state["lm_head.weight"] *= 2.0
    ids = torch.tensor([[1, 5, 6, 7]])

    lm.save_final_state(tmp_path / "final", state)

    assert files(tmp_path / "final") == MODEL_FILES
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"))
    assert_logits(hf_logits(reloaded, ids), 2.0 * trainer_logits(lm, ids))


def test_a_tiny_final_model_says_it_is_not_a_hugging_face_model(tmp_path: Path) -> None:
    """Protects the README.md of a `builtin:tiny` final/: transformers' own refusal names
    only a missing `model_type`, so the folder itself says what it is and how to load it."""
    from transformers import AutoModelForCausalLM

    from core.config.model import TinyModelConfig

    TinyLM(TinyModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=32)).save_final(
        tmp_path / "final"
    )

    readme = (tmp_path / "final" / "README.md").read_text()
    assert readme == TINY_README
    assert "not a Hugging Face model" in readme and "load_tiny_final" in readme
    with pytest.raises(ValueError, match="model_type"):
        AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"))


def test_a_base_without_a_generation_config_gives_a_final_model_with_one(tmp_path: Path) -> None:
    """Protects the generation_config.json of every final folder (vLLM and `pipeline` take EOS
    and pad from it): `save_pretrained` writes the one a base without any implies."""
    base = make_chat_hf(tmp_path / "base", shape=SHAPE)
    (base / "generation_config.json").unlink()

    HFLM(ModelConfig(name=f"hf:{base}")).save_final(tmp_path / "final")

    assert files(tmp_path / "final") == MODEL_FILES
    written = json.loads((tmp_path / "final" / "generation_config.json").read_text())
    assert (written["bos_token_id"], written["eos_token_id"], written["pad_token_id"]) == (1, 2, 0)


@pytest.mark.parametrize("base", ["", 5, None, ["base"]])
def test_an_adapter_config_that_names_no_base_is_refused(tmp_path: Path, base: Any) -> None:
    """`job:<id>` of an adapter-only final model loads the base its adapter_config.json names:
    an empty name, a number or a list is no base (it would be handed to from_pretrained), and
    is refused as surely as a missing one."""
    (tmp_path / ADAPTER_DIR).mkdir()
    meta = {} if base is None else {"base_model_name_or_path": base}
    (tmp_path / ADAPTER_DIR / "adapter_config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="names no base model"):
        adapter_only_base(tmp_path)


def test_an_adapter_config_names_its_base(tmp_path: Path) -> None:
    (tmp_path / ADAPTER_DIR).mkdir()
    meta = {"base_model_name_or_path": "/models/base", "r": 8}
    (tmp_path / ADAPTER_DIR / "adapter_config.json").write_text(json.dumps(meta))
    assert adapter_only_base(tmp_path) == "/models/base"
    (tmp_path / "config.json").write_text("{}")  # a whole model beside it: not adapter-only
    assert adapter_only_base(tmp_path) is None
