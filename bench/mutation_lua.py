"""Mutants of the Lua scripts a module embeds as string constants (`bench/mutation.py`, a group
with `lua = true`).

The store's state transitions live in Lua bodies held in Python strings (`pdppo.store.*`,
`workers/job/lease.py`), where cosmic-ray sees one constant and nothing to mutate: a hand-made bug
in a transition passed the whole suite. Here a Lua body is found in the Python source (every string
literal of a logical line where one of them calls `redis.call(`, docstrings aside), lexed as Lua
(its own strings and comments skipped), and changed in the source text itself, so a mutant is the
Python module with one Lua body changed, applied and put back like any other.

Operators, named like cosmic-ray's so that `[[equivalent]]` entries and rules work for them:
`==`/`~=` swapped, `<`/`<=` and `>`/`>=` shifted, `and`/`or` swapped, a `not` dropped, a
`return ...` removed where its block is an `if` (an early exit skipped: the script falls
through), and a number changed (1 becomes 0, so `return 1` becomes `return 0`; any other n
becomes n + 1). Numbers used as a subscript (`KEYS[2]`, `ARGV[5]`) are left out: a script that
reads the wrong key or argument fails every test that runs it, and they are a third of the
numbers.

Which tests reach a mutant: coverage sees Python lines, not the Lua in a string. A script runs
where the module calls what `register_script` made of it (`self._claim = client.register_script(
_CLAIM)`, then `self._claim(...)`), or of a constant built from it (`_FINISH = COUNT_END +
_FINISH`, `_PUBLISH_STEP = _fenced(_PUBLISH_STEP, ...)`): those call lines are a Lua mutant's
`anchors`, and it runs the tests that ran one of them. A body the module never registers itself
(`stats.COUNT_END`, which other modules' scripts include) is anchored at the statement holding
it, run at import: the tests that import the module. Callers in the group's other modules are
followed too (`calls_in`: the `_FINISH` that `AsyncJobStore.fail` registers from `from
pdppo.store.jobs.worker_side import _FINISH`): a mutant's `foreign` anchors, (module, line) pairs,
whose tests it runs as well. Callers outside the group are not (the baseline measures the
group's modules only), so a mutant may run fewer tests than reach it (a lower kill rate, never
a higher one).
"""

from __future__ import annotations

import ast
import contextlib
import fnmatch
import io
import re
import tokenize
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

PROVIDER = "lua"
"""The provider part of a Lua operator's full name (`lua/Lua_Eq_NotEq`), as cosmic-ray's are
`core/...`: `Mutant.short_operator` drops it alike."""

_STRING_PREFIX = re.compile(r"[rRbBuUfF]*")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?")
_NAME = re.compile(r"[A-Za-z_]\w*")
_LONG_BRACKET = re.compile(r"\[(=*)\[")
_TWO_CHAR = ("==", "~=", "<=", ">=", "..", "::", "//")
KEYWORDS = frozenset(
    {
        *("and", "break", "do", "else", "elseif", "end", "false", "for", "function", "goto"),
        *("if", "in", "local", "nil", "not", "or", "repeat", "return", "then", "true", "until"),
        "while",
    }
)


@dataclass(frozen=True)
class Token:
    kind: str  # name, keyword, number, op, str
    text: str
    start: int  # offsets in the Python source
    end: int
    region: int  # which string literal it is in


@dataclass(frozen=True)
class Site:
    """One place an operator changes: source[start:end] becomes `replacement`."""

    operator: str  # full name, lua/...
    start: int
    end: int
    replacement: str
    anchors: tuple[int, ...]  # the lines whose coverage says which tests reach it


