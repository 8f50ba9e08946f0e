"""Tests run against the installed package; from a plain checkout, fall back to ``src/``."""

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("torchfuse_example_extern") is None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
