"""The README's quickstart, the CI script and the hatch workspace agree with each other."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quickstart_commands() -> list[str]:
    """The lines of the first code block under the README's Quickstart heading."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Quickstart\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, "README.md has no '## Quickstart' section"
    block = re.search(r"^```[a-z]*\n(.*?)^```", section.group(1), re.S | re.M)
    assert block, "the Quickstart section has no code block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def hatch_config() -> dict:
    return tomllib.loads((ROOT / "hatch.toml").read_text())


def test_quickstart_is_two_commands_main_then_test():
    commands = quickstart_commands()
    assert len(commands) == 2, commands
    assert commands[0].startswith("pip install hatch") and commands[0].endswith("hatch run main")
    assert commands[1].startswith("pip install hatch") and commands[1].endswith("hatch run test")


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert quickstart_commands()[1] in [line.strip() for line in ci]


def test_ci_script_is_strict_and_executable():
    path = ROOT / ".ci" / "run"
    text = path.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text
    assert os.access(path, os.X_OK)
    for command in ("hatch run docs", "hatch run lint"):
        assert command in text


def test_quickstart_scripts_are_defined():
    scripts = hatch_config()["envs"]["default"]["scripts"]
    for name in ("main", "test", "docs", "lint", "bench"):
        assert name in scripts, name
    assert (ROOT / scripts["main"].split()[1]).is_file()
    assert scripts["docs"].startswith("mkdocs build --strict")


def test_every_environment_installs_with_pip():
    envs = hatch_config()["envs"]
    assert {"default", "hatch-test"} <= set(envs)
    not_pip = sorted(name for name, env in envs.items() if env.get("installer") != "pip")
    assert not not_pip, f"set installer = 'pip' on {not_pip}: uv would fetch a CUDA torch"


def test_workspace_has_every_package_and_pins_torch():
    default = hatch_config()["envs"]["default"]
    assert default["workspace"]["members"] == ["packages/*"]
    members = sorted(p.parent.name for p in (ROOT / "packages").glob("*/pyproject.toml"))
    assert members == ["autograd", "capture", "graph", "inductor", "runtime"]
    assert "torch==2.13.0" in default["dependencies"]
    assert any(re.fullmatch(r"mkdocs>=1\.6,<2", d) for d in default["dependencies"])