def _lex(text: str, base: int, region: int) -> list[Token]:
    """Lua tokens of `text` (found at offset `base` of the source); strings and comments are
    skipped as units, anything unknown (a Python `{name}` of an f-string, a backslash) is one
    `op` character."""
    out: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c.isspace():
            i += 1
            continue
        if text.startswith("--", i):
            long = _LONG_BRACKET.match(text, i + 2)
            if long:
                close = text.find(f"]{long.group(1)}]", long.end())
                i = n if close < 0 else close + len(long.group(0))
            else:
                newline = text.find("\n", i)
                i = n if newline < 0 else newline
            continue
        if c in "'\"":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(Token("str", text[i : j + 1], base + i, base + j + 1, region))
            i = j + 1
            continue
        long = _LONG_BRACKET.match(text, i)
        if long:
            close = text.find(f"]{long.group(1)}]", long.end())
            j = n if close < 0 else close + len(long.group(0))
            out.append(Token("str", text[i:j], base + i, base + j, region))
            i = j
            continue
        number = _NUMBER.match(text, i) if c.isdigit() else None
        name = _NAME.match(text, i)
        if number:
            out.append(Token("number", number.group(0), base + i, base + number.end(), region))
            i = number.end()
        elif name:
            word = name.group(0)
            kind = "keyword" if word in KEYWORDS else "name"
            out.append(Token(kind, word, base + i, base + name.end(), region))
            i = name.end()
        else:
            width = 2 if text[i : i + 2] in _TWO_CHAR else 1
            out.append(Token("op", text[i : i + width], base + i, base + i + width, region))
            i += width
    return out


def _content(token: tokenize.TokenInfo) -> tuple[int, str]:
    """(offset of the literal's content within the token, the content): quotes and prefix off."""
    prefix = _STRING_PREFIX.match(token.string)
    skip = prefix.end() if prefix else 0
    quote = token.string[skip : skip + 3]
    width = 3 if quote in ('"""', "'''") else 1
    return skip + width, token.string[skip + width : len(token.string) - width]


def _statement_lines(source: str) -> list[tuple[int, int]]:
    """(first line, last line) of every statement, innermost last when nested."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt) and node.end_lineno is not None:
            spans.append((node.lineno, node.end_lineno))
    return spans


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _graph(tree: ast.Module) -> tuple[dict[str, tuple[int, int]], dict[str, set[str]]]:
    """(module-level name -> the line span of the statement or function defining it, name ->
    the names its value refers to)."""
    defined: dict[str, tuple[int, int]] = {}
    uses: dict[str, set[str]] = {}  # module-level name -> names its value refers to
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    span = (node.lineno, node.end_lineno or node.lineno)
                    defined.setdefault(target.id, span)
                    uses.setdefault(target.id, set()).update(_names(node.value))
        elif isinstance(node, ast.FunctionDef):
            defined[node.name] = (node.lineno, node.end_lineno or node.lineno)
    return defined, uses


def _calls_from(tree: ast.Module, uses: dict[str, set[str]], start: set[str]) -> tuple[int, ...]:
    """The first lines of the statements that call a script registered from the names `start`,
    directly or through the module-level constants built from them."""
    statements = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]

    def first_line(call: ast.Call) -> int:
        holding = [
            st.lineno
            for st in statements
            if st.lineno <= call.lineno <= (st.end_lineno or st.lineno)
            and not isinstance(st, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ]
        return max(holding) if holding else call.lineno

    reached, grown = set(start), True
    while grown:
        more = {t for t, refs in uses.items() if refs & reached} - reached
        reached |= more
        grown = bool(more)
    handles: set[str] = set()  # `self._claim` as "._claim", a local `add` as "add"
    for assign in ast.walk(tree):
        if not isinstance(assign, ast.Assign) or not isinstance(assign.value, ast.Call):
            continue
        func = assign.value.func
        registers = isinstance(func, ast.Attribute) and func.attr == "register_script"
        if registers and _names(assign.value) & reached:
            for target in assign.targets:
                if isinstance(target, ast.Attribute):
                    handles.add(f".{target.attr}")
                elif isinstance(target, ast.Name):
                    handles.add(target.id)
    lines = set()
    for call in ast.walk(tree):
        if isinstance(call, ast.Call):
            called = call.func
            key = f".{called.attr}" if isinstance(called, ast.Attribute) else None
            key = called.id if isinstance(called, ast.Name) else key
            if key in handles:
                lines.add(first_line(call))
    return tuple(sorted(lines))


def _call_lines(source: str) -> dict[tuple[int, int], tuple[int, ...]]:
    """For each module-level statement or function that defines something (its line span), the
    first lines of the statements that call a script registered from it, directly or through
    the constants built from it (see the module's docstring); empty when there is none."""
    tree = ast.parse(source)
    defined, uses = _graph(tree)
    return {span: _calls_from(tree, uses, {name}) for name, span in defined.items()}


def defining_names(source: str, line: int) -> frozenset[str]:
    """The module-level names whose defining statement or function holds `line` (`_FINISH` for
    a line of its body, `_fenced` for a line of the fence it builds)."""
    defined, _ = _graph(ast.parse(source))
    return frozenset(name for name, (first, last) in defined.items() if first <= line <= last)


def calls_in(importer: str, exporter: str, names: frozenset[str]) -> tuple[int, ...]:
    """The lines of the module source `importer` that run a script built from what it imports
    of `names` from the module `exporter` (dotted: `pdppo.store.jobs.worker_side`) by `from exporter
    import name [as alias]`: `AsyncJobStore.fail`'s call of the `_FINISH` it registers, the
    calls of `_CANCEL = COUNT_END + _CANCEL` for stats' `COUNT_END`. Other ways to reach a name
    (`import exporter`, a re-export) are not followed."""
    tree = ast.parse(importer)
    aliases = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == exporter and node.level == 0
        for alias in node.names
        if alias.name in names
    }
    if not aliases:
        return ()
    _, uses = _graph(tree)
    return _calls_from(tree, uses, aliases)


