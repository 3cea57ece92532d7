"""The layout shows the architecture (docs/architecture.md): each package imports only the
packages below it. ``proto/`` is the wire; ``transport/`` carries it; ``meter/`` and
``ledger/`` use both and never each other; ``verifier/`` trusts ``proto/`` alone (plus
``billview/``, the pure renderer of the bill, which itself imports only ``proto/``, so
the ledger and the verifier each render from their own figures); the
glue (``gridledger/``) and the harnesses (``devtools/``) may import anything, but no
product package imports them.

Every import statement counts, at any depth (inside functions too), relative ones
resolved to their package.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = frozenset(
    {
        "proto",
        "transport",
        "meter",
        "ledger",
        "verifier",
        "witness",
        "billview",
        "gridledger",
        "devtools",
        "tests",
    }
)
ALLOWED: dict[str, frozenset[str]] = {
    "proto": frozenset(),
    "transport": frozenset({"proto"}),
    "meter": frozenset({"proto", "transport"}),
    "ledger": frozenset({"proto", "transport", "billview"}),
    "verifier": frozenset({"proto", "billview"}),
    "witness": frozenset({"proto"}),
    "billview": frozenset({"proto"}),
}


def project_imports(package: str) -> list[tuple[str, int, str]]:
    """(file, line, imported top-level package) for every import of another project package."""
    found: list[tuple[str, int, str]] = []
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no Python files"
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [package] if node.level else [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top in PROJECT and top != package:
                    found.append((str(path.relative_to(ROOT)), node.lineno, top))
    return found


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_the_packages_below_it(package: str) -> None:
    offenders = [
        f"{file}:{line}: imports {top}"
        for file, line, top in project_imports(package)
        if top not in ALLOWED[package]
    ]
    assert offenders == []


def test_the_boundary_check_sees_imports_across() -> None:
    """The checker itself: the glue does import the services (else it proves nothing)."""
    tops = {top for _, _, top in project_imports("gridledger")}
    assert {"proto", "transport", "meter", "ledger", "verifier"} <= tops
    assert "devtools" not in tops  # the demo and the CLI run from a wheel without devtools


# The ledger's public faces: the modules the glue may import. The fold (``rules``, ``state``,
# ``pricing``, ``cache``, ...) stays behind them: what the glue needs of it (the dry run)
# the ledger offers as a face of its own (``ledger.dryrun``).
LEDGER_FACES: frozenset[str] = frozenset(
    {
        "ledger.access",
        "ledger.client",
        "ledger.config",
        "ledger.dryrun",
        "ledger.export",
        "ledger.http",
        "ledger.metrics",
        "ledger.service",
        "ledger.store",
    }
)


def ledger_modules_imported(package: str) -> list[tuple[str, int, str]]:
    """(file, line, module) for every import of a ``ledger`` module, at any depth; a
    package's module counts as the package (``ledger.store.rows`` is ``ledger.store``)."""
    found: list[tuple[str, int, str]] = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                base = node.module or ""
                names = [f"{base}.{a.name}" for a in node.names] if base == "ledger" else [base]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "ledger":
                    found.append((str(path.relative_to(ROOT)), node.lineno, ".".join(parts[:2])))
    return found


def test_glue_imports_only_the_ledgers_public_faces() -> None:
    offenders = [
        f"{file}:{line}: imports {module}"
        for file, line, module in ledger_modules_imported("gridledger")
        if module not in LEDGER_FACES
    ]
    assert offenders == []


def test_the_faces_check_sees_the_glue_import_the_ledger() -> None:
    """The checker itself: it finds the faces the glue does use, and each face is a module."""
    used = {module for _, _, module in ledger_modules_imported("gridledger")}
    assert {"ledger.dryrun", "ledger.store", "ledger.service"} <= used
    for face in LEDGER_FACES:
        path = ROOT / face.replace(".", "/")
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), face


# Being rewritten on other branches; they adopt proto.invariant when they land.
_ASSERTS_PENDING: frozenset[str] = frozenset()


@pytest.mark.parametrize(
    "package", ["proto", "transport", "meter", "ledger", "gridledger", "witness", "billview"]
)
def test_product_code_states_invariants_that_survive_python_o(package: str) -> None:
    """No bare ``assert`` (gone under ``-O``): ``proto.invariant`` instead."""
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        if relative in _ASSERTS_PENDING:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=relative)
        offenders += [f"{relative}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    assert offenders == []


# ---- function length: a ratchet ---------------------------------------------------------

PRODUCT = ("gridledger", "proto", "transport", "meter", "ledger", "verifier", "witness", "billview")
MAX_FUNCTION_LINES = 80

# The product functions over MAX_FUNCTION_LINES today, "file::qualified name" -> lines (the
# ``def`` line to the last, decorators not counted, docstring and comments counted). A ratchet:
# the list is exact. A number may only go down: a listed function that shrank gets its new
# length here, one at MAX_FUNCTION_LINES or under (or gone) leaves the list, and one that must
# grow is split instead; nothing is added. Methods are named Class.method, nested functions
# outer.inner.
LONG_FUNCTIONS: dict[str, int] = {
    "billview/build.py::_resale": 88,
    "billview/build.py::_settlement": 84,
    "billview/build.py::build": 86,
    "gridledger/demo.py::run_demo": 85,
    "ledger/export.py::_copy_rows": 83,
    "ledger/export.py::_export_all": 97,
    "meter/agent.py::Agent.__init__": 83,
    "meter/cli.py::_serve": 83,
    "meter/config.py::parse_meter_config": 116,
    "transport/spool.py::read_spool": 82,
    "verifier/bill.py::collect": 82,
    "verifier/inclusion.py::verify_inclusion_bundle": 98,
    "verifier/pricing.py::_base_sql": 109,
    "verifier/step3_terms.py::check_terms": 105,
    "verifier/step6_chain.py::check_sets": 84,
    "verifier/step8_merkle.py::check_checkpoints": 111,
    "verifier/step9_obligation.py::check_statements": 100,
}


def function_lengths(tree: ast.Module, relative: str) -> dict[str, int]:
    """The lines of every function and method in ``tree``, nested ones included, by
    "file::qualified name" (the longest where a name is defined twice)."""
    lengths: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{relative}::{prefix}{child.name}"
                end = child.end_lineno if child.end_lineno is not None else child.lineno
                lengths[name] = max(lengths.get(name, 0), end - child.lineno + 1)
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return lengths


def product_function_lengths() -> dict[str, int]:
    lengths: dict[str, int] = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=relative)
            lengths.update(function_lengths(tree, relative))
    return lengths


