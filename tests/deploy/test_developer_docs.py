"""The developer pages hold to the tree: every design citation in the code names a section of
docs/developers/design.md that exists, every module those pages name exists, and the module
tables of architecture.md are generated from the tree (docs/hooks.py).

Modules move: when one does, these fail naming the page or file and the stale name, which is
what whoever merges the move must update. No MkDocs needed (README's suite runs them);
tests/docs checks the cited anchors again in the built site, where MkDocs made them.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DESIGN = Path("docs/developers/design.md")
# Where citations may be: the code, its tests and tooling, the docs, the deployment
SCANNED = ("api", "workers", "core", "pdppo", "bench", "tests", "deploy", "examples", ".ci", "docs")
SCANNED_FILES = ("README.md", "mkdocs.yml", "pyproject.toml")
TEXT_SUFFIXES = {".py", ".lua", ".md", ".sh", ".yml", ".yaml", ".toml", ".txt", ".cfg", ""}
SKIPPED_DIRS = {".venv", "__pycache__", "node_modules", "site", ".git", "static"}
CITATION = re.compile(r"design\.md#([A-Za-z0-9_-]*)")
# The forms that cited the design notes kept outside the repository: none may remain. Built
# from parts so that this file does not match itself.
OLD_FORMS = re.compile("|".join(("DESIGN" + r"(?:\.md)?\s*§", "DESIGN" + r"(?:\.md|'s)")))
TOPS = ("core", "api", "workers", "pdppo")
# A path of the tree, or a dotted module (and maybe a name in it), in backticks
NAMED_PATH = re.compile(
    r"`((?:core|api|workers|pdppo|tests|bench|deploy|docs|examples|\.ci)/[^`\s]*)`"
)
NAMED_MODULE = re.compile(r"`((?:core|api|workers|pdppo)(?:\.[A-Za-z_]\w*)+)`")
# Dotted names are modules only on the developer pages: elsewhere `pdppo.graders` is an entry-point
# group and `pdppo.job` a tracker's tag
NAMED_MODULE_PAGES = ("docs/developers",)
# Named by the docs but made by the operator, not shipped: compose's settings, from .env.example
NOT_SHIPPED = {"deploy/.env"}


@dataclass(frozen=True)
class Found:
    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs' toc makes it (Python-Markdown's default `slugify`), or the
    id an attr_list `{ #id }` gives it."""
    custom = re.search(r"\{\s*#([\w-]+)[^}]*\}\s*$", heading)
    if custom:
        return custom.group(1)
    text = heading.replace("`", "")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(markdown: str) -> list[str]:
    """The anchor of every heading of a page, in order (headings in fenced code are none)."""
    found: list[str] = []
    fenced = False
    for line in markdown.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.+?)\s*$", line)):
            found.append(slug(m.group(1)))
    return found


def scanned_files(root: Path) -> list[Path]:
    files = [root / name for name in SCANNED_FILES if (root / name).is_file()]
    for top in SCANNED:
        for path in sorted((root / top).rglob("*")):
            parts = set(path.relative_to(root).parts)
            if path.is_file() and path.suffix in TEXT_SUFFIXES and not parts & SKIPPED_DIRS:
                files.append(path)
    return files


def _lines(root: Path, pattern: re.Pattern[str]) -> list[tuple[Found, re.Match[str]]]:
    hits = []
    for path in scanned_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for m in pattern.finditer(line):
                where = Found(path.relative_to(root).as_posix(), number, m.group(0))
                hits.append((where, m))
    return hits


def broken_citations(root: Path) -> list[str]:
    """Every citation of the design page whose section is not on it, and every citation in an
    old form, as `file:line: text`."""
    design = root / DESIGN
    known = set(anchors(design.read_text(encoding="utf-8"))) if design.is_file() else set()
    broken = [str(where) for where, m in _lines(root, CITATION) if m.group(1) not in known]
    old = [f"{where} (old form)" for where, _ in _lines(root, OLD_FORMS)]
    return sorted(broken + old)


def _defined(tree: ast.Module | ast.ClassDef) -> dict[str, ast.AST]:
    """The names a module (or a class body) defines or imports."""
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
    return names


