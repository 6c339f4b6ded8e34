"""The README and the docs/ pages cannot rot: their code blocks run, their commands parse with
the real argument parsers, their links resolve (docs/testing.md, "The docs test").

Fences: ``python`` and ``bash`` blocks run (unless a ``<!-- skip: reason -->`` line stands
right before them); ``console`` blocks hold commands too long to run here (they need that
line); ``text`` blocks are output samples and synopses. Every command of a ``bash`` or
``console`` block, and every inline code span that starts like a command, is parsed without
running it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional
from unittest import mock

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGS = {"python", "bash", "console", "text"}
SKIP = re.compile(r"^<!--\s*skip:\s*(\S.*?)\s*-->$")
FENCE = re.compile(r"^```(.*)$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SPAN = re.compile(r"`([^`]+)`")
# Inline spans that are commands: the first word(s) say which parser reads them.
COMMAND_START = re.compile(r"^(mgrit-gru|\./run\.sh|torchrun|python benchmarks/|bash benchmarks/)")
PLACEHOLDER = re.compile(r"^([A-Z][A-Z_]*|\.\.\.|/|\|)$")
BLOCK_TIMEOUT_S = 120


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: Optional[str]  # the reason of a skip marker right before the fence

    @property
    def where(self) -> str:
        return f"{_rel(self.page)}:{self.line}"


@dataclass
class Page:
    blocks: list[Block]
    prose: str  # the text outside fences
    dangling_skips: list[int]  # skip markers not followed by a fence


@functools.cache
def read_page(page: Path) -> Page:
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, prose, dangling = [], [], []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            if SKIP.match(lines[i].strip()) and not (
                i + 1 < len(lines) and FENCE.match(lines[i + 1])
            ):
                dangling.append(i + 1)
            prose.append(lines[i])
            i += 1
            continue
        start = i
        i += 1
        body = []
        while i < len(lines) and lines[i].rstrip() != "```":
            body.append(lines[i])
            i += 1
        i += 1  # the closing fence
        marker = SKIP.match(lines[start - 1].strip()) if start > 0 else None
        blocks.append(
            Block(
                page,
                start + 1,
                match.group(1).strip(),
                "\n".join(body) + "\n",
                marker.group(1) if marker else None,
            )
        )
        prose.append("")
    return Page(blocks, "\n".join(prose), dangling)


def _ids(pages):
    return [_rel(p) for p in pages]


def test_pages_exist():
    assert (ROOT / "README.md").exists() and len(PAGES) > 1, "README.md and docs/*.md expected"


# -- fences ------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_fences_have_known_languages_and_skips_have_reasons(page):
    parsed = read_page(page)
    bad = [f"{b.where}: fence language {b.lang!r}" for b in parsed.blocks if b.lang not in LANGS]
    bad += [
        f"{b.where}: a console block needs a '<!-- skip: reason -->' line before it"
        for b in parsed.blocks
        if b.lang == "console" and not b.skip
    ]
    bad += [f"{_rel(page)}:{n}: skip marker not followed by a fence" for n in parsed.dangling_skips]
    assert not bad, "\n".join(bad)


# -- python blocks -----------------------------------------------------------------------------


PYTHON_PAGES = [p for p in PAGES if any(b.lang == "python" for b in read_page(p).blocks)]


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_ids(PYTHON_PAGES))
def test_python_blocks_run_in_order(page, monkeypatch):
    """A page's python blocks run top to bottom in one namespace, as a reader pastes them."""
    monkeypatch.setenv("MGRIT_GRU_CALIBRATION", "builtin")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    namespace = {"__name__": "__docs__"}
    try:
        with torch.random.fork_rng():  # the examples seed torch: leave the suite's RNG alone
            for block in read_page(page).blocks:
                if block.lang != "python" or block.skip:
                    continue
                code = compile(block.code, block.where, "exec")
                out = io.StringIO()
                try:
                    with contextlib.redirect_stdout(out):
                        exec(code, namespace)
                except Exception as exc:
                    raise AssertionError(
                        f"{block.where}: {type(exc).__name__}: {exc}\n{out.getvalue()}"
                    ) from exc
    finally:
        torch.set_num_threads(threads)


# -- bash blocks -------------------------------------------------------------------------------


BASH_BLOCKS = [b for p in PAGES for b in read_page(p).blocks if b.lang == "bash" and not b.skip]


