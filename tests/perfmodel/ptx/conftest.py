"""Shared helpers for the PTX front-end tests."""

from __future__ import annotations

from pathlib import Path

NVCC_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "ptx" / "nvcc"

HEADER = ".version 8.0\n.target sm_80\n.address_size 64\n\n"


def kernel(body: str, name: str = "k", params: str = ".param .u64 k_param_0") -> str:
    """A one-kernel module around ``body``; the body's first line is line 7 of the text."""
    return f"{HEADER}.visible .entry {name}({params})\n{{\n{body}\n}}\n"