def lua_bodies(source: str) -> list[list[tuple[int, str]]]:
    """The Lua text of the module, one list per logical Python line that holds Lua: each a list
    of (source offset, content) of its string literals (a body split over several, as an
    implicit concatenation, stays one list)."""
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    found: list[list[tuple[int, str]]] = []
    logical: list[tokenize.TokenInfo] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if token.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT):
                logical.append(token)
            continue
        strings = [t for t in logical if t.type == tokenize.STRING]
        is_expression = bool(logical) and logical[0].type == tokenize.STRING  # a docstring
        if not is_expression and any("redis.call(" in t.string for t in strings):
            body = []
            for t in strings:
                skip, content = _content(t)
                body.append((starts[t.start[0] - 1] + t.start[1] + skip, content))
            found.append(body)
        logical = []
    return found


def _numbers(tokens: list[Token], index: int) -> str | None:
    token = tokens[index]
    before = tokens[index - 1].text if index > 0 else ""
    after = tokens[index + 1].text if index + 1 < len(tokens) else ""
    if before == "[" and after == "]":
        return None  # a subscript: see the module's docstring
    try:
        value = int(token.text, 0)
    except ValueError:
        return str(float(token.text) + 1)
    return "0" if value == 1 else str(value + 1)


def _early_returns(tokens: list[Token]) -> list[tuple[int, int]]:
    """(first, last) token index of each `return ...` whose innermost block is an `if`: up to
    the `end`, `else` or `elseif` that closes its block, in the same string literal."""
    found = []
    stack: list[str] = []
    loop_header = False
    for i, token in enumerate(tokens):
        if token.kind != "keyword":
            continue
        word = token.text
        if word == "if":
            stack.append("if")
        elif word == "function":
            stack.append("function")
        elif word in ("for", "while"):
            stack.append("loop")
            loop_header = True
        elif word == "do":
            if loop_header:
                loop_header = False
            else:
                stack.append("do")
        elif word == "repeat":
            stack.append("repeat")
        elif word in ("end", "until") and stack:
            stack.pop()
        elif word == "return" and stack and stack[-1] == "if":
            close = next(
                (
                    j
                    for j in range(i + 1, len(tokens))
                    if tokens[j].kind == "keyword" and tokens[j].text in ("end", "else", "elseif")
                ),
                None,
            )
            if close is not None and tokens[close].region == token.region:
                found.append((i, close - 1))
    return found


Rule = Callable[[list[Token], int], str | None]