def module_exists(root: Path, dotted: str) -> bool:
    """Whether `a.b.c` (or `a.b.c.Name`, `a.b.c.Class.attr`) is a module of the tree, or a name
    that its longest module prefix defines."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:i])
        source = (
            base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        )
        if not source.is_file():
            continue
        rest = parts[i:]
        scope: ast.Module | ast.ClassDef = ast.parse(source.read_text(encoding="utf-8"))
        for name in rest:
            node = _defined(scope).get(name)
            if node is None:
                return False
            if not isinstance(node, ast.ClassDef):
                return True  # a function's or a value's attributes are not followed
            scope = node
        return True
    return False


def stale_names(root: Path, pages: list[Path]) -> list[str]:
    """Every path of the tree and every dotted module a page names that is not there."""
    stale = []
    for page in pages:
        rel = page.relative_to(root).as_posix()
        dotted = any(rel.startswith(prefix) for prefix in NAMED_MODULE_PAGES)
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for m in NAMED_PATH.finditer(line):
                path = m.group(1).split("#")[0].rstrip("/")
                there = any(root.glob(path)) if "*" in path else (root / path).exists()
                if path not in NOT_SHIPPED and not there:
                    stale.append(f"{rel}:{number}: {m.group(1)}")
            for m in NAMED_MODULE.finditer(line) if dotted else ():
                if not module_exists(root, m.group(1)):
                    stale.append(f"{rel}:{number}: {m.group(1)}")
    return stale


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_design_citation_names_a_section_of_the_design_page() -> None:
    assert broken_citations(ROOT) == []
    cited = {m.group(1) for _, m in _lines(ROOT, CITATION)}
    # the code cites the math and the failure model: both halves of the page are in use
    assert {"the-predicted-direction", "the-lease", "the-outbox", "redis-outages"} <= cited


def test_the_design_page_has_unique_anchors_for_its_sections() -> None:
    found = anchors((ROOT / DESIGN).read_text(encoding="utf-8"))
    assert len(found) == len(set(found)), sorted(a for a in found if found.count(a) > 1)
    wanted = {
        "the-policy-loss",
        "trust-region-masks",
        "the-divergence-kinds",
        "the-predicted-direction",
        "the-two-category-view",
        "estimators",
        "precision",
        "the-metrics",
        "where-mu-and-pi-differ",
        "top-p",
        "the-failure-model",
        "the-lease",
        "fencing",
        "the-reaper",
        "redelivery",
        "the-outbox",
        "cancel-and-pause",
        "redis-outages",
        "disk-full",
        "atomic-writes",
        "resume-from-checkpoints",
    }
    assert sorted(wanted - set(found)) == []


def test_a_broken_or_old_citation_is_named(tmp_path: Path) -> None:
    cite, old = "design" + ".md#", "DES" + "IGN"  # so that this file cites nothing itself
    (tmp_path / "docs" / "developers").mkdir(parents=True)
    (tmp_path / DESIGN).write_text(
        "# Design\n\n## The lease\n\n```text\n# not a heading\n```\n\n## `Redis` outages\n"
    )
    (tmp_path / "workers").mkdir()
    (tmp_path / "workers" / "lease.py").write_text(
        f'"""A lease (docs/developers/{cite}the-lease).\n'
        f"Fencing (docs/developers/{cite}fencing); stalls ({cite}redis-outages).\n"
        f'{old} §3 said so, and {old}.md too."""\n'
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(f"# {cite}not-a-heading\n")
    assert broken_citations(tmp_path) == [
        f"tests/test_x.py:1: {cite}not-a-heading",
        f"workers/lease.py:2: {cite}fencing",
        f"workers/lease.py:3: {old} § (old form)",
        f"workers/lease.py:3: {old}.md (old form)",
    ]


def test_slugs_are_those_mkdocs_makes() -> None:
    assert slug("The predicted direction") == "the-predicted-direction"
    assert slug("Where mu and pi differ") == "where-mu-and-pi-differ"
    assert slug("`core/`: the trainer, by concern") == "core-the-trainer-by-concern"
    assert slug("Writes whose answer never came") == "writes-whose-answer-never-came"
    assert slug("Model { #model-job }") == "model-job"


