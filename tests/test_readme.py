"""README.md works as written: a newcomer's first commands and code.

Every ```python block runs, as it stands, in a fresh Python process whose working folder holds a copy
of ``examples/`` (as the checkout's root does), so a block may read the shipped examples but leaves
nothing in the checkout. Every shell command of the other blocks refers only to files that exist in
the repository or that an earlier command made; the quick start's ``malinn`` and ``python3 -c``
commands run, in order, in such a folder through the ``malinn`` command installed beside this
interpreter (``malinn verify`` only where TensorFlow is installed: it runs Keras). The set-up
commands are not run (they are what runs this test) but must read exactly as ``.ci/run`` and the
newcomer expect.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

#: The two set-up commands, exactly: .ci/run runs the second.
SETUP_COMMANDS = (
    "bash .ci/setup && .venv/bin/python examples/convert_and_predict.py",
    "bash .ci/setup --test && .venv/bin/python -m pytest -q",
)
#: How the README says to get the ``malinn`` command: the environment .ci/setup made.
ACTIVATE = ". .venv/bin/activate"
SHELL_LANGUAGES = ("", "sh", "bash", "shell", "console")
#: A shell word naming a file: a repository path, or a name by its suffix.
PATH_WORD = re.compile(r"^(examples/|\.ci/|\.venv/)|\.(keras|malinn|npy|npz|h5|json|csv|py)$")
#: A quoted file name inside a ``python3 -c`` program.
QUOTED_PATH = re.compile(r"""['"]([\w./-]+\.(?:keras|malinn|npy|npz|h5|json|csv))['"]""")


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """The fenced code blocks of a Markdown text.

    Returns:
        ``(line, language, code)`` per block: the line number of its opening fence (from 1), the
        fence's language (``""`` for none) and the block's text.
    """
    found, language, start, lines = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            if language is None:
                language, start, lines = line[3:].strip(), number, []
            else:
                found.append((start, language, "\n".join(lines) + "\n"))
                language = None
        elif language is not None:
            lines.append(line)
    assert language is None, f"README.md: the code block opened on line {start} is never closed"
    return found


BLOCKS = fenced_blocks(README.read_text())
PYTHON_BLOCKS = [(line, code) for line, language, code in BLOCKS if language == "python"]
SHELL_LINES = [
    (line + i, text.strip())
    for line, language, code in BLOCKS
    if language in SHELL_LANGUAGES
    for i, text in enumerate(code.splitlines(), 1)
    if text.strip()
]


def commands(text: str) -> list[list[str]]:
    """A shell line's commands (``a && b`` is two), each as its words, comments left out."""
    found, words = [], []
    for word in shlex.split(text, comments=True):
        if word == "&&":
            found.append(words)
            words = []
        else:
            words.append(word)
    return found + [words] if words else found


def is_setup(words: list[str]) -> bool:
    """Whether a command sets malinn up (.ci/setup, the virtual environment) rather than uses it."""
    return (
        words[:2] == ["bash", ".ci/setup"]
        or words[0] == "."
        or words[0].startswith(".venv/")
        or words[:3] in (["python3", "-m", "venv"], ["python", "-m", "venv"])
    )


def is_python_c(words: list[str]) -> bool:
    return words[0] in ("python3", "python") and len(words) == 3 and words[1] == "-c"


def malinn_command() -> list[str]:
    """The ``malinn`` console script beside this interpreter (a venv's ``bin/``), else ``python -m malinn``
    where malinn runs from a source folder on ``PYTHONPATH`` and has no script."""
    script = Path(sys.executable).parent / "malinn"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "malinn"]


def copy_examples(folder: Path) -> Path:
    """``folder`` with a copy of the checkout's ``examples/``, as the README's commands see it."""
    shutil.copytree(ROOT / "examples", folder / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def files_in(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_readme_shows_the_set_up_commands_exactly():
    lines = [text for _, text in SHELL_LINES]
    for command in SETUP_COMMANDS + (ACTIVATE,):
        assert command in lines, f"README.md lacks the command line {command!r} in a code block"
    assert PYTHON_BLOCKS, "README.md has no python block"


@pytest.mark.parametrize("line, code", PYTHON_BLOCKS, ids=[f"line{line}" for line, _ in PYTHON_BLOCKS])
def test_readme_python_block_runs_as_written(line, code, tmp_path):
    work = copy_examples(tmp_path)
    (work / "block.py").write_text(code)
    before = files_in(work)
    out = subprocess.run([sys.executable, "block.py"], cwd=work, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, (
        f"README.md's python block at line {line} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}"
    )
    assert files_in(work) == before, "the block wrote files: a newcomer's checkout would keep them"


def test_readme_commands_name_only_files_that_exist_or_an_earlier_command_made(tmp_path):
    """Each shell command in order: its file arguments exist in the repository or were made by an
    earlier command (.ci/setup or ``python3 -m venv`` make ``.venv``). The ``malinn`` and
    ``python3 -c`` commands run in a copy of the examples, as a newcomer runs them in the checkout;
    ``malinn verify`` needs TensorFlow and runs only where it is installed."""
    work = copy_examples(tmp_path)
    made: set[str] = set()  # paths (relative) that an earlier command made
    ran = []
    has_tensorflow = importlib.util.find_spec("tensorflow") is not None
    for line, text in SHELL_LINES:
        for words in commands(text):
            where = f"README.md line {line}: {' '.join(words)}"
            if is_setup(words):
                for word in filter(PATH_WORD.search, words[1:]):
                    assert (ROOT / word).exists() or any(Path(word).is_relative_to(m) for m in made), (
                        f"{where}: {word} is neither in the repository nor made by an earlier command"
                    )
                if words[:2] == ["bash", ".ci/setup"]:
                    made.add(".venv")
                elif words[1:3] == ["-m", "venv"]:
                    made.add(words[3])
                continue
            assert words[0] == "malinn" or is_python_c(words), (
                f"{where}: the test knows how to check malinn and python3 -c commands only"
            )
            names = list(filter(PATH_WORD.search, words[1:]))
            if is_python_c(words):
                names = QUOTED_PATH.findall(words[2])
            before = files_in(work)
            if words[:2] == ["malinn", "verify"] and not has_tensorflow:
                missing = [n for n in names if n not in before]
                assert not missing, f"{where}: {missing} neither in the repository nor made by an earlier command"
                continue
            program = malinn_command() if words[0] == "malinn" else [sys.executable]
            out = subprocess.run(program + words[1:], cwd=work, capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, f"{where} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}"
            after = files_in(work)
            missing = [n for n in names if n not in after]
            assert not missing, f"{where}: {missing} neither in the repository nor made by a command"
            outputs = [words[i + 1] for i, w in enumerate(words[:-1]) if w == "-o"]
            assert all(o in after - before for o in outputs), f"{where}: did not write {outputs}"
            ran.append(words[:2])
    # the quick start a newcomer follows: convert, then predict on the file convert wrote
    assert ["malinn", "convert"] in ran and ["malinn", "predict"] in ran, ran
    assert not has_tensorflow or ["malinn", "verify"] in ran, ran
