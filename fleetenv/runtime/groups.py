"""Unwrapping anyio's exception groups.

anyio task groups (and therefore mcp's transports) wrap a single failure in an
``ExceptionGroup``. Callers of a blocking API want the real cause (``ConnectError``, not
``ExceptionGroup([ConnectError])``), so groups with exactly one leaf are peeled here, once.
Groups with several leaves are real concurrent failures and are left alone.
"""

from __future__ import annotations

import sys

if sys.version_info < (3, 11):  # pragma: no cover
    from exceptiongroup import BaseExceptionGroup

__all__ = ["unwrap_group"]


def unwrap_group(exc: BaseException) -> BaseException:
    """Return the single leaf of nested one-member exception groups, else ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
