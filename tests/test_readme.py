"""The README as a newcomer reads it: its first commands, every ``python`` snippet run as written
(on the CPU here, in seconds), and every relative link of the README and ``docs/`` pointing at a
file that exists (the result files the numbers cite among them)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the README's two commands, first in its first code block (.ci/run runs the second's pytest)
COMMANDS = ('pip install ".[train]" && gper train', 'pip install -e ".[test]" && python -m pytest')
#: packages of the optional extras a snippet may import: without them, that snippet is skipped
OPTIONAL = {"stable_baselines3", "gymnasium", "tensordict", "torchrl"}
#: the most lines the README may have: the rest lives in docs/
MAX_LINES = 250


def code_blocks(text: str, language: str) -> list[str]:
    """The fenced code blocks of ``text`` in ``language``, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def relative_links(text: str) -> list[str]:
    """The targets of the Markdown links and images of ``text`` that are not URLs or anchors."""
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


SNIPPETS = code_blocks(README.read_text(), "python")


def test_the_readme_starts_with_its_two_commands_and_stays_short():
    text = README.read_text()
    first = code_blocks(text, "bash")[0].splitlines()
    assert tuple(line.split("#")[0].strip() for line in first[:2]) == COMMANDS
    assert text.index("```bash") < text.index("```python")
    assert "python -m pytest" in (ROOT / ".ci" / "run").read_text()
    assert len(text.splitlines()) <= MAX_LINES


def test_the_readme_has_snippets():
    assert len(SNIPPETS) >= 4


@pytest.fixture
def one_thread():
    """torch on one CPU thread: the snippets' small sizes gain nothing from more on shared cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_every_readme_snippet_runs_as_written(index, tmp_path, monkeypatch):
    path = tmp_path / f"snippet_{index}.py"
    path.write_text(SNIPPETS[index])
    monkeypatch.chdir(tmp_path)  # a snippet may write files (replay.safetensors)
    try:
        runpy.run_path(str(path), run_name="__main__")
    except ModuleNotFoundError as err:
        if err.name is None or err.name.partition(".")[0] not in OPTIONAL:
            raise
        pytest.skip(f"needs {err.name}")


@pytest.mark.parametrize("page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_every_relative_link_points_at_a_file(page):
    missing = [t for t in relative_links(page.read_text()) if t and not (page.parent / t).exists()]
    assert not missing, missing


def test_install_hints_name_what_works_from_a_checkout():
    """gper is not on PyPI: ``pip install "gper[x]"`` fails; ``pip install ".[x]"`` in the checkout works."""
    pages = [README, *(ROOT / "docs").glob("*.md"), *(ROOT / "src").rglob("*.py")]
    stale = [str(p.relative_to(ROOT)) for p in pages if re.search(r"gper\[\w+\]", p.read_text())]
    assert not stale, stale
