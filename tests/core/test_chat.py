"""Chat records: turns rendered with the model's chat template (hf:), or the built-in model's
`role: content` layout, and the supervised warm-up on a dataset's answers.

Expected ids are spelled out by hand from the vocabulary (one token per character, special
tokens whole), not computed by the template engine under test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest

from core.config import TaskConfig, TrainConfig
from core.models.base import encode_example
from core.models.hf import NO_CHAT_TEMPLATE, HFTokenizer
from core.models.local_hf import (
    CHAT_HEADERS,
    CHAT_SPECIALS,
    PRINTABLE,
    char_tokenizer,
    make_chat_hf,
    make_tiny_hf,
)
from core.models.tiny import BOS, ByteTokenizer
from core.tasks.base import Example
from core.training.trainer import TrainerCallback, train

TURNS = (
    {"role": "system", "content": "Reply with a number."},
    {"role": "user", "content": "What is 17 + 25?"},
)

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_chat_hf(tmp_path_factory.mktemp("chat-llama"))


@pytest.fixture(scope="module")
def chat_tok(chat_dir: Path) -> HFTokenizer:
    from transformers import AutoTokenizer

    return HFTokenizer(AutoTokenizer.from_pretrained(str(chat_dir)))


def _spell(vocab: dict[str, int], *parts: str) -> list[int]:
    """Ids of `parts`: a part that is a token is one id, any other is one id per character."""
    ids: list[int] = []
    for part in parts:
        ids.extend([vocab[part]] if part in vocab else [vocab[c] for c in part])
    return ids


def test_llama3_chat_ids_spelled_by_hand(chat_tok: HFTokenizer) -> None:
    vocab = {t: i for i, t in enumerate([*CHAT_SPECIALS, *CHAT_HEADERS, *PRINTABLE])}
    assert vocab["<|begin_of_text|>"] == 1 and vocab["<|eot_id|>"] == 2
    start, end, eot = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
    want = _spell(
        vocab,
        "<|begin_of_text|>",
        *(start, "system", end, "\n\n", "Reply with a number.", eot),
        *(start, "user", end, "\n\n", "What is 17 + 25?", eot),
        *(start, "assistant", end, "\n\n"),  # the generation prompt: the reply starts here
    )
    got = chat_tok.encode_chat(TURNS)
    assert got == want
    assert got.count(vocab["<|begin_of_text|>"]) == 1  # the template's BOS, none added on top
    assert chat_tok.eos_id == vocab["<|eot_id|>"] and chat_tok.pad_id == vocab["<|pad|>"]
    # what transformers itself renders for the saved tokenizer, reloaded from disk
    ref = chat_tok.tok.apply_chat_template(list(TURNS), add_generation_prompt=True)
    assert got == list(ref["input_ids"])


def test_chatml_template_and_a_user_turn_alone() -> None:
    """encode_chat follows whatever template the tokenizer carries, not a Llama layout."""
    specials = ("<pad>", "<s>", "<|im_end|>", "<unk>")
    tok = HFTokenizer(
        char_tokenizer(specials, PRINTABLE, extra_specials=("<|im_start|>",), chat_template=CHATML)
    )
    vocab = {t: i for i, t in enumerate([*specials, "<|im_start|>", *PRINTABLE])}
    want = _spell(
        vocab,
        *("<|im_start|>", "user\nWhat is 2 + 2?", "<|im_end|>", "\n"),
        *("<|im_start|>", "assistant\n"),
    )
    assert tok.encode_chat([{"role": "user", "content": "What is 2 + 2?"}]) == want
    ref = tok.tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True
    )
    assert want == list(ref["input_ids"])


def test_completion_decodes_without_the_end_of_turn(chat_tok: HFTokenizer) -> None:
    completion = [*chat_tok.encode("42"), chat_tok.eos_id]
    assert completion == [PRINTABLE.index("4") + 6, PRINTABLE.index("2") + 6, 2]
    assert chat_tok.decode(completion) == "42"
    # plain-text prompts of the same model start with its BOS, as Llama's do
    assert chat_tok.encode_prompt("1+1=")[0] == 1 and chat_tok.encode("1+1=")[0] != 1


def test_model_without_a_chat_template_is_a_clear_error(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = HFTokenizer(AutoTokenizer.from_pretrained(str(make_tiny_hf(tmp_path / "m"))))
    assert not tok.has_chat_template
    with pytest.raises(ValueError, match="no chat template") as err:
        tok.encode_chat(TURNS)
    assert str(err.value) == NO_CHAT_TEMPLATE
    assert tok.encode_prompt("1+1=") == [PRINTABLE.index(c) + 3 for c in "1+1="]


def test_template_that_refuses_the_messages_is_a_value_error() -> None:
    refusing = (
        "{% if messages[0]['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}x"
    )
    tok = HFTokenizer(char_tokenizer(("<pad>", "<s>", "</s>", "<unk>"), PRINTABLE,
                                     chat_template=refusing))  # fmt: skip
    with pytest.raises(ValueError, match="cannot render these messages: System role"):
        tok.encode_chat(TURNS)
    assert tok.encode_chat(TURNS[1:]) == [PRINTABLE.index("x") + 4]


def test_byte_tokenizer_lays_turns_out_as_role_colon_content() -> None:
    tok = ByteTokenizer()
    text = "system: Reply with a number.\nuser: What is 17 + 25?\nassistant: "
    assert tok.encode_chat(TURNS) == [BOS, *(b + 4 for b in text.encode())]
    assert tok.decode(tok.encode_chat(TURNS)) == text


def test_encode_example_uses_the_turns_when_there_are_some(chat_tok: HFTokenizer) -> None:
    chat = Example("What is 17 + 25?", "42", messages=TURNS)
    text = Example("What is 17 + 25?", "42")
    assert encode_example(chat_tok, chat) == chat_tok.encode_chat(TURNS)
    assert encode_example(chat_tok, text) == chat_tok.encode_prompt("What is 17 + 25?")
    byte = ByteTokenizer()
    assert encode_example(byte, chat) == byte.encode_chat(TURNS)
    assert encode_example(byte, text) == byte.encode_prompt("What is 17 + 25?")


def test_chat_model_shape_suits_vllm_cpu_kernels(chat_dir: Path) -> None:
    import json

    cfg: dict[str, Any] = json.loads((chat_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 64
    assert cfg["vocab_size"] == len(CHAT_SPECIALS) + len(CHAT_HEADERS) + len(PRINTABLE) == 102
    assert cfg["eos_token_id"] == 2 and cfg["bos_token_id"] == 1 and cfg["pad_token_id"] == 0


# -- config: which warm-ups a dataset allows ------------------------------------------------


def test_jsonl_warmup_on_answers_is_allowed_format_is_not() -> None:
    ok = TaskConfig(name="jsonl", path="/d.jsonl", warmup_steps=5, warmup_target="answer")
    assert ok.warmup_steps == 5
    with pytest.raises(ValueError, match=r"warmup_target='format': a dataset has no answer shape"):
        TaskConfig(name="jsonl", path="/d.jsonl", warmup_steps=5)
    assert TaskConfig(name="jsonl", path="/d.jsonl", warmup_target="format").warmup_steps == 0


# -- the trainer: chat datasets on hf: models -----------------------------------------------


def _chat_dataset(path: Path, rows: list[tuple[str, str | None]]) -> Path:
    records = []
    for question, answer in rows:
        rec: dict[str, Any] = {"messages": [TURNS[0], {"role": "user", "content": question}]}
        if answer is not None:
            rec["answer"] = answer
        records.append(json.dumps(rec))
    path.write_text("\n".join(records) + "\n")
    return path


def _chat_config(model: Path, data: Path, **task: Any) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": {"name": f"hf:{model}"},
            "task": {"name": "jsonl", "path": str(data), "match": "numeric", **task},
            "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 3},
            "steps": 1,
            "checkpoint_every": 0,
            "device": "cpu",
        }
    )


def test_answer_warmup_teaches_the_chat_answers_and_where_to_stop(
    chat_dir: Path, tmp_path: Path
) -> None:
    """After the warm-up, greedy decoding of each chat prompt (rendered by the template, as
    the rollout renders it) gives exactly the record's answer, then EOS."""
    from core.rollout import generate
    from core.training.trainer import TrainingRun as _Run

    qa = [("What is 1 + 2?", "3"), ("What is 9 - 4?", "5"), ("What is 7 + 7?", "14")]
    data = _chat_dataset(tmp_path / "d.jsonl", list(qa))
    cfg = _chat_config(
        chat_dir,
        data,
        warmup_steps=150,
        warmup_target="answer",
        warmup_batch_size=6,
        warmup_lr=1e-3,
    )
    run = _Run(cfg, tmp_path / "run", TrainerCallback())
    tok = run.lm.tokenizer
    prompts = [encode_example(tok, e) for e in run.task.examples]  # type: ignore[attr-defined]

    def greedy() -> list[str]:
        out = generate(run.lm, prompts, max_new_tokens=3, top_k=5, greedy=True)
        return [tok.decode(c) for c in out.completions]

    assert greedy() != [a for _, a in qa]  # random weights know nothing
    assert run.warmup()
    assert greedy() == [a for _, a in qa]


