"""The documentation runs: every ```python block of README.md and docs/**/*.md is executed.

The blocks of one page run in order in ONE fresh interpreter with a shared namespace (like
the cells of a notebook), against the embedded local Fleet: no ``FLEET_API_KEY``,
``FLEET_BASE_URL`` or ``OPENAI_API_KEY`` in the environment, a temporary directory as the
working directory. A failure names the page, the block number and the line in the page;
the traceback's frames point into the Markdown file itself.

A block that cannot run here (it needs real Fleet, a model key, a cluster) says so on its
first line, visibly, with the reason::

    ```python
    # not run: needs a Fleet API key (FLEET_API_KEY)
    ...
    ```

A ``# not run`` line without a reason fails, and so does a fenced block in any language
other than the few the docs use: ```` ```py ```` or ```` ```python3 ```` would otherwise be
a block that silently never runs. docs/development.md describes the convention.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

#: Info strings a fence may carry. Only ``python`` runs; the others are shown as written.
LANGUAGES = {"python", "bash", "text", "json", "yaml", "toml"}
#: First line of a block that is shown but not run; the reason is required.
NOT_RUN = re.compile(r"^#\s*not[ -]run\b:?\s*(?P<reason>.*)$", re.IGNORECASE)
#: Variables that would take a page off the local Fleet (or give it a model key).
SECRETS = ("FLEET_API_KEY", "FLEET_BASE_URL", "OPENAI_API_KEY")
PAGE_TIMEOUT_S = 240

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    number: int
    """1-based position among the page's fenced blocks of any language."""
    language: str
    line: int
    """Line of the opening fence in the page (1-based)."""
    code: str
    not_run_reason: str | None = None

    @property
    def first_code_line(self) -> int:
        return self.line + 1


