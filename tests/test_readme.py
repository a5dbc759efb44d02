"""The README's command section matches the parsers: every command and option it shows exists, and every
pipeline option is described."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from beam_pipeline.options import job_flags
from trustbeam.cli import build_parser

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    return README[start:README.index("\n## ", start + 1)]


def commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_line_shown_parses_its_options() -> None:
    block = section("Command line").split("```")[1]
    shown = [line.split()[1:] for line in block.splitlines() if line.startswith("trustbeam ")]
    parsers = commands()
    assert {words[0] for words in shown} <= set(parsers) and len(shown) >= 8
    for command, *words in shown:
        known = {f for a in parsers[command]._actions for f in a.option_strings}
        if parsers[command].get_default("options"):  # run and score take the pipeline options too
            known |= job_flags()
        flags = {w.strip("[]").split("=")[0] for word in words for w in word.split("|") if w.strip("[").startswith("--")}
        assert flags <= known, f"trustbeam {command}: the README shows options it does not have: {flags - known}"


def test_the_pipeline_options_paragraph_names_every_pipeline_option_and_no_other() -> None:
    paragraph = section("Command line").split("Pipeline options")[1].split("\n\n")[0]
    named = set(re.findall(r"`(--[a-z_0-9]+)", paragraph))
    assert named - {"--runner"} == job_flags(), (named ^ job_flags()) - {"--runner"}