def test_every_path_and_module_the_docs_name_exists() -> None:
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    assert stale_names(ROOT, pages) == []


def test_a_stale_path_or_module_is_named(tmp_path: Path) -> None:
    (tmp_path / "core" / "training").mkdir(parents=True)
    (tmp_path / "core" / "__init__.py").write_text("")
    (tmp_path / "core" / "training" / "__init__.py").write_text("")
    (tmp_path / "core" / "training" / "run.py").write_text(
        "from x import y as Z\n\nLIMIT = 3\n\n\nclass Run:\n"
        "    step: int = 0\n\n    def go(self): ...\n"
    )
    page = tmp_path / "docs" / "developers" / "a.md"
    page.parent.mkdir(parents=True)
    page.write_text(
        "`core/training/run.py`, `core/training/`, `core.training.run`,\n"
        "`core.training.run.LIMIT`, `core.training.run.Z`, `core.training.run.Run.go`,\n"
        "`core/training/trainer.py`, `core.training.trainer`, `core.training.run.Nope`,\n"
        "`core.training.run.Run.stop`, `core.config_model`\n"
        "`core.training.run.Run.step`, `core/training/run.py#the-run`, `core/training/run.py/`\n"
        "`core/training/r*.py`, `core/training/x*.py`\n"
    )
    assert stale_names(tmp_path, [page]) == [
        "docs/developers/a.md:3: core/training/trainer.py",
        "docs/developers/a.md:3: core.training.trainer",
        "docs/developers/a.md:3: core.training.run.Nope",
        "docs/developers/a.md:4: core.training.run.Run.stop",
        "docs/developers/a.md:4: core.config_model",
        "docs/developers/a.md:6: core/training/x*.py",
    ]


def test_architecture_module_tables_are_generated_from_the_tree() -> None:
    page = (ROOT / "docs" / "developers" / "architecture.md").read_text(encoding="utf-8")
    hooks = _hooks()
    assert [m.group(1) for m in hooks.MODULES_MARKER.finditer(page)] == list(TOPS)
    for top in TOPS:
        table = hooks.render_modules(ROOT, top)
        rows = {
            m.group(1): m.group(2)
            for m in re.finditer(r"^\| `([\w/]+)/` \| .* \| (.*) \|$", table, re.MULTILINE)
        }
        packages = {
            p.parent.relative_to(ROOT).as_posix()
            for p in (ROOT / top).rglob("__init__.py")
            if "__pycache__" not in p.parts
        }
        assert sorted(rows) == sorted(packages)
        for package, cell in rows.items():
            listed = set(re.findall(r"`(\w+)/?`", cell))
            folder = ROOT / package
            present = {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
            present |= {d.name for d in folder.iterdir() if (d / "__init__.py").is_file()}
            assert listed == present, package


def test_module_tables_render_each_package_with_its_docstring(tmp_path: Path) -> None:
    hooks = _hooks()
    pkg = tmp_path / "core"
    (pkg / "objective").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""The trainer.\n\nMore that the table leaves out."""\n')
    (pkg / "extras.py").write_text("")
    (pkg / "objective" / "__init__.py").write_text("")
    (pkg / "objective" / "masks.py").write_text("")
    (pkg / "objective" / "loss.py").write_text("")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "__init__.py").write_text("")
    assert hooks.render_modules(tmp_path, "core") == (
        "| package | what it is for | modules |\n"
        "|---|---|---|\n"
        "| `core/` | The trainer. | `extras`, `objective/` |\n"
        "| `core/objective/` | (no docstring) | `loss`, `masks` |"
    )
    # a module moved is on the page at the next build, nothing edited by hand
    (pkg / "objective" / "loss.py").rename(pkg / "loss.py")
    assert "| `core/` | The trainer. | `extras`, `loss`, `objective/` |" in hooks.render_modules(
        tmp_path, "core"
    )
    text = "# A\n\n<!-- modules: core -->\n\nafter\n"
    page = hooks.MODULES_MARKER.sub(lambda m: hooks.render_modules(tmp_path, m.group(1)), text)
    assert page.startswith("# A\n\n| package | what it is for | modules |\n")
    assert page.endswith("| `core/objective/` | (no docstring) | `masks` |\n\nafter\n")
