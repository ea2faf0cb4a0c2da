"""docs/results/ and the scripts stay findable (issue #42 items 5 and 6).

- `scripts/` holds the README's commands and the GPU checks only (at most 10 files); the one-off
  studies live in `studies/`, each listed in `studies/README.md` (and every listed study exists).
- `docs/results/` holds the current evidence at its top (at most 45 entries); earlier runs live in
  `docs/results/archive/`. `docs/results/README.md` lists every entry of both, and nothing else.
- Every `docs/results/...` path the docs, the scripts, the studies and the code cite exists.
- Studies use public names only: nothing they import from this project starts with `_`, and every
  function or class they import from it carries a docstring.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from support.paths import REPO_ROOT

RESULTS = REPO_ROOT / "docs" / "results"
ARCHIVE = RESULTS / "archive"
SCRIPTS = REPO_ROOT / "scripts"
STUDIES = REPO_ROOT / "studies"
MAX_SCRIPTS, MAX_RESULTS_TOP = 10, 45
PROJECT = ("specexit_core", "pipelines", "serve_app", "specexit_app", "cluster")

# a path under docs/results/, up to the first character no path holds; one followed by a placeholder
# (`demo_<teacher>/`, `test_profile_*.json`) matches nothing, so globs and templates are not checked
CITED = re.compile(r"docs/results/[\w./-]+(?![\w./<*{-])")
MD_LINK = re.compile(r"\]\(([^)\s#]+)")  # a Markdown link's target, relative to the file
CITING_SUFFIXES = {".md", ".py", ".sh", ".yaml", ".yml", ".toml"}


def _entries(folder: Path) -> list[Path]:
    """What a reader sees in a folder: files and folders, not caches or hidden files."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and p.name != "__pycache__")


def _name(p: Path) -> str:
    """`bench_hook_cpu.json`, `archive/demo_qwen3_like/`: how the index names an entry."""
    rel = p.relative_to(RESULTS).as_posix()
    return rel + "/" if p.is_dir() else rel


def _index_rows(md: str) -> list[str]:
    """The first cell of every table row of an index, when it is one `code` name."""
    rows = []
    for line in md.splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|", line)
        if m:
            rows.append(m.group(1))
    return rows


def _citing_files() -> list[Path]:
    """The docs, scripts, studies and code that may cite docs/results/ (not the raw results themselves,
    whose own `command` fields keep the paths of their time)."""
    files = [REPO_ROOT / "README.md", REPO_ROOT / "pyproject.toml", RESULTS / "README.md"]
    files += [p for p in (REPO_ROOT / "docs").rglob("*.md") if ARCHIVE not in p.parents]
    for top in (*PROJECT, "scripts", "studies", "examples", "tests"):
        files += [p for p in (REPO_ROOT / top).rglob("*") if p.suffix in CITING_SUFFIXES and p.is_file()]
    return sorted(set(files))


def test_scripts_holds_the_commands_and_gpu_checks_only():
    files = [p.name for p in _entries(SCRIPTS) if p.is_file()]
    assert len(files) <= MAX_SCRIPTS, f"scripts/ has {len(files)} files (at most {MAX_SCRIPTS}): {files}"
    # README's two commands, the setup they run, and the GPU checks the docs and tests call
    for name in ("setup.sh", "demo.sh", "test.sh", "gpu_check.sh", "gpu_lent_check.sh"):
        assert name in files, f"scripts/{name} is a public command"


def test_results_top_level_is_the_current_evidence():
    top = _entries(RESULTS)
    assert len(top) <= MAX_RESULTS_TOP, f"docs/results/ has {len(top)} entries (at most {MAX_RESULTS_TOP})"
    assert ARCHIVE.is_dir() and (RESULTS / "README.md").is_file()


def test_results_index_lists_every_entry_and_only_those():
    listed = _index_rows((RESULTS / "README.md").read_text())
    assert len(listed) == len(set(listed)), "an entry is listed twice"
    present = {_name(p) for p in _entries(RESULTS) + _entries(ARCHIVE)} - {"README.md", "archive/"}
    assert sorted(present - set(listed)) == [], "entries of docs/results/ missing from its README.md"
    assert sorted(set(listed) - present) == [], "docs/results/README.md lists entries that do not exist"


