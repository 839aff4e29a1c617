"""Every code block of README.md and docs/ runs, or says why it does not.

The line before a block marks it: `<!-- run: python -->`, `<!-- run: torchrun N -->` (a script on N
ranks), `<!-- run: bash -->` (commands, run in a scratch folder that sees examples/ and benchmarks/), or
`<!-- run by: tests/<file>.py -->` (a test there runs it, and names the page), or
`<!-- not run: the reason -->`. Blocks fenced as `text` are output or pictures, not code."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from conftest import users_environment

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"<!-- (run: (?P<run>[^>]*?)|run by: (?P<by>tests/\w+\.py)|not run: (?P<why>[^>]*?)) -->")
FENCE = re.compile(r"^```(\w*)\s*$")
# Each block is a short example; the slowest (elastic training through a kill) takes about a minute here.
BLOCK_TIMEOUT_S = 280
# The front page: a new user finds the two commands in its first screen.
README_MAX_LINES = 200
FIRST_SCREEN_LINES = 50


def blocks(page):
    """(line, language, mark, code) of each fenced block; mark is the comment on the line before, or None."""
    lines = page.read_text().split("\n")
    found, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        before = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
        found.append((index + 1, opening.group(1), MARK.fullmatch(before.strip()), "\n".join(lines[index + 1:end])))
        index = end + 1
    return found


CODE = [pytest.param(page, line, language, mark, code, id=f"{page.relative_to(ROOT)}:{line}")
        for page in PAGES for line, language, mark, code in blocks(page) if language != "text"]


def run(mark, code, folder):
    env = users_environment()
    env.update(PYTHONSAFEPATH="1", PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    how = mark.group("run").split()
    if how[0] == "bash":
        for shared in ("examples", "benchmarks"):
            (folder / shared).symlink_to(ROOT / shared)
        args = ["bash", "-euo", "pipefail", "-c", code]
    else:
        script = folder / "example.py"
        script.write_text(code + "\n")
        args = [sys.executable, str(script)]
        if how[0] == "torchrun":
            args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", how[1], str(script)]
        else:
            assert how == ["python"], f"unknown run mark {mark.group(0)}"
    return subprocess.run(args, cwd=folder, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)


@pytest.mark.timeout(BLOCK_TIMEOUT_S + 20)
@pytest.mark.parametrize("page, line, language, mark, code", CODE)
def test_code_block(page, line, language, mark, code, tmp_path):
    where = f"{page.relative_to(ROOT)}:{line}"
    assert mark is not None, f"{where}: mark the block with <!-- run: ... --> or <!-- not run: why -->"
    if mark.group("why") is not None:
        assert len(mark.group("why").split()) >= 3, f"{where}: say why the block is not run"
        pytest.skip(f"not run: {mark.group('why')}")
    if mark.group("by") is not None:
        runner = ROOT / mark.group("by")
        assert runner.is_file() and str(page.relative_to(ROOT)) in runner.read_text(), (
            f"{where}: {mark.group('by')} should run the block and name {page.relative_to(ROOT)}")
        return
    done = run(mark, code, tmp_path)
    assert done.returncode == 0, f"{where} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def _is_run(mark):
    """Whether a block's mark has it run, here or by another test."""
    return mark is not None and bool(mark.group("run") or mark.group("by"))


def test_the_pages_have_code_blocks_to_run():
    """The parser found the blocks (a test that finds nothing would pass anyway), and every docs page opens
    with its summary and a runnable example before anything else."""
    ran = [page for page, _, _, mark, _ in (p.values for p in CODE) if _is_run(mark)]
    assert len(ran) >= 15, ran
    for page in PAGES[1:]:
        first = next(block for block in blocks(page) if block[1] != "text")
        text = page.read_text()
        assert _is_run(first[2]), f"{page.name}: the first example is not run"
        assert text.index("```") > text.index("\n\n") > 0, f"{page.name}: a summary comes before the example"


def test_the_front_page_is_short_and_starts_with_what_to_run():
    lines = (ROOT / "README.md").read_text().split("\n")
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"
    first_screen = "\n".join(lines[:FIRST_SCREEN_LINES])
    assert "make test" in first_screen and "make bench" in first_screen


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_links_between_pages_resolve(page):
    for link in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
        assert (page.parent / link).exists(), f"{page.name} links to {link}, which does not exist"
