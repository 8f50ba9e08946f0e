"""The capture settings: environment parsing and temporary patches."""

from __future__ import annotations

import pytest
from torchfuse.capture import config
from torchfuse.capture.config import from_environment


def test_environment_parsing():
    c = from_environment({"TORCHFUSE_RECOMPILE_LIMIT": "3", "TORCHFUSE_RAISE_ON_RECOMPILE": "1"})
    assert c.recompile_limit == 3 and c.raise_on_recompile_limit
    d = from_environment({})
    assert d.recompile_limit == 8 and not d.raise_on_recompile_limit


def test_patch_restores_and_rejects_unknown():
    before = config.recompile_limit
    with config.patch(recompile_limit=1):
        assert config.recompile_limit == 1
    assert config.recompile_limit == before
    with pytest.raises(AttributeError, match="unknown capture settings"):
        with config.patch(no_such_setting=1):
            pass
