"""A griffe extension for the API reference: reST roles in docstrings as Markdown code.

fleetenv's docstrings use Sphinx roles (``:class:`~fleetenv.Session```) and ``::`` before
literal blocks. mkdocstrings renders Markdown, where both would show up literally, so this
rewrites them when the docs are built: a role becomes a code span (``~`` keeps only the
last component, as Sphinx does), and a paragraph's closing ``::`` becomes ``:`` (the
indented block after it is already a Markdown code block). The source is not changed.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(\S)::[ \t]*\n([ \t]*\n)")


def _role(match: re.Match[str]) -> str:
    target = match[2].strip()
    if match[1]:
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def rewrite(text: str) -> str:
    text = _ROLE.sub(_role, text)
    return _LITERAL.sub(r"\1:\n\2", text)


class DocstringRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
