"""The README and docs/ as a reader meets them: every link leads somewhere, every command they name exists
with the options they give it, and the README stays a page."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from conftest import ROOT
from fleet.cli import cli

DOCS = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file_in_the_repository(doc: Path) -> None:
    for target in LINK.findall(doc.read_text()):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        path = (doc.parent / target.split("#", 1)[0]).resolve()
        assert path.exists(), f"{doc.relative_to(ROOT)} links to {target}, which is not there"


def test_the_readme_is_a_page_and_the_rest_is_in_docs() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def _commands_in(text: str) -> list[list[str]]:
    """`fleet ...` as the text writes it in backticks, placeholders and all."""
    return [shlex.split(m) for m in re.findall(r"`(fleet [^`]+)`", text)]


def _resolve(words: list[str]) -> tuple[click.Command, list[str]]:
    command: click.Command = cli
    rest = words[1:]
    while isinstance(command, click.Group) and rest and rest[0] in command.commands:
        command, rest = command.commands[rest[0]], rest[1:]
    return command, rest


HISTORY = ("CHANGELOG.md", "history.md")  # what was true when written: commands since renamed may appear


@pytest.mark.parametrize("doc", [d for d in DOCS if d.name not in HISTORY], ids=lambda p: p.name)
def test_every_command_a_doc_names_exists_with_the_options_it_gives(doc: Path) -> None:
    """Run with the real command tree: a renamed command or option fails here, not in a reader's shell."""
    for words in _commands_in(doc.read_text()):
        command, rest = _resolve(words)
        assert command is not cli or rest[0].startswith("-"), f"`{shlex.join(words)}`: no such command"
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h", "--version"}
        for word in rest:
            if word.startswith("-") and word != "-":
                assert word.split("=", 1)[0] in options, f"`{shlex.join(words)}`: {word} is not an option"
