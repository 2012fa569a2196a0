"""Build the small chat model that `examples/chat_math.yaml` trains, on this machine (no download).

    python examples/build_chat_model.py            # -> examples/models/chat-llama

A random-weight `LlamaForCausalLM` (hidden 128, 2 heads of 64, 2 layers: 0.5M parameters) with a
character-level tokenizer and a Llama-3-like chat template, saved with `save_pretrained`
(`core.models.local_hf.make_chat_hf`). The spec names it `hf:./models/chat-llama`, a path
relative to the spec file; `pdppo dev` started from the repository root reads it, because its
data root is the folder it runs in. Building again with the same seed gives the same weights.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent / "models" / "chat-llama"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"model folder (default {DEFAULT_OUT})"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)

    import transformers

    from core.models.local_hf import make_chat_hf

    transformers.logging.disable_progress_bar()
    path = make_chat_hf(args.out, seed=args.seed)
    print(f"chat model saved to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
