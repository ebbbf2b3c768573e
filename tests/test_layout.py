"""The shape of the code: imports run one way (cli → bench → distributed → tasks → drafts → models → decoding → kernels),
with no cycle, counting imports inside functions; and every private internal of transformers and torch that
specdec relies on is still where specdec_cli/internals.py expects it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from conftest import ROOT

# highest first; a module may import its own layer and the layers below it, never one above
LAYERS = ["cli", "bench", "distributed", "tasks", "drafts", "models", "decoding", "kernels", "base"]
BASE = {"specdec_cli", "specdec_cli.errors", "specdec_cli.options", "specdec_cli.internals"}


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (kernels/ installs as specdec_cli.kernels)."""
    out = {}
    for folder, package in ((ROOT / "specdec_cli", "specdec_cli"), (ROOT / "kernels", "specdec_cli.kernels")):
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def layer(module: str) -> str:
    if module in BASE:
        return "base"
    if module in ("specdec_cli.cli", "specdec_cli.render"):
        return "cli"
    part = module.split(".")[1]
    if part not in LAYERS:
        raise AssertionError(f"{module} belongs to no layer: add it to LAYERS or BASE in {__file__}")
    return part


def imports(module: str) -> set[str]:
    """The specdec modules `module` imports anywhere in its body (functions included)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found.update(n for n in names if n in MODULES and n != module)
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_imports_run_one_way():
    rank = {name: i for i, name in enumerate(LAYERS)}
    wrong = [f"{m} ({layer(m)}) imports {n} ({layer(n)})" for m, deps in sorted(GRAPH.items()) for n in sorted(deps)
             if rank[layer(n)] < rank[layer(m)]]
    assert not wrong, "imports from a lower layer up to a higher one:\n" + "\n".join(wrong)


def test_no_import_cycle():
    def cycle_from(start):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in GRAPH[node]:
                if nxt == start:
                    return path + [start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
        return None

    cycles = [" → ".join(c) for m in sorted(GRAPH) if (c := cycle_from(m))]
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_layering_test_can_fail():
    """The checks above see imports inside functions and relative imports."""
    assert "specdec_cli.kernels.exact" in GRAPH["specdec_cli.kernels.sigmoid"]  # `from .exact import ...`
    assert "specdec_cli.bench.kernel_check" in GRAPH["specdec_cli.cli"]  # imported inside a command
    assert layer("specdec_cli.tasks.transcribe") == "tasks" and layer("specdec_cli.kernels.exact") == "kernels"


def test_private_internals_are_where_specdec_expects_them():
    from specdec_cli import internals

    problems = internals.check()
    assert not problems, ("transformers or torch moved internals that specdec_cli/internals.py relies on "
                          "(update it, and the transformers range in pyproject.toml):\n" + "\n".join(problems))


@pytest.mark.parametrize("needle", ["._modules", "_attn_implementation", "torch.ops.aten._", "_speculative_sampling(",
                                    "DynamicLayer(", "modeling_gguf_pytorch_utils", "cache.crop("])
def test_private_internals_are_used_only_behind_the_door(needle):
    pattern = re.compile(r"(?<![A-Za-z0-9])" + re.escape(needle))  # FlashInfer's public chain_speculative_sampling( is not one
    users = sorted(str(p.relative_to(ROOT)) for m, p in MODULES.items()
                   if m != "specdec_cli.internals" and pattern.search(p.read_text()))
    assert not users, f"{needle!r} is used outside specdec_cli/internals.py: {users}"


LONGEST = 60  # lines of code in a function (its docstring left out) before it must say why


def test_no_long_function_without_a_reason():
    """A function longer than LONGEST lines of code says why in its docstring ("Long ..."); none other is."""
    long = []
    for path in sorted(MODULES.values()):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = node.end_lineno - node.lineno + 1
            doc = ast.get_docstring(node) or ""
            if doc:
                lines -= node.body[0].end_lineno - node.body[0].lineno + 1
            if lines > LONGEST and "Long" not in doc:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over ~60 lines with no reason in their docstring:\n" + "\n".join(long)