def test_no_product_function_is_longer_than_the_ratchet_allows() -> None:
    lengths = product_function_lengths()
    problems = []
    for name, lines in sorted(lengths.items()):
        if lines > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS:
            problems.append(f"{name}: {lines} lines (at most {MAX_FUNCTION_LINES}): split it")
    for name, allowed in sorted(LONG_FUNCTIONS.items()):
        lines = lengths.get(name)
        if lines is None:
            problems.append(f"{name}: gone: remove it from LONG_FUNCTIONS")
        elif lines <= MAX_FUNCTION_LINES:
            problems.append(f"{name}: {lines} lines now: remove it from LONG_FUNCTIONS")
        elif lines > allowed:
            problems.append(f"{name}: {lines} lines, {allowed} allowed (only down): split it")
        elif lines < allowed:
            problems.append(f"{name}: {lines} lines now: lower its LONG_FUNCTIONS entry to that")
    assert problems == []


def test_function_lengths_count_from_the_def_to_the_last_line() -> None:
    """The measure itself: methods and nested functions by their qualified names."""
    source = (
        "@decorated\n"
        "def outer():\n"
        "    '''doc'''\n"
        "    def inner():\n"
        "        return 1\n"
        "\n"
        "    return inner\n"
        "class K:\n"
        "    async def method(self):\n"
        "        pass\n"
    )
    assert function_lengths(ast.parse(source), "m.py") == {
        "m.py::outer": 6,
        "m.py::outer.inner": 2,
        "m.py::K.method": 2,
    }


# ---- no import circle inside a package --------------------------------------------------


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def load_time_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements a module runs when it is imported: at module level and in class
    bodies, inside ``if``/``try``/``with`` there too; not those inside functions (they run
    when called, after every module is loaded) nor under ``if TYPE_CHECKING:`` (never run;
    its ``else`` does)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append(child)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for other in child.orelse:
                    visit(ast.Module(body=[other], type_ignores=[]))
            else:
                visit(child)

    visit(tree)
    return found


def every_import(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, inside functions and under TYPE_CHECKING too."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def module_graph(
    package: str,
    imports: Callable[[ast.Module], list[ast.Import | ast.ImportFrom]] = load_time_imports,
) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports at load time (``load_time_imports``;
    ``imports`` chooses others).
    ``import a.b`` and ``from a.b import c`` name a.b, or a.b.c where that is a module; a
    parent package's ``__init__`` that Python runs first is not counted (a package that
    re-exports its modules would otherwise always be a circle)."""
    modules: dict[str, Path] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in imports(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(circles)


@pytest.mark.parametrize("package", PRODUCT)
def test_no_package_has_an_import_circle_among_its_modules(package: str) -> None:
    """Each package's modules import each other one way only (at load time; an import
    inside a function or under ``if TYPE_CHECKING:`` does not count: see load_time_imports)."""
    assert import_circles(module_graph(package)) == []


def test_the_verifier_has_no_import_circle_even_through_deferred_imports() -> None:
    """Stricter for the verifier, whose run state every step uses: no circle even counting
    the imports inside functions and under TYPE_CHECKING, and the state (``verifier/
    state.py``) imports no step, nor the pass or the bill that drive the steps."""
    graph = module_graph("verifier", every_import)
    assert import_circles(graph) == []
    drivers = {"verifier.walk", "verifier.bill", "verifier.verify"}
    assert (
        sorted(m for m in graph["verifier.state"] if m.startswith("verifier.step") or m in drivers)
        == []
    )


def test_the_circle_check_sees_a_circle_and_not_what_does_not_load() -> None:
    """The checker itself, on small sources: a circle of three, one import under
    TYPE_CHECKING and one inside a function (neither counts)."""
    sources = {
        "a": "import p.b\n",
        "b": "from p import c\n",
        "c": "from p.a import x\nif TYPE_CHECKING:\n    import p.d\n",
        "d": "def f():\n    import p.c\n",
    }
    edges = {
        f"p.{name}": {
            alias.name if isinstance(node, ast.Import) else f"{node.module}.{alias.name}"
            for node in load_time_imports(ast.parse(text))
            for alias in node.names
        }
        for name, text in sources.items()
    }
    graph = {
        name: {t if t in edges else t.rpartition(".")[0] for t in targets}
        for name, targets in edges.items()
    }
    assert graph["p.d"] == set()
    assert graph["p.c"] == {"p.a"}
    assert import_circles(graph) == [["p.a", "p.b", "p.c"]]
