"""Graders from their configs, and `multi`, the weighted mean of named sub-graders."""

from __future__ import annotations

from core.config.graders import (
    GraderConfig,
    JsonSchemaGrader,
    LengthPenaltyGrader,
    MathGrader,
    MultiGrader,
    NumericGrader,
    OpenAIGrader,
    PluginGrader,
    RegexGrader,
    StringCheckGrader,
)
from core.graders.base import Grader, Record, Scored
from core.graders.numbers import Math, Numeric
from core.graders.openai import build_openai
from core.graders.options import GraderOptions
from core.graders.plugins import Plugin
from core.graders.schema import JsonSchema
from core.graders.text import LengthPenalty, Regex, StringCheck


def build_grader(
    cfg: GraderConfig,
    where: str = "task.grader",
    *,
    load_plugins: bool = False,
    options: GraderOptions | None = None,
) -> Grader:
    """The grader `cfg` declares; a ValueError naming the spec field (`where`) when it cannot
    be built here: a plugin that is not installed, a grader the operator has not allowed (a
    pattern, schema, template, formula or code that does not compile never validated).
    Plugins are only imported with `load_plugins` (the grading server does that; the
    trainer's process only checks their names), and so is a python grader's code. `options`:
    what the operator lets OpenAI graders do (None: no python, no score_model)."""
    if isinstance(cfg, StringCheckGrader):
        return StringCheck(cfg)
    if isinstance(cfg, RegexGrader):
        return Regex(cfg)
    if isinstance(cfg, NumericGrader):
        return Numeric(cfg)
    if isinstance(cfg, MathGrader):
        return Math(cfg, where)
    if isinstance(cfg, JsonSchemaGrader):
        return JsonSchema(cfg, where)
    if isinstance(cfg, LengthPenaltyGrader):
        return LengthPenalty(cfg)
    if isinstance(cfg, PluginGrader):
        return Plugin(cfg, where, load=load_plugins)
    if isinstance(cfg, MultiGrader):
        return Multi(cfg, where, load_plugins=load_plugins, options=options)
    if isinstance(cfg, OpenAIGrader):
        return build_openai(cfg.grader, f"{where}.grader", options, load=load_plugins)
    raise TypeError(f"{where}: unknown grader config {type(cfg).__name__}")


class Multi(Grader):
    """sum(w * s) / sum(w) over the sub-graders (none of them a `multi`: the config says so);
    every sub-score is a part, reported as the metric `grader/<name>` whatever its weight, so a
    weight of 0 watches a grader without rewarding it."""

    def __init__(
        self,
        cfg: MultiGrader,
        where: str,
        *,
        load_plugins: bool,
        options: GraderOptions | None = None,
    ) -> None:
        self.graders = {
            name: build_grader(
                sub, f"{where}.graders.{name}", load_plugins=load_plugins, options=options
            )
            for name, sub in cfg.graders.items()
        }
        self.weights = {name: cfg.weights.get(name, 1.0) for name in cfg.graders}
        self.total = sum(self.weights.values())  # > 0: the config checks it
        self.isolated = any(g.isolated for g in self.graders.values())

    def check(self, record: Record) -> None:
        for grader in self.graders.values():
            grader.check(record)

    def grade(self, completion: str, record: Record) -> Scored:
        parts: dict[str, float] = {}
        total = 0.0
        for name, grader in self.graders.items():
            parts[name] = value = grader.score(completion, record)
            total += self.weights[name] * value
        return Scored(min(1.0, max(0.0, total / self.total)), parts)

    def score(self, completion: str, record: Record) -> float:
        return self.grade(completion, record).value
