"""The library API: results, errors as values, byte preservation, notebook display."""

from __future__ import annotations

import libcst as cst
import pytest
from helpers import CUDA_SCRIPT

from xla_migrate import MigrationResult, migrate, migrate_file


def test_result_fields():
    result = migrate(CUDA_SCRIPT, target="2.9")
    assert isinstance(result, MigrationResult)
    assert result.ok and result.changed and result.error is None
    assert result.target == "2.9"
    assert "torch_xla.device()" in result.code
    assert [c.code for c in result.changes] == ["XLA101"] * 3
    assert result.changes[0].line == 3 and result.changes[0].column == 10
    assert result.runs_on == "torch_xla >= 2.3"
    assert result.source == CUDA_SCRIPT


@pytest.mark.parametrize(("source", "message", "line"), [
    ("def f(:\n", "cannot parse", 1),
    (b"x = '\xff'\n", "not valid utf-8", 1),
    (b"\x00\x01", "binary file", None),
])
def test_bad_input_is_a_result_not_an_exception(source, message, line):
    result = migrate(source)
    assert not result.ok and not result.changed
    assert message in result.error.message and result.error.line == line
    assert result.diff == ""


def test_unknown_target_or_form_raises_as_a_bad_selection_does():
    """A mistake in the call, not in the script: raised, so a caller ignoring ``.error`` cannot write the
    unmigrated input believing it migrated (issue 33)."""
    with pytest.raises(ValueError, match="unknown target '0.1'"):
        migrate(CUDA_SCRIPT, target="0.1")
    with pytest.raises(ValueError, match="data_parallel=bogus: unknown form"):
        migrate(CUDA_SCRIPT, data_parallel="bogus")
    with pytest.raises(ValueError, match="unknown rule code"):
        migrate(CUDA_SCRIPT, select="XLA999")


def test_empty_file_migrates_to_itself():
    result = migrate(b"")
    assert result.ok and not result.changed and result.output_bytes == b""


@pytest.mark.parametrize("data", [
    b"\xef\xbb\xbf" + CUDA_SCRIPT.encode(),
    CUDA_SCRIPT.replace("\n", "\r\n").encode(),
    CUDA_SCRIPT.rstrip().encode(),
    ("# coding: latin-1\n# \u00e9t\u00e9\n" + CUDA_SCRIPT).encode("latin-1"),
    CUDA_SCRIPT.replace("    ", "\t").encode(),
])
def test_untouched_bytes_are_kept(data):
    """Encoding, BOM, CRLF, a missing final newline: only the rewritten lines differ."""
    result = migrate(data)
    output = result.output_bytes
    assert output.startswith(b"\xef\xbb\xbf") == data.startswith(b"\xef\xbb\xbf")
    assert (b"\r\n" in output) == (b"\r\n" in data)
    assert output.endswith(b"\n") == data.endswith(b"\n")
    encoding = "latin-1" if b"latin-1" in data else "utf-8"
    old = set(data.decode(encoding).splitlines())
    new = output.decode(encoding).splitlines()
    kept = [line for line in new if line in old]
    assert len(kept) == len(new) - 4  # 3 rewritten lines + 1 added import
    cst.parse_module(output)


def test_migrate_file_writes_out(tmp_path):
    source = tmp_path / "train.py"
    source.write_text(CUDA_SCRIPT)
    source.chmod(0o755)
    out = tmp_path / "train_xla.py"
    result = migrate_file(source, out)
    assert result.ok and out.read_bytes() == result.output_bytes
    assert out.stat().st_mode & 0o777 == 0o755
    missing = migrate_file(tmp_path / "nope.py")
    assert not missing.ok and "cannot read" in missing.error.message


def test_notebook_display_is_a_coloured_diff_and_the_change_list():
    html = migrate(CUDA_SCRIPT, path="train.py")._repr_html_()
    assert '<span style="color:#1a7f37">+import torch_xla.core.xla_model as xm</span>' in html
    assert '<span style="color:#cf222e">-model = torch.nn.Linear(4, 2).cuda()</span>' in html
    assert "<b>Changes</b>" in html and "<code>XLA101</code> line 4: .cuda() -&gt; .to(device)" in html
    error_html = migrate("def f(:\n")._repr_html_()
    assert "error: script.py:1:" in error_html


