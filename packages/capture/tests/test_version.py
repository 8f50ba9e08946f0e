"""The version in ``__about__.py`` is the one the installed distribution reports."""

import importlib.metadata

from torchfuse.capture.__about__ import __version__


def test_about_version_matches_installed_metadata():
    assert __version__ == importlib.metadata.version("torchfuse-capture")
