"""The docs stay true to the repository: every relative link and every repository path a page names
exists, and every `specdeploy` command in the README, docs/ and scripts/ parses against today's CLI
(its options and their values; nothing is run)."""
import re
import shlex
from pathlib import Path

import click
import pytest

from specdeploy.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", ROOT / "lab" / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("lab/notes/*.md")])
SCRIPTS = sorted(ROOT.glob("scripts/*.sh"))
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"`((?:scripts|lab/scripts|lab/notes|lab/runs|specdeploy|tests|docs|examples|deploy)/[\w./*-]+)")
COMMAND = re.compile(r"(?:^|[\s;&|(])(?:\S*/)?specdeploy ((?:[^\n`#|;&<>\\]|\\\n)+)")


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_every_relative_link_and_named_path_exists(page):
    text = page.read_text()
    links = [m.group(1).split("#")[0] for m in LINK.finditer(text) if not m.group(1).startswith(("http", "#", "mailto"))]
    dead = [link for link in links if link and not (page.parent / link).exists()]
    named = [m.group(1).rstrip(".") for m in PATH.finditer(text)]
    missing = [p for p in named if not (list(ROOT.glob(p)) if "*" in p else (ROOT / p).exists())]
    assert not dead and not missing, f"dead links {dead}, missing paths {missing}"


def _commands(text: str) -> list[list[str]]:
    """Each `specdeploy ...` command line: its words up to a comment, pipe or the line's end, with
    shell variables and placeholders standing for one value."""
    found = []
    for m in COMMAND.finditer(text):
        line = m.group(1).replace("\\\n", " ")
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if words and words[0] in main.commands:
            found.append(_without_variables(words))
    return found


def _without_variables(words: list[str]) -> list[str]:
    """A shell variable stands for a value the script gives: a placeholder, or, as a choice's value
    (which only a real value passes), it goes with its option."""
    choices = {name for p in main.commands[words[0]].params if isinstance(p.type, click.Choice) for name in p.opts}
    kept = []
    for word in words:
        if word in ("$@", "$*"):  # the loop's options: checked where they are written
            continue
        if "$" not in word:
            kept.append(word)
        elif kept and kept[-1] in choices:
            kept.pop()
        elif not word.startswith("-"):
            kept.append("PLACEHOLDER")
    return kept


def _sources() -> list[tuple[str, list[str]]]:
    code = re.compile(r"```(?:bash|sh|console)?\n(.*?)```", re.S)
    out = []
    for page in [ROOT / "README.md", *ROOT.glob("docs/*.md")]:
        out += [(_id(page), words) for block in code.findall(page.read_text()) for words in _commands(block)]
    for script in SCRIPTS:
        out += [(_id(script), words) for words in _commands(script.read_text())]
    return out


@pytest.mark.parametrize("source, words", _sources(), ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_every_documented_command_parses_against_the_cli(source, words):
    command = main.commands[words[0]]
    try:
        command.make_context(words[0], words[1:], resilient_parsing=False)
    except click.exceptions.BadParameter as exc:
        if "does not exist" not in str(exc):  # a path the reader makes first (a model, a bundle)
            pytest.fail(f"{source}: `specdeploy {' '.join(words)}`: {exc}")
    except click.UsageError as exc:
        pytest.fail(f"{source}: `specdeploy {' '.join(words)}`: {exc}")


def test_the_scan_finds_the_readmes_commands_and_a_wrong_option():
    readme = [words[0] for source, words in _sources() if source == "README.md"]
    assert {"export", "generate", "serve", "inspect", "bench"} <= set(readme)
    bad = main.commands["export"]
    with pytest.raises(click.UsageError):
        bad.make_context("export", ["model.gguf", "--no-such-option"])
