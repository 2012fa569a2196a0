"""Read back what the trackers wrote, with each tool's own reader where it has one: TensorBoard's
`EventAccumulator`, `mlflow.MlflowClient`; W&B (0.31, whose core is in Go) ships no Python reader
of its `.wandb` files, so its records are read here: the file is a `:W&B` header and a LevelDB
log (32 KiB blocks, 7-byte record headers) of `wandb_internal_pb2.Record` protobufs, parsed with
wandb's own protobuf classes."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7  # checksum (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> list[Any]:
    """The `Record` protobufs of one `.wandb` file, in order."""
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    assert raw[:4] == b":W&B", raw[:8]
    records, pending, pos = [], b"", 7
    while pos + HEADER <= len(raw):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the block's tail is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + HEADER])
        if kind == 0 and length == 0:
            break
        data = raw[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, FIRST):
            pending = data
        else:
            pending += data
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """Every history row (one per logged step) of the offline runs under `run_dir`."""
    rows = []
    for path in sorted(run_dir.glob("**/run-*.wandb")):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "history":
                row = {}
                for item in record.history.item:
                    key = item.key or "/".join(item.nested_key)
                    row[key] = json.loads(item.value_json)
                rows.append(row)
    return rows


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} as TensorBoard's own reader sees the folder (after purges)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def tensorboard_texts(log_dir: Path) -> dict[str, list[tuple[int, str]]]:
    """{tag: [(step, text), ...]}: the text summaries (samples, config, events)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"tensors": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        out[tag] = [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]
    return out
