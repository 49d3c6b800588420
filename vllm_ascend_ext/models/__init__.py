"""Embedded tiny models (package data), so serving and tests need no download."""

from __future__ import annotations

from pathlib import Path

TINY_QWEN3 = Path(__file__).resolve().parent / "tiny_qwen3"


def tiny_model_path() -> str:
    """Directory of the embedded tiny Qwen3-style model (realistic-scale weights)."""
    return str(TINY_QWEN3)
