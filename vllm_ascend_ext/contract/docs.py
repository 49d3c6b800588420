"""torch_npu's operator documentation (the oracle's ``_op_plugin_docs.py``), read as data.

Each documented rule the harness checks quotes the line of this text it rests on:
``line(op, needle)`` returns that line and raises if the documentation no longer has
it, so a rule can never outlive its source. ``families(op)`` reads the operator's
supported products (支持的型号, on some pages 支持的芯片型号); many operators list none, which the harness reports
as "unspecified", never as a pass.
"""

from __future__ import annotations

import ast
import functools

from vllm_ascend_ext.contract import oracle

SUPPORTED_PRODUCTS = "支持的型号"
# the heading some pages use instead (npu_fused_infer_attention_score, npu_mla_prolog_v3 ...)
SUPPORTED_CHIPS = "支持的芯片型号"
# Product words -> SoC family, most specific first (a product line may name several).
_FAMILY_WORDS = (("950", "A5"), ("A5", "A5"), ("A3", "A3"), ("A2", "A2"),
                 ("推理系列", "310P"), ("训练系列", "910"))


class DocLineMissing(KeyError):
    """A rule quotes a documentation line that the pinned documentation does not have."""


@functools.cache
def all_docs() -> dict[str, str]:
    """Operator name -> docstring, from the ``_add_torch_npu_docstr(name, doc)`` calls."""
    out: dict[str, str] = {}
    for node in ast.parse(oracle.load()[oracle.DOCS]).body:
        call = node.value if isinstance(node, ast.Expr) else None
        if (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "_add_torch_npu_docstr"
                and len(call.args) == 2 and all(isinstance(a, ast.Constant) for a in call.args)):
            out[call.args[0].value] = call.args[1].value
    return out


def doc(op: str) -> str | None:
    return all_docs().get(op)


def line(op: str, needle: str) -> str:
    """The first line of ``op``'s documentation containing ``needle``, stripped."""
    for text in (doc(op) or "").splitlines():
        if needle in text:
            return text.strip()
    raise DocLineMissing(f"torch_npu {oracle.VERSION} documentation of {op} has no line "
                         f"containing {needle!r}")


def family_of(product: str) -> set[str]:
    found = set()
    for piece in product.replace("、", "/").split("/"):
        for word, family in _FAMILY_WORDS:
            if word in piece:
                found.add(family)
                break
    return found


def families(op: str) -> tuple[str, ...] | None:
    """SoC families the documentation lists under 支持的型号, or None if it lists none."""
    text = doc(op) or ""
    at = text.find(SUPPORTED_PRODUCTS)
    if at < 0:
        at = text.find(SUPPORTED_CHIPS)
    if at < 0:
        return None
    found: set[str] = set()
    for product in text[at:].splitlines()[1:]:
        product = product.strip().lstrip("-").strip().removeprefix("<term>").removesuffix(
            "</term>")
        if not product:
            if found:
                break
            continue
        names = family_of(product)
        if not names:
            break
        found |= names
    return tuple(sorted(found)) or None