def test_every_cited_results_path_exists():
    missing = []
    for f in _citing_files():
        text = f.read_text(errors="replace")
        for m in CITED.finditer(text):
            path = m.group(0).rstrip(".")
            if not (REPO_ROOT / path).exists():
                missing.append(f"{f.relative_to(REPO_ROOT)}: {path}")
        if f.suffix == ".md":  # relative links, e.g. docs/teachers.md's ![...](results/...png)
            for target in MD_LINK.findall(text):
                linked = f.parent / target
                if "://" not in target and "results/" in linked.as_posix() and not linked.exists():
                    missing.append(f"{f.relative_to(REPO_ROOT)}: {target}")
    assert missing == [], "cited but not there (moved to docs/results/archive/?):\n" + "\n".join(missing)


def _table(md: str) -> list[list[str]]:
    """The cells of every table row whose first cell is one `code` name (header and separator dropped)."""
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in md.splitlines() if _index_rows(line)]


def test_studies_index_lists_every_study_and_only_those():
    md = (STUDIES / "README.md").read_text()
    listed = _index_rows(md)
    present = {p.name for p in _entries(STUDIES)} - {"README.md"}
    assert sorted(present - set(listed)) == [], "studies missing from studies/README.md"
    assert sorted(set(listed) - present) == [], "studies/README.md lists studies that do not exist"
    for row in _table(md):
        study, wrote = row[0].strip("`"), row[2]
        assert f"studies/{study}" in row[4], f"{study}: the rerun command names another file"
        for name in re.findall(r"`([^`]+)`", wrote):
            if not re.search(r"[<*]", name):  # a template (`demo_<teacher>/`) or glob is not one file
                assert (RESULTS / name).exists(), f"{study} wrote docs/results/{name}, which is not there"


def test_studies_are_not_imported_by_the_project():
    for top in (*PROJECT, "scripts"):
        for f in (REPO_ROOT / top).rglob("*.py"):
            assert not re.search(r"^\s*(from|import) studies\b", f.read_text(), re.M), f


def _module_file(module: str) -> Path | None:
    base = REPO_ROOT.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.exists()), None)


def _definition(module: str, name: str, depth: int = 0) -> ast.AST | None:
    """The def or class `name` of a project module, following re-exports (`from x import name`)."""
    f = _module_file(module)
    if f is None:
        return None
    for node in ast.parse(f.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == name:
            return node
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and depth < 3:
            orig = [a.name for a in node.names if (a.asname or a.name) == name]
            if orig:
                return _definition(node.module, orig[0], depth + 1)
    return None  # a constant, or a submodule


# imports a study keeps until another issue replaces them, with that issue: (study, module) -> why
LEFT_AS_THEY_ARE = {
    (
        "exit_headroom.py",
        "pipelines.calibrate.job",
    ): "the calibration headroom becomes a command (signal-quality issue)",
}


@pytest.mark.parametrize("study", sorted(p.name for p in STUDIES.glob("*.py")))
def test_studies_use_public_names_only(study):
    tree = ast.parse((STUDIES / study).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, name in mods:
            if module.split(".")[0] not in PROJECT:
                continue
            parts = module.split(".") + ([name] if name else [])
            assert not any(p.startswith("_") for p in parts), f"{study} imports a private name: {'.'.join(parts)}"
            if name is None or (study, module) in LEFT_AS_THEY_ARE:
                continue
            d = _definition(module, name)
            assert d is None or ast.get_docstring(d), f"{study} imports {module}.{name}, which has no docstring"
    private = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and re.fullmatch(r"_[a-z]\w*", n.attr)]
    assert private == [], f"{study} reaches private attributes: {private}"


@pytest.mark.parametrize(
    "text, cited",
    [
        ("raw `docs/results/kv_toy_cpu.json`.", ["docs/results/kv_toy_cpu.json"]),
        ("(docs/results/archive/demo_qwen3_like_run2/), so", ["docs/results/archive/demo_qwen3_like_run2/"]),
        ("into docs/results/demo_<teacher>/ and docs/results/test_profile_*.json", []),
    ],
)
def test_cited_pattern(text, cited):
    assert [m.group(0) for m in CITED.finditer(text)] == cited
