"""libcst's ``parse_module`` without the validation of each node it builds.

The native parser builds the tree by calling each node class, and every node's ``__post_init__`` runs its
``_validate`` (parentheses balanced, whitespace where the grammar needs it): about a seventh of a parse.
The parser's output is valid by construction, so the pipeline's own parses skip it. Nodes built anywhere
else are validated as usual: the check is switched off only for the length of the native call. (Another
thread building nodes during that call would skip it as well: the pipeline itself has no such thread.)
"""

from __future__ import annotations

import libcst as cst
from libcst._nodes.base import CSTNode

_validating_post_init = CSTNode.__post_init__


def _trusted_post_init(self: CSTNode) -> None:
    return None


def parse_module(source: str | bytes) -> cst.Module:
    """``cst.parse_module(source)``: the same tree, the same errors."""
    CSTNode.__post_init__ = _trusted_post_init
    try:
        return cst.parse_module(source)
    finally:
        CSTNode.__post_init__ = _validating_post_init
