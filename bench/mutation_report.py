"""What `bench/mutation.py` prints: per module the counts and the kill rate, then every survivor
with the line it changed and the tests that ran that line without noticing, then the reviewed
equivalent mutants (apart: they are not counted), and a JSON record of every mutant."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.mutation_exec import ERROR, FLAKY, KILLED, NOT_COVERED, SURVIVED, TIMEOUT, Result
from bench.mutation_plan import Equivalent, Mutant


@dataclass
class ModuleRun:
    """One module's mutants: how many there were, what was left out, what happened to the rest."""

    module: str
    generated: int
    left_out: dict[str, int]
    equivalents: list[tuple[Mutant, Equivalent]]
    planned: int
    results: list[Result] = field(default_factory=list)

    def count(self, *outcomes: str) -> int:
        return sum(1 for r in self.results if r.outcome in outcomes)

    @property
    def detected(self) -> int:
        return self.count(KILLED, TIMEOUT)

    @property
    def scored(self) -> int:
        """Mutants the kill rate is over: all that ran to a verdict (errors are the tool's; a
        flaky kill is not a kill)."""
        return self.count(KILLED, TIMEOUT, SURVIVED, NOT_COVERED, FLAKY)


def rate(detected: int, scored: int) -> str:
    return f"{100 * detected / scored:5.1f}%" if scored else "    -"


def _reach(result: Result, reach: dict[str, list[str]]) -> str:
    tests = reach.get(result.mutant.key, [])
    if result.outcome == NOT_COVERED or not tests:
        return "no test runs this line"
    shown = ", ".join(t.split("::", 1)[-1] for t in tests[:3])
    more = f" and {len(tests) - 3} more" if len(tests) > 3 else ""
    files = sorted({t.split("::", 1)[0] for t in tests})
    return f"ran by {len(tests)} tests in {', '.join(files)} ({shown}{more}), none failed"


def print_group(
    name: str,
    runs: list[ModuleRun],
    reach: dict[str, list[str]],
    survivors: bool = True,
) -> None:
    """The group's table, then (with `survivors`) each survivor, then the timeouts, flaky kills
    and errors, then the reviewed equivalents."""
    header = (
        f"{'module':34} {'generated':>9} {'equiv':>5} {'run':>4} {'killed':>6} "
        f"{'timeout':>7} {'survived':>8} {'(uncov)':>7} {'flaky':>5} {'error':>5} "
        f"{'kill rate':>9}"
    )
    print(f"\n== {name} ==\n{header}")
    for run in runs:
        print(
            f"{run.module:34} {run.generated:9} {len(run.equivalents):5} {len(run.results):4} "
            f"{run.count(KILLED):6} {run.count(TIMEOUT):7} "
            f"{run.count(SURVIVED, NOT_COVERED):8} {run.count(NOT_COVERED):7} "
            f"{run.count(FLAKY):5} {run.count(ERROR):5} {rate(run.detected, run.scored):>9}"
        )
    alive = [r for run in runs for r in run.results if r.outcome in (SURVIVED, NOT_COVERED)]
    if alive and survivors:
        print("survivors:")
    for result in alive if survivors else []:
        m = result.mutant
        print(f"  {m.module}:{m.line}  {m.short_operator}  [{_reach(result, reach)}]")
        print(f"      - {m.code}\n      + {m.mutated}")
    others = [r for run in runs for r in run.results if r.outcome in (TIMEOUT, FLAKY, ERROR)]
    for result in others:
        m = result.mutant
        by = f" ({result.killer})" if result.killer else ""
        detail = result.detail
        if result.outcome == FLAKY:
            detail = detail.split("\n", 1)[0]  # its first run's output: in the --json
        detail = detail[:300]
        print(f"  {result.outcome}{by}: {m.module}:{m.line} {m.short_operator}: {detail}")
        print(f"      - {m.code}\n      + {m.mutated}")
    equivalents = [pair for run in runs for pair in run.equivalents]
    if equivalents:
        print("equivalent (reviewed in bench/mutation.toml, not counted):")
    for mutant, entry in equivalents:
        print(f"  {mutant.module}:{mutant.line}  {mutant.short_operator}: {entry.reason}")
        print(f"      - {mutant.code}\n      + {mutant.mutated}")


def print_total(runs: list[ModuleRun]) -> tuple[int, int]:
    detected = sum(r.detected for r in runs)
    scored = sum(r.scored for r in runs)
    outcomes = Counter(res.outcome for run in runs for res in run.results)
    planned = sum(r.planned for r in runs)
    not_run = planned - sum(len(r.results) for r in runs)
    counts = ", ".join(
        f"{outcomes[o]} {o}" for o in (KILLED, TIMEOUT, SURVIVED, NOT_COVERED, FLAKY)
    )
    extra = f", {outcomes[ERROR]} error" if outcomes[ERROR] else ""
    extra += f", {not_run} not run (budget)" if not_run else ""
    print(f"\ntotal: {scored} mutants scored: {counts}{extra}; kill rate {rate(detected, scored)}")
    return detected, scored


def write_json(path: Path, runs: list[ModuleRun], meta: dict[str, Any]) -> None:
    def result(r: Result) -> dict[str, Any]:
        m = r.mutant
        return {
            "module": m.module,
            "line": m.line,
            "col": m.col,
            "operator": m.short_operator,
            "occurrence": m.occurrence,
            "code": m.code,
            "mutated": m.mutated,
            "outcome": r.outcome,
            "seconds": round(r.seconds, 2),
            "tests": r.tests,
            "killer": r.killer,
            "detail": r.detail,
        }

    modules = [
        {
            "module": run.module,
            "generated": run.generated,
            "left_out": run.left_out,
            "equivalent": len(run.equivalents),
            "killed": run.count(KILLED),
            "timeout": run.count(TIMEOUT),
            "survived": run.count(SURVIVED, NOT_COVERED),
            "not_covered": run.count(NOT_COVERED),
            "flaky": run.count(FLAKY),
            "error": run.count(ERROR),
            "results": [result(r) for r in run.results],
        }
        for run in runs
    ]
    partial = path.with_name(path.name + ".partial")  # a reader never sees half a file
    partial.write_text(json.dumps({**meta, "modules": modules}, indent=1))
    partial.replace(path)