@pytest.fixture(scope="module")
def scratch_root(tmp_path_factory):
    """The repository root as seen by a command, with every entry linked but run outputs
    (runs/, gpu-check/) left out, so that what a command writes lands here."""
    root = tmp_path_factory.mktemp("repo")
    for entry in ROOT.iterdir():
        if entry.name not in {".git", "runs", "gpu-check"}:
            (root / entry.name).symlink_to(entry)
    return root


@pytest.mark.parametrize("block", BASH_BLOCKS, ids=[b.where for b in BASH_BLOCKS])
def test_bash_blocks_run(block, scratch_root, tmp_path):
    if "source .venv/bin/activate" in block.code and not (ROOT / ".venv/bin/activate").exists():
        pytest.skip("no .venv here (./run.sh or ./test.sh creates it)")
    env = dict(
        os.environ,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        MGRIT_GRU_CALIBRATION="builtin",  # never measure (or cache) a calibration here
        MGRIT_GRU_CACHE=str(tmp_path / "cache"),
        PYTHONDONTWRITEBYTECODE="1",
        OMP_NUM_THREADS="1",
    )
    done = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block.code],
        cwd=scratch_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
    )
    assert done.returncode == 0, (
        f"{block.where} exited {done.returncode}:\n{block.code}\n"
        f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    )


# -- commands parse ----------------------------------------------------------------------------


def _simple_commands(code: str) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, comments dropped,
    split at ``&&``, ``||``, ``;`` and ``|``; leading ``VAR=value`` and ``time`` removed."""
    commands = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in [*words, ";"]:
            if word in {"&&", "||", ";", "|"}:
                while current and (current[0] == "time" or re.match(r"^\w+=", current[0])):
                    current.pop(0)
                if current:
                    commands.append(current)
                current = []
            else:
                current.append(word)
    return commands


def _subparsers(parser: argparse.ArgumentParser) -> dict:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


class _Parsed(Exception):
    pass


@functools.cache
def _script_parser(path: Path) -> argparse.ArgumentParser:
    """The argument parser a benchmark script builds, taken at its ``parse_args`` call (the
    script stops there: nothing runs)."""
    got = {}

    def grab(self, args=None, namespace=None):
        got["parser"] = self
        raise _Parsed

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", grab),
        mock.patch.object(sys, "argv", [str(path)]),
        mock.patch.object(sys, "path", [str(path.parent), *sys.path]),
    ):
        try:
            runpy.run_path(str(path), run_name="__main__")
        except _Parsed:
            pass
    assert "parser" in got, f"{path} builds no argparse parser"
    return got["parser"]


def _resolve(words: list[str]) -> Optional[tuple[str, argparse.ArgumentParser, list[str]]]:
    """(program, parser, argv) for a command this test knows how to parse, else None."""
    from mgrit_gru.cli import build_parser

    head, rest = words[0], words[1:]
    if head in {"python", "python3"} and rest[:2] == ["-m", "mgrit_gru.cli"]:
        head, rest = "mgrit-gru", rest[2:]
    if head == "torchrun":
        if "-m" not in rest or rest[rest.index("-m") + 1 : rest.index("-m") + 2] != [
            "mgrit_gru.cli"
        ]:
            return None  # torchrun of a user's script
        head, rest = "mgrit-gru", rest[rest.index("-m") + 2 :]
    if head == "./run.sh":
        head, rest = "mgrit-gru", rest or ["train"]
    if head == "mgrit-gru":
        return "mgrit-gru", build_parser(), rest
    if head in {"python", "python3"} and rest and rest[0].startswith("benchmarks/"):
        path = ROOT / rest[0]
        assert path.exists(), f"no {rest[0]}"
        return rest[0], _script_parser(path), rest[1:]
    return None


def _check_parses(words: list[str], loose: bool) -> Optional[str]:
    """None if the command parses; else what is wrong. ``loose`` (an inline span with
    placeholders such as ARGS or RUN_DIR): only the subcommand and the flags must exist."""
    if words[0] == "bash" and len(words) > 1 and words[1].endswith(".sh"):
        script = ROOT / words[1]
        if not script.exists():
            return f"no {words[1]}"
        text = script.read_text()
        unknown = [w for w in words[2:] if w.startswith("--") and w.split("=")[0] not in text]
        return f"{words[1]} handles no {unknown}" if unknown else None
    resolved = _resolve(words)
    if resolved is None:
        return None
    program, parser, argv = resolved
    subs = _subparsers(parser)
    sub, rest = parser, argv
    if subs and argv and not PLACEHOLDER.match(argv[0]) and not argv[0].startswith("-"):
        if argv[0] not in subs:
            return f"{program} has no subcommand {argv[0]!r}"
        sub, rest = subs[argv[0]], argv[1:]
    # exact flags: argparse would take an abbreviation (--epoch for --epochs) silently; words
    # after a bare "--" are another program's (a script's pass-through)
    known = sub._option_string_actions
    own = rest[: rest.index("--")] if "--" in rest else rest
    unknown = [w for w in own if w.startswith("--") and w.split("=")[0] not in known]
    if unknown:
        return f"{program}: unknown {unknown}"
    if loose:
        return None
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return f"{program}: {err.getvalue().strip().splitlines()[-1:]}"
    return None


def _page_commands(page: Path) -> list[tuple[str, list[str], bool]]:
    """(where, words, loose) for every command of the page's shell blocks and inline spans."""
    parsed = read_page(page)
    found = []
    for block in parsed.blocks:
        if block.lang in {"bash", "console"}:
            found += [(block.where, words, False) for words in _simple_commands(block.code)]
    for match in SPAN.finditer(parsed.prose):
        text = " ".join(match.group(1).split())
        if not COMMAND_START.match(text) or text == "mgrit-gru":  # the bare name is no command
            continue
        line = parsed.prose.count("\n", 0, match.start()) + 1
        try:
            words = shlex.split(text)
        except ValueError:
            words = text.split()
        loose = any(PLACEHOLDER.match(w) for w in words)
        found.append((f"{_rel(page)}:{line}", words, loose))
    return found


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_commands_parse(page):
    bad = []
    for where, words, loose in _page_commands(page):
        problem = _check_parses(words, loose)
        if problem:
            bad.append(f"{where}: `{shlex.join(words)}`: {problem}")
    assert not bad, "\n".join(bad)


