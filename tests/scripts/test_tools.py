"""scripts/tools/ (they make what the project ships or commits) and scripts/experiments/ (one-off
studies): every script has its line in its folder's README, and every command builds its command
line (``--help``, in-process: no compile, no child process)."""

from __future__ import annotations

import re

import pytest

from tests.support.paths import REPO, load_script

pytestmark = pytest.mark.fast

FOLDERS = ("tools", "experiments")
NOT_COMMANDS = {"fusible_cases.py"}  # the trials scripts/tools/measure_fusible.py runs
SCRIPTS = sorted(p for folder in FOLDERS for p in (REPO / "scripts" / folder).glob("*.py"))


def test_scripts_live_in_tools_or_experiments():
    loose = sorted(p.name for p in (REPO / "scripts").glob("*.py"))
    assert loose == [], f"scripts/ holds {loose}; expected every script in scripts/tools or scripts/experiments"


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_script_has_one_readme_line(folder):
    listed = re.findall(r"^- `([\w]+\.py)`:", (REPO / "scripts" / folder / "README.md").read_text(), re.M)
    present = sorted(p.name for p in (REPO / "scripts" / folder).glob("*.py"))
    assert sorted(listed) == present, f"scripts/{folder}/README.md lists {sorted(listed)}; the folder holds {present}"


@pytest.mark.parametrize("path", [p for p in SCRIPTS if p.name not in NOT_COMMANDS],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_command_prints_its_help(path, capsys):
    module = load_script(path, f"script_{path.stem}")
    with pytest.raises(SystemExit) as exit_:
        module.main(["--help"])
    assert exit_.value.code == 0
    assert "usage:" in capsys.readouterr().out
