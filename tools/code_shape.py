"""The package's shape in numbers: its import graph between folders (and top-level modules), the arrows that run
back up the declared layers, cycles, imports inside functions, functions over 80 lines, files over 400 lines, plan
kinds tested by name outside their modules (method/kinds/), and flags declared in more than one place.

    python tools/code_shape.py [--json FILE] [--root OTHER_CHECKOUT/src/orthorank]

Layers (bottom first) are LAYERS below; tests/project/test_code_shape.py fails when an import runs back up or a cycle
appears. Every import counts, those inside functions too (a lazy import is still a dependency)."""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "orthorank"
# Bottom first: a node (a folder of the package, or a top-level module) may import its own layer and any layer
# below, never one above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "files"),  # the library's own primitives
    ("models",),  # loading, per-family adapters, shapes
    ("method",),  # OrthoRank itself: plans, policies, the selective layer, the cost model, the method registry
    # the harness (orthorank/harness/): what measures the method; never imported by the library
    ("harness.cpu_info", "harness.distributed", "harness.peak_memory", "harness.results", "harness.store_keys",
     "harness.store"),  # what every result file and stored window needs
    ("harness.runtime",),  # memory guard, interleaved timing, bandwidth bound, cost tables, speed matching
    ("harness.analysis",),  # the sink analysis and its figures
    ("harness.evaluation",),  # perplexity, zero-shot, long inputs, comparisons, claims: numbers and intervals
    ("harness.search",),  # calibration searches and the router fit (they score with evaluation's code)
    ("harness.reports",),  # every table, figure and page: comparisons, frontiers, the analysis, speed, the study
    ("harness.speed",),  # the speed benchmarks
    ("harness.api",),  # one typed function per command: what the CLI and the study call
    ("harness.study",),  # the study's stages
    ("harness.cli",),  # the commands: parse, call, print
)
LONG_FUNCTION = 80
LONG_FILE = 400
# A plan kind or method tested by its name (`plan.method == "prune"`, `method in ("dense", "sleb")`): allowed only
# inside the kind modules (method/kinds/), where each kind answers for itself.
KIND_NAMES = {"method", "plan_kind", "plan_method", "kind", "family", "m"}  # m: a method in a loop
KIND_HOME = "orthorank/method/kinds/"


def _named_kind(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in KIND_NAMES) or (
        isinstance(node, ast.Name) and node.id in KIND_NAMES)