def test_select_and_ignore_narrow_the_rules():
    assert not migrate(CUDA_SCRIPT, ignore=["XLA1"]).changed
    assert migrate(CUDA_SCRIPT, select=["xla101"]).changed


SELECTING = "import torch\nmodel = torch.nn.Linear(2, 2).cuda()\nopt = torch.optim.SGD(model.parameters())\nopt.step()\n"


@pytest.mark.parametrize("select", ["XLA1", ["XLA1"], ("XLA1",), "XLA101,XLA102", ["XLA101", "XLA102, XLA103"]])
def test_select_takes_a_string_or_a_list(select):
    codes = {c.code for c in migrate(SELECTING, select=select).changes}
    assert codes == {"XLA101"}  # XLA204 (optimizer step) is left out
    assert {c.code for c in migrate(SELECTING, ignore="XLA1").changes} == {"XLA204"}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"select": "XLA8"}, "select: unknown rule code or prefix: XLA8"),
    ({"select": ["XLA101", "XLA999"]}, "select: unknown rule code or prefix: XLA999"),
    ({"ignore": "E501"}, "ignore: unknown rule code or prefix: E501"),
    ({"select": 101}, "select must be a rule code or prefix, or a list of them (got 101)"),
])
def test_unknown_codes_are_a_value_error(kwargs, message):
    with pytest.raises(ValueError) as raised:
        migrate(SELECTING, **kwargs)
    assert str(raised.value) == message


def test_plain_text_repr_is_a_short_summary():
    result = migrate(CUDA_SCRIPT, path="train.py")
    assert repr(result) == ("<MigrationResult train.py: 3 changes, 0 findings; target sagemaker, "
                            "output runs on torch_xla >= 1.13>")
    assert "\n" not in repr(result) and CUDA_SCRIPT not in repr(result)
    assert repr(migrate("x = 1\n")).startswith("<MigrationResult script.py: nothing to change, 0 findings; ")
    assert repr(migrate("x = (\n", path="bad.py")) == "<MigrationResult bad.py:1:5: cannot parse: '(' was never closed>"
    assert str(result) == result.code  # print(result) still prints the migrated code


# A str is the text itself ------------------------------------------------------------------------------------
def test_a_str_with_a_latin1_cookie_is_not_decoded_again():
    source = '# -*- coding: latin-1 -*-\nname = "caf\u00e9"\n'
    result = migrate(source)
    assert result.ok and result.code == source and result.source == source
    assert result.output_bytes == source.encode("latin-1")
    script = '# -*- coding: latin-1 -*-\nimport torch\nname = "caf\u00e9"\nmodel = Net().cuda()\n'
    edited = migrate(script)
    assert 'name = "caf\u00e9"' in edited.code and "model = Net().to(device)" in edited.code
    assert edited.output_bytes == edited.code.encode("latin-1")
    assert migrate(edited.output_bytes).code == edited.code  # the bytes say what the cookie says


def test_a_str_declaring_ascii_with_other_characters_is_accepted_as_compile_accepts_it():
    source = '# coding: ascii\nimport torch\nname = "\u00e9t\u00e9 \u2603"\nmodel = Net().cuda()\n'
    compile(source, "<str>", "exec")
    result = migrate(source)
    assert result.ok, result.error
    assert 'name = "\u00e9t\u00e9 \u2603"' in result.code and "model = Net().to(device)" in result.code
    assert result.output_bytes == result.code.encode("utf-8")  # ascii cannot hold it


def test_a_leading_bom_in_a_str_is_kept():
    assert migrate("\ufeffx = 1\n").code == "\ufeffx = 1\n"
    result = migrate("\ufeffimport torch\nmodel = Net().cuda()\n")
    assert result.code.startswith("\ufeffimport torch\n") and "Net().to(device)" in result.code
    assert result.code.count("\ufeff") == 1
    assert result.diff.count("\ufeff") == 1 and "\n \ufeffimport torch\n" in result.diff


