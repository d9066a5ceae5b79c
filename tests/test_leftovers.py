"""Dead leftovers of the rules' removals (src/xla_migrate/engine/leftovers.py and the applier): functions the
migration emptied go with their calls, emptied branches and branches made equal fold away; and XLA411's
collectives where it cannot rewrite them."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from xla_migrate import migrate
from xla_migrate.engine.context import Edits
from xla_migrate.engine.records import Change

HEADER = "import atexit\nimport functools\nimport torch\nimport torch.distributed as dist\n\n\n"
MAIN = '\n\nif __name__ == "__main__":\n    main()\n'


def xm_form(body: str, main_guard: bool = True, target: str = "2.9"):
    source = HEADER + textwrap.dedent(body) + (MAIN if main_guard else "")
    form = "xm"
    result = migrate(source, target=target, data_parallel=form, distributed=True)
    assert result.error is None, result.error
    assert not [f for f in result.findings if f.code == "XLA000"], result.findings
    compile(result.code, "out.py", "exec")
    again = migrate(result.code, target=target, data_parallel=form, distributed=True)
    assert again.code == result.code, "not idempotent"
    return result


def kept_findings(result) -> dict[str, str]:
    out = {}
    for finding in result.findings:
        if "its body is only `pass` after the migration, but it is kept" in finding.message:
            out[finding.message.split("(")[0].removeprefix("def ")] = finding.message.split("it is kept: ")[1]
    return out


def test_emptied_functions_go_with_their_statement_calls():
    result = xm_form('''\
        def ddp_setup(rank, world_size):
            """Join the group."""
            dist.init_process_group("nccl", rank=rank, world_size=world_size)
            torch.cuda.set_device(rank)


        def cleanup(): dist.destroy_process_group()


        def setup_all(rank):
            ddp_setup(rank, 2)


        def main():
            setup_all(0)
            model = torch.nn.Linear(2, 2).cuda()
            if True:
                cleanup()
    ''')
    code = result.code
    for gone in ("ddp_setup", "cleanup", "setup_all", "pass"):
        assert gone not in code, code
    messages = [c.message for c in result.changes]
    for name in ("ddp_setup", "cleanup", "setup_all"):
        assert f"removed def {name}(): the migration removed everything it did" in messages
    # the calls are recorded under the code of the removal that emptied the function
    assert {c.code for c in result.changes if "does nothing on XLA" in c.message} == {"XLA404"}
    assert "\n\n\n\ndef main" not in code and "\n\n\ndef main" in code  # one gap where three defs were


@pytest.mark.parametrize(("body", "name", "why"), [
    ("def cleanup():\n    dist.destroy_process_group()\n\n\ndef main():\n    atexit.register(cleanup)\n",
     "cleanup", "it is used as a value, not only called (line 12)"),
    ('__all__ = ["cleanup"]\n\n\ndef cleanup():\n    dist.destroy_process_group()\n\n\ndef main():\n    cleanup()\n',
     "cleanup", "it is exported in __all__"),
    ("class Worker:\n    def close(self):\n        dist.destroy_process_group()\n\n\ndef main():\n    Worker().close()\n",
     "close", "it is a method (its class's interface)"),
    ("@functools.cache\ndef cleanup():\n    dist.destroy_process_group()\n\n\ndef main():\n    cleanup()\n",
     "cleanup", "it is decorated (the decorator may register it)"),
    ("def cleanup():\n    dist.destroy_process_group()\n\n\ndef main():\n    done = cleanup()\n",
     "cleanup", "it is used as a value, not only called (line 12)"),
    ("def cleanup(x):\n    dist.destroy_process_group()\n\n\ndef main():\n    cleanup(open('f'))\n",
     "cleanup", "a call's arguments may have side effects (line 12)"),
    ("def cleanup():\n    dist.destroy_process_group()\n\n\nif True:\n    def cleanup():\n        dist.barrier()\n"
     "\n\ndef main():\n    cleanup()\n", "cleanup", "cleanup is bound more than once"),
])
def test_emptied_functions_used_otherwise_stay_with_a_finding(body, name, why):
    result = xm_form(body)
    assert kept_findings(result).get(name) == why, result.findings
    assert f"def {name}():\n" in result.code or f"def {name}(self):\n" in result.code or f"def {name}(x):\n" in result.code


def test_an_uncalled_function_of_a_module_without_main_block_stays():
    result = xm_form("def cleanup():\n    dist.destroy_process_group()\n\n\ndist.init_process_group('nccl')\n",
                     main_guard=False)
    assert kept_findings(result) == {"cleanup": "nothing in this file calls it, and another module may import it"}
    assert "def cleanup():\n    pass\n" in result.code


def test_single_device_form_and_the_ddp_form_keep_what_still_does_something():
    body = "def cleanup():\n    dist.destroy_process_group()\n\n\ndef main():\n    dist.init_process_group('nccl')\n    cleanup()\n"
    ddp = migrate(HEADER + body + MAIN, target="2.9", data_parallel="ddp")
    assert ddp.data_parallel == "ddp" and "def cleanup():\n    dist.destroy_process_group()" in ddp.code
    assert "    cleanup()\n" in ddp.code


def test_an_if_whose_body_was_removed_keeps_its_else_under_the_negated_test():
    result = xm_form('''\
        def main(distributed, world_size):
            dist.init_process_group("nccl")
            if distributed:
                dist.destroy_process_group()
            else:
                print("one process")
            if world_size > 1:
                dist.destroy_process_group()
            else:
                print("small")
            if distributed:
                print("many")
            else:
                dist.destroy_process_group()
            if distributed:
                dist.destroy_process_group()
            else:
                # the script's comment
                dist.destroy_process_group()
    ''')
    code = result.code
    assert '    if not distributed:\n        print("one process")\n' in code
    assert '    if not (world_size > 1):\n        print("small")\n' in code
    assert '    if distributed:\n        print("many")\n' in code and "else" not in code
    assert "the script's comment" in code  # kept: its comment has nowhere else to go


def test_branches_the_migration_made_equal_fold_into_one():
    result = xm_form('''\
        def main(ddp, rank):
            dist.init_process_group("nccl")
            model = torch.nn.Linear(2, 2).cuda()
            if ddp:
                model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
            if ddp:
                torch.save(model.module.state_dict(), "m.pt")
            else:
                torch.save(model.state_dict(), "m.pt")
            if ddp:
                print("same in the input")
            else:
                print("same in the input")
            if ddp.check():
                x = model.module
            else:
                x = model
    ''')
    code = result.code
    assert '    xm.save(model.state_dict(), "m.pt")\n    if ddp:\n        print("same in the input")\n' in code
    assert "if ddp.check():\n        x = model\n    else:\n        x = model\n" in code  # a call: not pure


def test_a_conditional_expression_made_equal_folds():
    result = xm_form('''\
        def main(ddp, rank):
            dist.init_process_group("nccl")
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2).cuda(), device_ids=[rank])
            kept = "a" if ddp else "a"
            state = model.module.state_dict() if ddp else model.state_dict()
            return state
    ''')
    assert 'kept = "a" if ddp else "a"' in result.code  # the script's own
    assert "    state = model.state_dict()\n" in result.code


def test_derived_edits_are_kept_only_with_the_edits_they_follow_from():
    source, derived, other = (Change(1, 1, "XLA404", m) for m in ("source", "derived", "other"))
    node_a, node_b, node_c = (cst.parse_statement(f"{n}()\n") for n in "abc")
    edits = Edits(remove={node_a: source, node_b: derived, node_c: other}, requires={id(derived): [source]})
    assert set(edits.keeping({id(derived), id(other)}).remove.values()) == {other}
    assert set(edits.keeping({id(source), id(derived)}).remove.values()) == {source, derived}


# XLA411 where it does not rewrite ----------------------------------------------------------------------


def test_collectives_xla411_cannot_rewrite_keep_the_process_group_with_a_finding():
    result = xm_form('''\
        def main(t, out, group):
            dist.init_process_group("nccl")
            gathered = [torch.zeros_like(t)]
            dist.all_gather(gathered, t, group=group)
            work = dist.broadcast(t, 0, async_op=True)
            if t is not None: dist.all_gather(gathered, t)
            dist.all_gather_into_tensor(out, t)
    ''')
    code = result.code
    assert 'dist.init_process_group("xla", init_method="xla://")' in code
    assert "out.copy_(xm.all_gather(t))" in code
    kept = sorted(f.line for f in result.findings if f.code == "XLA404" and "has no xm form here" in f.message)
    assert kept == [10, 11, 12]


def test_all_gather_into_tensor_kept_on_the_xla_group_becomes_all_gather_into_the_outputs_chunks():
    """XLA412 in the xm form: the call XLA411 rewrites is left to it; one with group= stays on the kept xla
    group and becomes dist.all_gather into out's chunks (torch_xla < 2.8 fails on all_gather_into_tensor), on
    both targets: the sagemaker target keeps an xla process group too."""
    result = xm_form('''\
        def main(t, out, group):
            dist.init_process_group("nccl")
            dist.all_gather_into_tensor(out, t)
            dist.all_gather_into_tensor(out, t, group=group)
    ''')
    code = result.code
    assert "    out.copy_(xm.all_gather(t))\n" in code
    assert "    dist.all_gather(list(out.chunk(dist.get_world_size(group))), t, group=group)\n" in code
    assert 'dist.init_process_group("xla", init_method="xla://")' in code
    assert [c.line for c in result.changes if c.code == "XLA412"] == [10]
    sagemaker = xm_form('''\
        def main(t, out, group):
            dist.all_gather_into_tensor(out, t, group=group)
    ''', target="sagemaker")
    assert "    dist.all_gather(list(out.chunk(dist.get_world_size(group))), t, group=group)\n" in sagemaker.code
    assert [c.line for c in sagemaker.changes if c.code == "XLA412"] == [8]


def test_broadcast_on_sagemaker_becomes_collective_broadcast_and_one_whose_value_is_used_is_reported():
    """torch_xla has xm.collective_broadcast since 1.13: the sagemaker target rewrites dist.broadcast too. A
    broadcast whose work handle is used stays on the process group, kept on the xla backend, and is reported."""
    result = xm_form('''\
        def main(t):
            dist.init_process_group("nccl")
            gathered = [torch.zeros_like(t)]
            dist.all_gather(gathered, t)
            dist.broadcast(t, src=0)
            work = dist.broadcast(t, 1)
    ''', target="sagemaker")
    code = result.code
    assert "for gathered_tensor, chunk in zip(gathered, xm.all_gather(t.unsqueeze(0))):" in code
    assert "    xm.collective_broadcast([t], root_ordinal=0)\n" in code
    assert "    work = dist.broadcast(t, 1)\n" in code
    assert 'dist.init_process_group("xla", rank=xm.get_ordinal(), world_size=xm.xrt_world_size())' in code
    reported = [f.message for f in result.findings if f.code == "XLA404"]
    assert len(reported) == 1 and reported[0].startswith("dist.broadcast(t, 1): this torch.distributed "
                                                         "collective has no xm form here"), reported


def test_in_a_project_an_imported_module_keeps_its_emptied_function(tmp_path):
    """dist_utils.py's cleanup() is called in the file and imported by train.py: migrated with the project
    index it stays (train.py calls it); alone, the file's own calls are all there is, and it goes."""
    from xla_migrate.analysis.project import build_index

    utils = ("import torch.distributed as dist\n\n\ndef setup():\n    dist.init_process_group('nccl')\n\n\n"
             "def cleanup():\n    dist.destroy_process_group()\n\n\ndef run():\n    setup()\n    cleanup()\n\n\n"
             'if __name__ == "__main__":\n    run()\n')
    train = "from dist_utils import cleanup, setup\n\nsetup()\ncleanup()\n"
    (tmp_path / "dist_utils.py").write_text(utils)
    (tmp_path / "train.py").write_text(train)
    index = build_index(str(tmp_path), [str(tmp_path / "dist_utils.py"), str(tmp_path / "train.py")])
    path = str(tmp_path / "dist_utils.py")
    with_project = migrate(utils, path=path, project=index, target="sagemaker")
    assert "def cleanup():\n    pass\n" in with_project.code and "def setup():\n    pass\n" in with_project.code
    assert kept_findings(with_project) == {"cleanup": "train.py imports this module (and may call it)",
                                           "setup": "train.py imports this module (and may call it)"}
    alone = migrate(utils, path=path, target="sagemaker")
    assert "def cleanup" not in alone.code and "def setup" not in alone.code and "setup()" not in alone.code
    # run() is emptied too, but XLA407's _mp_fn calls it: kept, and no rewrite is withdrawn by the gate
    assert kept_findings(alone) == {"run": "the migration adds code next to it that uses it"}
    assert not [f for f in alone.findings + with_project.findings if f.code == "XLA000"]