def _literal_names(node: ast.AST, names: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in names
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(
        isinstance(e, ast.Constant) and e.value in names for e in node.elts)


def method_names(root: Path) -> set[str]:
    """The names of plan kinds and methods: each kind module's `name = "..."` and each registry entry's
    `Method("...", ...)` (read from the source, so that another checkout is measured by its own names)."""
    names = set()
    for path in [*sorted((root / "method" / "kinds").glob("*.py")), root / "method" / "registry.py"]:
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["name"] \
                    and isinstance(node.value, ast.Constant):
                names.add(node.value.value)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Method" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                names.add(node.args[0].value)
    return names or {"dense", "orthorank", "prune", "hybrid", "local"}


def kind_string_tests(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines that compare a plan's kind or method to names written out (==, !=, in, not in)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_named_kind(a) for a in sides) and any(_literal_names(b, names) for b in sides):
                lines.append(node.lineno)
    return lines


def flag_declarations(root: Path) -> dict[str, list[str]]:
    """Where each long flag is declared: the typed options' fields (`flag("--x", help=...)`, or the older
    `metadata={"flag": "--x"}`) and any `add_argument("--x", ...)` left in the CLI, each with its help text.
    A flag is written more than once when the CLI declares it beside the options, or when two fields declare it with
    the same help and default (a copy that belongs in a shared group); one flag with different meanings or defaults
    in different commands (--batch-size: windows, prompts or rows) is not a copy."""
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            first = node.args[0] if node.args else None
            if name == "add_argument" and isinstance(first, ast.Constant) and str(first.value).startswith("--"):
                if path.relative_to(root).parts[:2] in (("cli",), ("harness", "cli")) or \
                        path.relative_to(root).parts[0] == "cli":
                    found[first.value].append("cli")
            elif name == "flag" and isinstance(first, ast.Constant) and str(first.value).startswith("--"):
                said = {k.arg: ast.unparse(k.value) for k in node.keywords if k.arg in ("help", "default")}
                found[first.value].append(f"help={said.get('help')} default={said.get('default')}")
            elif name == "field":
                for k in node.keywords:
                    if k.arg == "metadata" and isinstance(k.value, ast.Dict):
                        for key, v in zip(k.value.keys, k.value.values):
                            if isinstance(key, ast.Constant) and key.value == "flag" and isinstance(v, ast.Constant):
                                found[v.value].append("field")
    return dict(found)


def written_twice(declarations: dict[str, list[str]]) -> list[str]:
    """Flags the CLI declares beside the options, or that two fields declare with the same help and default."""
    return sorted(f for f, where in declarations.items()
                  if ("cli" in where and len(where) > 1) or len(where) != len(set(where)))


class _Imports(ast.NodeVisitor):
    """Each import statement of the package's own modules: (the modules it names, inside a function?)."""

    def __init__(self, module: str, is_package: bool):
        self.module, self.is_package, self.depth, self.found = module, is_package, 0, []

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import):
        names = [a.name for a in node.names if a.name.split(".")[0] == "orthorank"]
        if names:
            self.found.append((names, self.depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.level:
            base = self.module.split(".") if self.is_package else self.module.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        if target.split(".")[0] == "orthorank":
            # `from orthorank.method import plan` names a module; `from orthorank import errors` too
            self.found.append(([target] + [f"{target}.{a.name}" for a in node.names], self.depth > 0))


HARNESS = "harness"


def _node(module: str) -> str | None:
    """orthorank.a.b -> "a", orthorank.harness.a.b -> "harness.a"; None for the package itself and the harness's
    own __init__ (the front door and the harness's table of contents import from every room)."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == HARNESS:
        return f"{HARNESS}.{parts[2]}"
    return parts[1] if len(parts) > 1 and parts[1] != HARNESS else None


def _rooms(folder: Path, prefix: str = "") -> set[str]:
    return {prefix + (p.stem if p.is_file() else p.name) for p in folder.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}


def measure(root: Path = ROOT) -> dict:
    existing = _rooms(root) - {HARNESS}
    if (root / HARNESS / "__init__.py").is_file():
        existing |= _rooms(root / HARNESS, f"{HARNESS}.")
    layer_of = {name: i for i, names in enumerate(LAYERS) for name in names}
    arrows: dict[tuple[str, str], int] = defaultdict(int)
    statements = inside = 0
    long_functions, long_files, kind_tests = [], [], []
    known = method_names(root)
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
        source = _node(module)
        tree = ast.parse(path.read_text())
        where = path.relative_to(root.parent).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > LONG_FILE:
            long_files.append({"file": where, "lines": lines})
        if not where.startswith(KIND_HOME):
            kind_tests += [f"{where}:{n}" for n in kind_string_tests(tree, known)]
        visitor = _Imports(module, path.name == "__init__.py")
        visitor.visit(tree)
        for names, in_function in visitor.found:
            statements += 1
            inside += in_function
            for dst in {_node(n) for n in names} & existing:
                if source is not None and dst != source:
                    arrows[(source, dst)] += 1
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (fn.end_lineno or fn.lineno) - fn.lineno + 1
                if length > LONG_FUNCTION:
                    long_functions.append({"function": f"{path.relative_to(root.parent).as_posix()}:{fn.name}",
                                           "lines": length})
    up = sorted([a, b, n] for (a, b), n in arrows.items()
                if a in layer_of and b in layer_of and layer_of[b] > layer_of[a])
    graph = defaultdict(set)
    for a, b in arrows:
        graph[a].add(b)
    return {"nodes": len(existing), "arrows": len(arrows), "arrows_back_up": up,
            "cycles": _cycles(graph, existing), "internal_imports": statements, "imports_inside_functions": inside,
            "functions_over_80_lines": sorted(long_functions, key=lambda f: -f["lines"]),
            "files_over_400_lines": sorted(long_files, key=lambda f: -f["lines"]),
            "kind_string_tests": kind_tests,
            "flags_declared_more_than_once": written_twice(flag_declarations(root)),
            "unplaced": sorted(existing - set(layer_of)), "layers": [list(x) for x in LAYERS]}


def _cycles(graph: dict[str, set[str]], nodes: set[str]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            strong(v)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None, help="also write the numbers to this file (default: print only)")
    p.add_argument("--root", default=str(ROOT), help="the package folder to measure (default: this checkout's)")
    p.add_argument("--verbose", action="store_true", help="also list each plan-kind string test and repeated flag")
    args = p.parse_args(argv)
    m = measure(Path(args.root))
    print(f"nodes {m['nodes']}, arrows {m['arrows']}, arrows back up {len(m['arrows_back_up'])}, cycles "
          f"{len(m['cycles'])}, internal import statements {m['internal_imports']} ({m['imports_inside_functions']} "
          f"inside functions), functions over {LONG_FUNCTION} lines {len(m['functions_over_80_lines'])}, files over "
          f"{LONG_FILE} lines {len(m['files_over_400_lines'])}, plan-kind string tests outside method/kinds "
          f"{len(m['kind_string_tests'])}, flags declared more than once {len(m['flags_declared_more_than_once'])}")
    for a, b, n in m["arrows_back_up"]:
        print(f"  back up: {a} -> {b} ({n} imports)")
    for c in m["cycles"]:
        print(f"  cycle: {' <-> '.join(c)}")
    for f in m["functions_over_80_lines"]:
        print(f"  long: {f['function']} {f['lines']}")
    for f in m["files_over_400_lines"]:
        print(f"  long file: {f['file']} {f['lines']}")
    if args.verbose:
        for where in m["kind_string_tests"]:
            print(f"  kind test: {where}")
        for flag in m["flags_declared_more_than_once"]:
            print(f"  flag declared again: {flag}")
    if m["unplaced"]:
        print(f"  not in LAYERS: {', '.join(m['unplaced'])}")
    if args.json:
        sys.path.insert(0, str(ROOT.parent))
        from orthorank.harness.results import write_json  # noqa: E402  (the measuring checkout's, for its commit)

        import subprocess

        measured = subprocess.run(["git", "rev-parse", "HEAD"], cwd=args.root, capture_output=True,
                                  text=True).stdout.strip() or None
        write_json(args.json, {"measured_commit": measured, **m}, overwrite=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
