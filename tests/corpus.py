"""Where the community scheduler corpus is: ``../shared/corpus`` next to the checkout
(see its README), or the directory named by ``SCHEDSWITCHD_CORPUS``. Tests that need it skip
with a reason when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: The corpus objects (``../shared/corpus/README.md``), in the README's order.
OBJECTS = (
    "bpfland",
    "flash",
    "tickless",
    "lavd",
    "p2dq",
    "k_simple",
    "k_qmap",
    "k_central",
    "k_flatcg",
)


def corpus_dir() -> Path:
    """The corpus directory (it may not exist)."""
    env = os.environ.get("SCHEDSWITCHD_CORPUS")
    return Path(env) if env else REPO.parent / "shared" / "corpus"


def corpus_object(name: str) -> Path:
    """``corpus_object("k_simple")`` -> its ``.bpf.o``; skips the test when absent."""
    path = corpus_dir() / f"{name}.bpf.o"
    if not path.is_file():
        pytest.skip(f"{path} absent (the corpus is ../shared/corpus, or $SCHEDSWITCHD_CORPUS)")
    return path
