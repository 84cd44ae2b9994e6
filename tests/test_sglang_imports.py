"""``verify_ops.sglang`` has no import circle, and each of its modules imports on its own.

The static check reads every import between the package's modules, those inside
functions too (a deferred import hides a circle; it does not remove it). The
dynamic one imports each module first in a process where no other module of
the package is loaded yet.
"""

import ast
import os
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import verify_ops.sglang

PACKAGE = "verify_ops.sglang"
PACKAGE_DIR = Path(verify_ops.sglang.__file__).parent
MODULES = sorted(m.name for m in pkgutil.iter_modules([str(PACKAGE_DIR)]))


def package_imports(path: Path) -> set[str]:
    """Modules of ``verify_ops.sglang`` that the file at ``path`` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                base = PACKAGE + ("." + node.module if node.module else "")
            elif node.level == 0 and node.module:
                base = node.module
            else:  # `from .. import x`: the parent package, outside this one
                continue
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith(PACKAGE + "."):
                module = name[len(PACKAGE) + 1:].split(".")[0]
                if module in MODULES:
                    found.add(module)
    return found


def find_cycle(graph: dict[str, set[str]]):
    """One import circle as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = "done"
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_package_has_no_import_circle():
    graph = {m: package_imports(PACKAGE_DIR / f"{m}.py") - {m} for m in MODULES}
    assert "config" in graph and not graph["config"], "config must stay a leaf"
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_each_module_imports_first_in_a_fresh_process():
    pytest.importorskip("sglang.srt.layers.attention.triton_backend")
    script = textwrap.dedent(f"""
        import importlib, sys
        failed = []
        for name in {MODULES!r}:
            for loaded in [m for m in sys.modules if m.startswith("{PACKAGE}.")]:
                del sys.modules[loaded]
            try:
                importlib.import_module("{PACKAGE}." + name)
            except Exception as exc:
                failed.append(f"{{name}}: {{type(exc).__name__}}: {{exc}}")
        print("FAILED" if failed else "OK", *failed, sep="\\n")
    """)
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "VERIFY_OPS_DEFRAG": "1"})
    assert child.returncode == 0, child.stderr[-5000:]
    assert child.stdout.strip().splitlines()[-1] == "OK", child.stdout[-5000:]
