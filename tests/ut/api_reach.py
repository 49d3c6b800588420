"""Device API names a class reaches, read from source (no device, no import of torch_npu).

``reach(cls)`` walks every method ``cls`` has (its own and inherited, and an overridden
one where the override calls it through ``super()``), unwrapping decorators, and follows
calls into functions and classes of vLLM (or this plugin) up to
``depth`` levels, collecting attribute chains such as ``torch.cuda.Stream`` and
``torch.accelerator.empty_cache``. A static over-approximation: it also reports names on
branches a platform never takes, which is why the NPU worker's tables name the fact that
keeps each unreached one off the NPU path.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections import defaultdict

OURS = ("vllm.", "vllm_ascend_ext.")


def chain(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _source_tree(fn) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None


def _source(fn) -> str:
    try:
        return inspect.getsource(inspect.unwrap(fn))
    except (OSError, TypeError):
        return ""


def _chains_and_calls(fn, prefixes) -> tuple[set[str], set[str]]:
    tree = _source_tree(fn)
    if tree is None:
        return set(), set()
    uses, calls = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            c = chain(node)
            if c and c.startswith(prefixes):
                uses.add(c)
        if isinstance(node, ast.Call):
            c = node.func.id if isinstance(node.func, ast.Name) else chain(node.func)
            if c:
                calls.add(c)
    return uses, calls


def _functions_of(obj):
    for value in vars(obj).values():
        f = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        if isinstance(f, property):
            f = f.fget
        if inspect.isfunction(f):
            yield f


def reach(cls, prefixes=("torch.cuda.", "torch.accelerator."), depth: int = 3) -> dict:
    """{chain: {Class.method it was reached from}} for every chain with one of ``prefixes``."""
    found: dict[str, set[str]] = defaultdict(set)
    todo = []
    for name in dir(cls):
        # The definition that runs, and each one it reaches through ``super().name(``.
        for owner in (k for k in cls.__mro__ if name in k.__dict__):
            if not owner.__module__.startswith(OURS):
                break
            fns = list(_functions_of(type("_", (), {name: owner.__dict__[name]})))
            todo.extend((f, 0, f"{owner.__name__}.{name}") for f in fns)
            if not any(f"super().{name}(" in _source(f) for f in fns):
                break
    seen = set()
    while todo:
        f, d, where = todo.pop()
        f = inspect.unwrap(f)
        if f in seen:
            continue
        seen.add(f)
        uses, calls = _chains_and_calls(f, prefixes)
        for u in uses:
            found[u].add(where)
        if d >= depth:
            continue
        scope = getattr(f, "__globals__", {})
        for c in calls:
            head, *rest = c.split(".")
            obj = scope.get(head)
            for r in rest:
                obj = getattr(obj, r, None)
            if obj is None or not (getattr(obj, "__module__", "") or "").startswith(OURS):
                continue
            if inspect.isfunction(obj):
                todo.append((obj, d + 1, where))
            elif inspect.isclass(obj):
                todo.extend((g, d + 1, where) for g in _functions_of(obj))
    return dict(found)


def module_chains(module, prefixes) -> set[str]:
    """Attribute chains with one of ``prefixes`` in a module's code (not its docstrings)."""
    tree = ast.parse(inspect.getsource(module))
    return {c for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            for c in [chain(node)] if c and c.startswith(prefixes)}


def call_result_attrs(module, func_name: str) -> set[str]:
    """Names read off the result of calling ``func_name()`` (``torch_npu_module().npu_x``)."""
    tree = ast.parse(inspect.getsource(module))
    out = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == func_name):
            out.add(node.attr)
    return out
