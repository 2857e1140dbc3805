"""The floor plan, checked (docs/architecture.md draws it): folders by role, every import
running down (the import-linter contract in pyproject.toml, and the graph tests/layout.py
reads), no module taking another's private names, docs that name only files that exist,
and ruff clean (its SLF rules keep private members private in the package)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from layout import PACKAGE, REPO, floors, graph, modules

MAX_LOOSE = 12  # modules at the package's top level, __init__ and __main__ included
MAX_FLOORS = 14  # each module a floor above everything it imports


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter on the package under `root` (its pyproject.toml holds the contract)."""
    return subprocess.run([sys.executable, "-c", "from importlinter.cli import "
                           "lint_imports_command; lint_imports_command()", "--no-cache"],
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)


def test_the_import_contract_is_kept() -> None:
    run = _lint_imports(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "1 kept, 0 broken" in run.stdout


def test_the_contract_breaks_on_an_import_that_runs_back_up(tmp_path: Path) -> None:
    """The contract can fail: the core importing the runner breaks it, and the report
    names the import."""
    shutil.copytree(PACKAGE, tmp_path / "stream_dedup",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.c", "*.h"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    hashing = tmp_path / "stream_dedup" / "core" / "hashing.py"
    hashing.write_text(hashing.read_text() + "\nfrom stream_dedup.runner import loop  # noqa\n")
    run = _lint_imports(tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "stream_dedup.core.hashing -> stream_dedup.runner.loop" in run.stdout


def test_at_most_twelve_loose_modules() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= MAX_LOOSE, loose


def test_the_import_graph_is_at_most_fourteen_floors_with_no_cycle() -> None:
    floor = floors()  # raises on a cycle, naming it
    top = max(floor, key=floor.__getitem__)
    assert floor[top] <= MAX_FLOORS, f"{top} is on floor {floor[top]}"
    assert min(floor.values()) == 1 and len(floor) == len(modules())


def test_no_module_imports_another_s_private_names() -> None:
    """`from m import _x` only within m's own package, and only when _x is a module there
    (the compiled kernels, core/_native, for the core's own modules)."""
    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    mods = modules()
    taken = []
    for importer, imported in graph().items():
        for target, names in imported.items():
            if private(target.rsplit(".", 1)[-1]) \
                    and importer.rsplit(".", 1)[0] != target.rsplit(".", 1)[0]:
                taken.append(f"{importer} imports the private module {target}")
            for name in filter(private, names):
                # a compiled module (no .py) of the importer's own package is its own
                home = mods[target].parent if target in mods else None
                own = home is not None and any(home.glob(f"{name}.*")) \
                    and importer.rsplit(".", 1)[0] == target
                if not own:
                    taken.append(f"{importer} takes {target}.{name}")
    assert not taken, "\n".join(taken)


def test_the_graph_sees_what_the_code_imports() -> None:
    """The reader of the graph is itself right: a known import inside a function counts,
    one under TYPE_CHECKING does not."""
    edges = graph()
    assert "stream_dedup.runner.edges" in edges["stream_dedup.kafka.edges"]
    assert "stream_dedup.pipeline.deduplicator" not in edges["stream_dedup.metrics"]
    assert "stream_dedup.index.namespaces" in edges["stream_dedup.config"]  # in a function


# a path to a file in prose: core/sketch.py, stream_dedup/kafka/edges.py, tests/run
_PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.(?:py|c|h|md|toml|yml|json|sh))\b")
_DOTTED = re.compile(r"(?<![\w.])(stream_dedup(?:\.\w+)+)")


def _exists(path: str) -> bool:
    """A path is under one of the places docs name paths from; a bare name of a module is
    somewhere in the repository (other bare names are commands' arguments and tools)."""
    if "/" not in path:
        return not path.endswith(".py") or any(REPO.glob(f"**/{path}"))
    return any((base / path).exists() for base in (REPO, PACKAGE, REPO / "tests", REPO / "bench",
                                                    REPO / "deploy", REPO.parent / "shared"))


def _resolves(dotted: str) -> bool:
    mods = modules()
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in mods:
            return i >= len(parts) - 1  # the module, or one name in it
    return False


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md", "docs/development.md",
                                 "docs/operating.md", "docs/reference.md", "docs/tuning.md",
                                 "docs/scale-out.md", "docs/lifecycle.md", "docs/kubernetes.md",
                                 "bench/RESULTS.md"])
def test_the_docs_name_files_and_modules_that_exist(doc: str) -> None:
    text = (REPO / doc).read_text()
    missing = sorted({p for p in _PATH.findall(text) if not _exists(p)}
                     | {d for d in _DOTTED.findall(text) if not _resolves(d.rstrip("."))})
    assert not missing, f"{doc} names what does not exist: {missing}"


def test_the_floor_plan_names_every_part() -> None:
    """docs/architecture.md's floor plan names each folder and loose module of the package."""
    text = (REPO / "docs" / "architecture.md").read_text()
    plan = text[text.index("## The floor plan"):text.index("## The modules")]
    parts = [f"`{p.name}/`" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()]
    parts += [f"`{p.name}`" for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert [p for p in parts if p not in plan] == []


def test_the_package_names_modules_that_exist() -> None:
    """A module's prose that names a module by its file (`pool.py`) names one that exists:
    a renamed or moved module leaves no stale name behind."""
    names = {p.name for p in REPO.rglob("*.py")}
    stale = [f"{path.relative_to(REPO)}:{n}: {name}"
             for path in sorted(PACKAGE.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             for name in re.findall(r"(?<![\w./-])(\w+\.py)\b", line) if name not in names]
    assert not stale, "\n".join(stale)


def test_ruff_is_clean() -> None:
    """ruff with the project's rules, SLF among them (pyproject.toml)."""
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
