"""What libcst does not reprint, put back into the output: a form feed in a line's indentation (a page
break: ``\\f`` before a statement, as in Emacs-style sectioned files) and a file's final bare ``\\r`` (files
with old Mac line endings).

libcst drops both when it parses; untouched input comes back as it was anyway (see ``api.migrate``), so
this matters only for output that changed, where every line libcst reprints unchanged must keep its bytes
and a rewritten line keeps its page break. A form feed resets Python's indentation count, so the dropped
part (up to the last form feed) never changes what the line means; it is put back as it was.
"""

from __future__ import annotations

import re

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")
_LOST_PREFIX = re.compile(r"[ \t\f]*\f")
_NEWLINE = re.compile(r"(\r\n|\r|\n)$")


def split_lines(text: str) -> list[str]:
    """Lines with their endings, split where Python splits them (not at ``\\f`` or ``\\v``, as
    ``str.splitlines`` would)."""
    return _LINE.findall(text)


def restore(original: str, reprinted: str, output: str) -> str:
    """``output`` with what libcst dropped from ``original`` put back. ``reprinted`` is libcst's code for the
    unchanged tree of ``original``; ``output`` is its code for the migrated tree."""
    if "\f" in original:
        output = _restore_form_feeds(original, reprinted, output)
    ending = _NEWLINE.search(original)
    if ending and not _NEWLINE.search(reprinted) and output and not _NEWLINE.search(output):
        output += ending.group(1)
    return output


def _restore_form_feeds(original: str, reprinted: str, output: str) -> str:
    before, after = split_lines(original), split_lines(reprinted)
    if len(before) != len(after):
        return output
    # Reprinted line index -> the indentation part libcst dropped from it.
    lost: dict[int, str] = {}
    for index, (old, new) in enumerate(zip(before, after)):
        if old != new:
            match = _LOST_PREFIX.match(old)
            if match and old[match.end():].rstrip("\r\n") == new.rstrip("\r\n"):
                lost[index] = match.group()
    if not lost:
        return output
    import difflib  # here: most files have no page break

    lines = split_lines(output)
    matcher = difflib.SequenceMatcher(None, after, lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for offset in range(i2 - i1):
                if i1 + offset in lost:
                    lines[j1 + offset] = lost[i1 + offset] + lines[j1 + offset]
        elif tag == "replace":
            # A rewritten statement (code inserted around it, perhaps): the page break stays with the line
            # most like the one it was on.
            for index in range(i1, i2):
                if index in lost:
                    target = max(range(j1, j2), key=lambda j: difflib.SequenceMatcher(
                        None, after[index], lines[j], autojunk=False).ratio())
                    lines[target] = lost[index] + lines[target]
    return "".join(lines)