def _swap(old: str, new: str) -> Rule:
    return lambda tokens, i: new if tokens[i].text == old and tokens[i].kind != "str" else None


# operator name -> rule; the Return rule is separate (it spans tokens)
OPERATORS: dict[str, Rule | None] = {
    "Lua_Eq_NotEq": _swap("==", "~="),
    "Lua_NotEq_Eq": _swap("~=", "=="),
    "Lua_Lt_LtE": _swap("<", "<="),
    "Lua_LtE_Lt": _swap("<=", "<"),
    "Lua_Gt_GtE": _swap(">", ">="),
    "Lua_GtE_Gt": _swap(">=", ">"),
    "Lua_And_Or": lambda t, i: "or" if t[i].kind == "keyword" and t[i].text == "and" else None,
    "Lua_Or_And": lambda t, i: "and" if t[i].kind == "keyword" and t[i].text == "or" else None,
    "Lua_Delete_Not": lambda t, i: "" if t[i].kind == "keyword" and t[i].text == "not" else None,
    "Lua_NumberReplacer": lambda t, i: _numbers(t, i) if t[i].kind == "number" else None,
    "Lua_Remove_EarlyReturn": None,
}


def sites(source: str, operators: list[str]) -> list[Site]:
    """Every change the named operators (short names) make to the module's Lua, in operator
    order, then source order within each: a site's index among its operator's is its
    occurrence."""
    if "redis.call(" not in source:  # no Lua body: spare the parses below
        return []
    spans = _statement_lines(source)
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))

    calls = _call_lines(source)

    def anchor(offset: int) -> tuple[int, ...]:
        line = next(n for n, start in enumerate(line_starts[1:], 1) if offset < start)
        for (first, last), lines in calls.items():
            if first <= line <= last and lines:
                return lines
        holding = [s for s in spans if s[0] <= line <= s[1]]
        return (max(holding)[0] if holding else line,)  # the innermost: it starts last

    bodies = []
    region = 0
    for body in lua_bodies(source):
        tokens: list[Token] = []
        for offset, content in body:
            tokens += _lex(content, offset, region)
            region += 1
        bodies.append(tokens)
    out = []
    for name in operators:
        rule = OPERATORS[name]
        for tokens in bodies:
            if rule is None:
                for first, last in _early_returns(tokens):
                    start, end = tokens[first].start, tokens[last].end
                    out.append(Site(f"{PROVIDER}/{name}", start, end, "", anchor(start)))
                continue
            for i, token in enumerate(tokens):
                replacement = rule(tokens, i)
                if replacement is None:
                    continue
                end = token.end
                if name == "Lua_Delete_Not":  # `not x` -> `x`, not ` x`
                    while end < len(source) and source[end] in " \t":
                        end += 1
                out.append(
                    Site(f"{PROVIDER}/{name}", token.start, end, replacement, anchor(token.start))
                )
    return out


def is_lua(operator: str) -> bool:
    return operator.startswith(f"{PROVIDER}/")


def short_names(patterns: tuple[str, ...]) -> list[str]:
    """The operators the config's patterns (fnmatch) select, in OPERATORS' order."""
    return [n for n in OPERATORS if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def mutate_source(source: str, operator: str, occurrence: int) -> str | None:
    """`source` with the `occurrence`-th site of `operator` (full name) changed, or None when it
    has no such site."""
    found = sites(source, [operator.split("/", 1)[1]])
    if occurrence >= len(found):
        return None
    site = found[occurrence]
    return source[: site.start] + site.replacement + source[site.end :]


@contextlib.contextmanager
def use_lua_mutation(
    path: Path, operator: str, occurrence: int
) -> Iterator[tuple[str, str | None]]:
    """Writes the mutant into `path` and yields (original, mutated source); the original is
    back when the block ends, whatever happens in it (as cosmic-ray's `use_mutation`)."""
    original = path.read_text()
    mutated = mutate_source(original, operator, occurrence)
    try:
        if mutated is not None:
            path.write_text(mutated)
        yield original, mutated
    finally:
        path.write_text(original)