def test_command_check_catches_mistakes():
    """The checker itself: a wrong flag, a bad choice and a missing script are caught."""
    assert _check_parses(["mgrit-gru", "train", "--epochs", "2"], False) is None
    assert _check_parses(["./run.sh", "bench", "--T", "64"], False) is None
    assert _check_parses(["mgrit-gru", "train", "--epoch", "2"], False)
    assert _check_parses(["mgrit-gru", "train", "--solver", "fast"], False)
    assert _check_parses(["mgrit-gru", "trian"], True)
    assert _check_parses(["python", "benchmarks/trained_models.py", "--cfactor", "32"], False)
    assert _check_parses(["bash", "benchmarks/gpu_check.sh", "--dry-runs"], False)
    assert _simple_commands("A=1 time mgrit-gru --help && ./run.sh \\\n bench # c\n") == [
        ["mgrit-gru", "--help"],
        ["./run.sh", "bench"],
    ]


# -- links -------------------------------------------------------------------------------------


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: markup dropped, lower case, punctuation removed, spaces
    to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    anchors, seen = set(), {}
    for line in read_page(page).prose.splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = _slug(match.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_relative_links_resolve(page):
    bad = []
    prose = SPAN.sub("", read_page(page).prose)  # links inside code spans are not links
    for match in LINK.finditer(prose):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            bad.append(f"{_rel(page)}: {target}: no such file")
            continue
        if anchor and file.suffix == ".md" and anchor not in _anchors(file):
            bad.append(f"{_rel(page)}: {target}: no heading with that anchor")
    assert not bad, "\n".join(bad)


def test_no_design_md_citation():
    """The design notes live in docs/design.md; no page cites a file outside the repository."""
    for page in PAGES:
        assert "DESIGN.md" not in page.read_text(encoding="utf-8"), _rel(page)


BENCHMARKS = ROOT / "benchmarks"


def test_benchmarks_index_lists_the_folder():
    """benchmarks/README.md has one row per script in the folder, and no row without one."""
    text = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| `([\w.]+\.(?:py|sh))` \|", text, flags=re.M))
    present = {p.name for p in BENCHMARKS.iterdir() if p.suffix in {".py", ".sh"}}
    assert listed == present, (sorted(present - listed), sorted(listed - present))


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")))
def test_every_benchmark_imports_and_builds_its_parser(script):
    """Every benchmark script imports (a moved module fails here) and builds its argparse
    parser, as its --help would."""
    parser = _script_parser(BENCHMARKS / script)
    assert parser.format_help().startswith("usage:")