def test_answer_warmup_names_a_record_without_answer(chat_dir: Path, tmp_path: Path) -> None:
    data = _chat_dataset(tmp_path / "d.jsonl", [("What is 1 + 2?", "3"), ("Hi?", None)])
    cfg = _chat_config(
        chat_dir,
        data,
        grader={"type": "length_penalty", "max_chars": 4},  # reads no field: no answer needed
        warmup_steps=5,
        warmup_target="answer",
    )
    with pytest.raises(ValueError, match=r"record has none: .*Hi\?"):
        train(cfg, tmp_path / "run")


def test_chat_dataset_on_a_model_without_template_fails_at_load(tmp_path: Path) -> None:
    """The error comes when the run is set up: before the (long) warm-up, not at step 1."""
    model = make_tiny_hf(tmp_path / "plain")
    data = _chat_dataset(tmp_path / "d.jsonl", [("What is 1 + 2?", "3")])
    cfg = _chat_config(model, data, warmup_steps=100_000, warmup_target="answer")

    class Logs(TrainerCallback):
        lines: ClassVar[list[str]] = []

        def on_log(self, message: str) -> None:
            self.lines.append(message)

    logs = Logs()
    with pytest.raises(ValueError, match="no chat template"):
        train(cfg, tmp_path / "run", callback=logs)
    assert logs.lines == [] and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_chat_run_trains_two_steps_and_grades_the_decoded_replies(
    chat_dir: Path, tmp_path: Path
) -> None:
    data = _chat_dataset(tmp_path / "d.jsonl", [("What is 1 + 2?", "3"), ("What is 2 + 2?", "4")])
    cfg = _chat_config(chat_dir, data, warmup_steps=30, warmup_target="answer")
    cfg.steps = 2
    result = train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert result.step == 2 and [r["step"] for r in rows] == [1, 2]
    # after the warm-up the sampled replies are mostly the answers: rewards are not all 0
    assert max(r["reward_mean"] for r in rows) > 0


def test_warmup_targets_are_cut_to_a_rollouts_length(tmp_path: Path) -> None:
    """An answer longer than rollout.max_new_tokens is trained on its first tokens only: the
    whole of it would not fit the built-in model's 96 positions."""
    data = _chat_dataset(tmp_path / "d.jsonl", [("Spell it.", "x" * 200)])
    cfg = TrainConfig.model_validate(
        {
            "model": {"tiny": {"d_model": 16, "n_layers": 1, "n_heads": 2, "max_seq_len": 96}},
            "task": {"name": "jsonl", "path": str(data), "warmup_steps": 2,
                     "warmup_target": "answer", "warmup_batch_size": 2},
            "rollout": {"prompts_per_step": 1, "group_size": 2, "max_new_tokens": 4},
            "steps": 1,
            "checkpoint_every": 0,
            "device": "cpu",
        }
    )  # fmt: skip
    assert train(cfg, tmp_path / "run").step == 1