# Layout libcst does not reprint --------------------------------------------------------------------------------
@pytest.mark.parametrize("as_str", [False, True])
def test_a_form_feed_before_a_rewritten_line_is_kept(as_str):
    source = ("import torch\n\x0cmodel = Net().cuda()\n\ndef f(x):\n    y = 1\n\x0c    return x.cuda()\n"
              "\x0c\nz = 2\n  \x0cw = 3\n")
    result = migrate(source if as_str else source.encode())
    code = result.code
    assert "\x0cmodel = Net().to(device)\n" in code
    assert "\x0c    return x.to(device)\n" in code
    assert code.endswith("\x0c\nz = 2\n  \x0cw = 3\n")  # untouched lines byte for byte
    assert code.count("\x0c") == 4
    compile(code, "<migrated>", "exec")
    assert migrate(result.output_bytes).output_bytes == result.output_bytes


def test_cr_only_line_endings_keep_the_final_cr():
    result = migrate(b"import torch\rmodel = Net().cuda()\r")
    assert result.output_bytes == (b"import torch\rimport torch_xla.core.xla_model as xm\rdevice = xm.xla_device()\r"
                                   b"model = Net().to(device)\r")
    assert migrate(b"import torch\rmodel = Net().cuda()").output_bytes.endswith(b"Net().to(device)")


@pytest.mark.parametrize(("data", "name"), [
    (b"\xff\xfe" + "import torch\n".encode("utf-16-le"), "UTF-16"),
    (b"\xfe\xff" + "import torch\n".encode("utf-16-be"), "UTF-16"),
    (b"\xff\xfe\x00\x00" + "import torch\n".encode("utf-32-le"), "UTF-32"),
])
def test_utf16_is_named_not_called_binary(data, name):
    result = migrate(data)
    assert result.error.message == (f"{name} is not supported: save the file as UTF-8 "
                                    "(Python reads source as UTF-8)")


# Deep nesting ---------------------------------------------------------------------------------------------
DEEP = {
    "nested lists": "x = " + "[" * 150 + "]" * 150 + "\n",  # valid Python; libcst's analysis recursed too deep
    "a long sum": "x = " + "+".join(["1"] * 400) + "\n",
    "joined strings": "x = (" + " ".join(['"a"'] * 600) + ")\n",
    "an attribute chain": "x = a" + ".b" * 1000 + "\n",
    "an 8,000-term sum": "x = " + "+".join(["1"] * 8000) + "\n",  # parsed for minutes, then a segfault
    "3,000 nested lists": "x = " + "[" * 3000 + "]" * 3000 + "\n",  # a segfault in the native parser
    "an elif chain": "if a:\n    pass\n" + "elif a:\n    pass\n" * 400,
}


@pytest.mark.parametrize("shape", sorted(DEEP))
def test_deep_nesting_is_an_input_error_not_an_exception(shape):
    result = migrate("import torch\n" + DEEP[shape])
    assert not result.ok
    if shape == "3,000 nested lists":  # past CPython's own limit: its compile() refuses it first
        assert result.error.message == "cannot parse: too many nested parentheses"
    else:
        assert result.error.message.startswith("too deeply nested for xla-migrate: it takes at most 66 nested")
    assert result.error.line is not None and result.error.line >= 2


def test_recursion_in_the_analysis_is_an_input_error_too():
    """Called with little stack left (deep in a caller's recursion), input the guard lets through can still
    exhaust the recursion limit in libcst's metadata: an error value, never a RecursionError."""
    import sys

    source = "import torch\nmodel = Net().cuda()\nx = " + "+".join(["1"] * 150) + "\n"

    def deep(frames):
        return deep(frames - 1) if frames else migrate(source)

    result = deep(sys.getrecursionlimit() - 250)
    assert not result.ok and result.error.message.startswith("too deeply nested for xla-migrate")
    assert migrate(source).ok


def test_the_verifier_keeps_its_library_names():
    """``from xla_migrate import verify; verify.verify(...)`` (the library use of the verifier, as tests/xla
    runs it inside a torch_xla interpreter) still works now that verify is a package."""
    from xla_migrate import verify
    from xla_migrate.verify import core

    assert verify.verify is core.verify and verify.find_python is core.find_python
    with pytest.raises(AttributeError):
        verify.no_such_name  # noqa: B018
