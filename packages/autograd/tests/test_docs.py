"""``docs/autograd.md`` shows real output: every example block is what the code prints now."""

from __future__ import annotations

from pathlib import Path

from autograd_docs_examples import examples

DOC = Path(__file__).resolve().parents[3] / "docs" / "autograd.md"


def test_docs_show_current_output():
    text = DOC.read_text()
    stale = [name for name, block in examples().items() if block not in text]
    assert not stale, (f"docs/autograd.md is out of date for {stale}; regenerate the blocks with "
                       "python packages/autograd/tests/autograd_docs_examples.py")