def fenced_blocks(text: str) -> list[Block]:
    """Every fenced code block of a Markdown page (CommonMark fences, any indentation)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match or (match["fence"][0] == "`" and "`" in match["info"]):
            i += 1
            continue
        indent, fence = match["indent"], match["fence"]
        language = (match["info"].strip().split() or [""])[0]
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines):
            closing = _FENCE.match(lines[i])
            if (closing and closing["fence"][0] == fence[0]
                    and len(closing["fence"]) >= len(fence) and not closing["info"].strip()):
                break
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        code = "\n".join(body) + "\n"
        first = next((b.strip() for b in body if b.strip()), "")
        marker = NOT_RUN.match(first) if language == "python" else None
        blocks.append(Block(number=len(blocks) + 1, language=language, line=start + 1,
                            code=code,
                            not_run_reason=marker["reason"].strip() if marker else None))
    return blocks


def page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def convention_problems(page: Path, blocks: list[Block]) -> list[str]:
    problems = []
    where = page_id(page)
    for block in blocks:
        if block.language not in LANGUAGES:
            problems.append(
                f"{where}:{block.line}: block {block.number} is fenced as "
                f"{block.language or '(no language)'!r}; use ```python (it runs), or one "
                f"of {sorted(LANGUAGES - {'python'})} for what is only shown")
        if block.not_run_reason is not None and len(block.not_run_reason) < 5:
            problems.append(
                f"{where}:{block.line}: block {block.number} is marked not run without a "
                "reason; write '# not run: <why it cannot run here>'")
    return problems


_DRIVER = r'''
import json, sys, time, traceback

def main():
    spec = json.load(open(sys.argv[1], encoding="utf-8"))
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    for block in spec["blocks"]:
        # Pad with blank lines so line numbers in tracebacks are the page's own.
        source = "\n" * (block["first_line"] - 1) + block["code"]
        started = time.monotonic()
        try:
            exec(compile(source, spec["page"], "exec"), namespace)
        except BaseException:
            print(f"DOCS-FAILED block {block['number']} (line {block['line']})",
                  file=sys.stderr)
            traceback.print_exc()
            sys.stderr.flush()
            sys.exit(1)
        print(f"DOCS-BLOCK {block['number']} {time.monotonic() - started:.2f}s", flush=True)

if __name__ == "__main__":
    main()
'''


def run_page(page: Path, blocks: list[Block], workdir: Path
             ) -> subprocess.CompletedProcess[str]:
    spec = {"page": str(page), "blocks": [
        {"number": b.number, "line": b.line, "first_line": b.first_code_line, "code": b.code}
        for b in blocks]}
    (workdir / "blocks.json").write_text(json.dumps(spec), encoding="utf-8")
    driver = workdir / "run_docs_page.py"
    driver.write_text(_DRIVER, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.run([sys.executable, str(driver), str(workdir / "blocks.json")],
                          cwd=workdir, env=env, capture_output=True, text=True,
                          timeout=PAGE_TIMEOUT_S)


def failure_report(page: Path, proc: subprocess.CompletedProcess[str]) -> str:
    where = page_id(page)
    failed = re.search(r"DOCS-FAILED block (\d+) \(line (\d+)\)", proc.stderr)
    # The innermost frame in the page is the line that raised.
    frames = re.findall(rf'File "{re.escape(str(page))}", line (\d+)', proc.stderr)
    if failed:
        block, line = failed.groups()
        at = f", page line {frames[-1]}" if frames else ""
        head = f"{where}: block {block} (fence at line {line}{at}) failed"
    else:
        head = f"{where}: the page's interpreter exited with status {proc.returncode}"
    return f"{head}\n--- stderr (tail) ---\n{proc.stderr[-4000:]}\n" \
           f"--- stdout (tail) ---\n{proc.stdout[-1500:]}"


@pytest.mark.timeout(PAGE_TIMEOUT_S + 30)
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_page(page: Path, tmp_path: Path) -> None:
    blocks = fenced_blocks(page.read_text(encoding="utf-8"))
    problems = convention_problems(page, blocks)
    assert not problems, "\n".join(problems)
    runnable = [b for b in blocks if b.language == "python" and b.not_run_reason is None]
    if not runnable:
        return
    proc = run_page(page, runnable, tmp_path)
    if proc.returncode != 0:
        pytest.fail(failure_report(page, proc), pytrace=False)


def test_docs_exist() -> None:
    # A glob that found nothing would make every other test here pass vacuously.
    assert len(PAGES) > 10, PAGES
    assert sum(1 for p in PAGES for b in fenced_blocks(p.read_text(encoding="utf-8"))
               if b.language == "python" and b.not_run_reason is None) > 20


#: What the README has a newcomer run once the checkout and its virtualenv exist: the
#: demo on the package alone (no test extras), then the tests on their own install line.
README_COMMANDS = ["pip install -e .", "fleetenv demo", 'pip install -e ".[test]"',
                   "python -m pytest -q"]


def test_readme_commands_are_what_ci_runs() -> None:
    """CI runs exactly the README's commands, in the README's order (a copy would drift):
    so the demo is proven to run on the demo's install line alone."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    shown = [line.split("#")[0].strip() for block in fenced_blocks(readme)
             if block.language == "bash" for line in block.code.splitlines()]
    # The checkout and the virtualenv CI makes its own way, in a temporary directory.
    assert [line for line in shown
            if line and not line.startswith(("git clone", "python3 -m venv"))
            ] == README_COMMANDS
    ci = [line.split("#")[0].strip()
          for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    assert [line for line in ci if line in README_COMMANDS] == README_COMMANDS


def test_readme_links_resolve() -> None:
    """The README is read on GitHub, outside `mkdocs build --strict`: check its links."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into docs/"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_fence_parser() -> None:
    text = "\n".join([
        "intro", "```python", "# not run: needs a Fleet API key", "x = 1", "```",
        "````text", "```python", "inner = 'shown, not parsed'", "```", "````",
        "- item", "", "    ```python", "    y = 2", "    ```", "```py", "z", "```",
        "```python", "# not run", "```",
    ])
    blocks = fenced_blocks(text)
    assert [(b.language, b.line) for b in blocks] == [
        ("python", 2), ("text", 6), ("python", 13), ("py", 16), ("python", 19)]
    assert blocks[0].not_run_reason == "needs a Fleet API key"
    assert blocks[2].code == "y = 2\n" and blocks[2].not_run_reason is None
    problems = convention_problems(ROOT / "README.md", blocks)
    assert len(problems) == 2
    assert "'py'" in problems[0] and "without a reason" in problems[1]
