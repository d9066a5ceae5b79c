"""A rule's documentation from its module docstring (ruff's sections: What it does / Why / Example / Use
instead): what ``xla-migrate rule CODE`` prints, and the top of its generated page in docs/rules/
(tools/gen_docs.py adds the golden fixtures, which are not installed with the package)."""

from __future__ import annotations

import inspect
import sys


def find_rule(code_or_name: str):
    """The rule with this code (any case) or kebab-case name, or None."""
    from ..engine.registry import all_rules

    wanted = code_or_name.strip()
    for rule in every_code():
        if rule.code == wanted.upper() or rule.name == wanted.lower():
            return rule
    return None


def every_code() -> list:
    """Every code the tool can print, sorted: the engine's own (engine/codes.py) and the rules'."""
    from ..engine.codes import ENGINE_CODES
    from ..engine.registry import all_rules

    return sorted([*ENGINE_CODES, *all_rules()], key=lambda rule: rule.code)


def source_path(rule) -> str:
    """Where the rule lives in a checkout: ``transforms/...py`` (shipped as ``xla_migrate.transforms``); an
    engine code's module."""
    if isinstance(getattr(rule, "source", None), str):
        return rule.source
    module = rule.__module__.split(".")
    return "/".join(module[1:]) + ".py" if module[0] == "xla_migrate" else "/".join(module) + ".py"


def docs_path(rule) -> str:
    return f"docs/rules/{rule.code}.md"


def rule_record(rule) -> dict:
    """``--list-rules --format json``: one object per rule."""
    return {"code": rule.code, "name": rule.name, "summary": rule.summary, "fix_safety": rule.fix_safety,
            "targets": list(rule.targets), "on_xla_code": rule.on_xla_code, "source": source_path(rule), "docs": docs_path(rule)}


def rule_page(rule) -> list[str]:
    """The page's lines, Markdown: title, summary, fix safety, targets, source, then the docstring's sections."""
    if isinstance(getattr(rule, "doc", None), str):  # an engine code (engine/codes.py)
        body = rule.doc
    else:
        doc = inspect.getdoc(sys.modules[rule.__module__]) or ""
        _title, _, body = doc.partition("\n")
    lines = [f"# {rule.code} {rule.name}", "", rule.summary + ".", ""]
    on_xla = "yes (it migrates CUDA remnants or only reports)" if rule.on_xla_code else "no (left as it is)"
    lines += [f"- Fix safety: {rule.fix_safety}" + (" (the engine reports it; no rule makes it)"
                                                     if rule.fix_safety == "none" else ""), f"- Targets: {', '.join(rule.targets)}",
              f"- On code that already runs on torch_xla: {on_xla}", f"- Source: `{source_path(rule)}`", ""]
    for paragraph in _sections(body):
        lines += paragraph
    return lines


def _sections(body: str) -> list[list[str]]:
    """Docstring sections ``What it does:`` etc. become headings; indented examples become code blocks."""
    out: list[list[str]] = []
    current: list[str] = []
    in_code = False
    for raw in body.strip("\n").splitlines():
        if raw and not raw.startswith(" ") and raw.endswith(":"):
            _strip_blank_tail(current)
            if in_code:
                current.append("```")
                in_code = False
            if current:
                out.append(current + [""])
            heading = raw[:-1]
            current = [f"## {heading}", ""]
            in_code = heading.lower().startswith(("example", "use instead"))
            if in_code:
                current.append("```python")
            continue
        text = raw[4:] if raw.startswith("    ") else raw
        current.append(text)
    _strip_blank_tail(current)
    if in_code:
        current.append("```")
    if current:
        out.append(current + [""])
    return out


def _strip_blank_tail(lines: list[str]) -> None:
    while lines and not lines[-1].strip():
        lines.pop()
