"""Bad input gets a clear error and loses nothing; good input keeps its bytes' conventions."""

import os
import socket
import stat

import pytest

from accrewrite.engine import Options, migrate_source
from accrewrite.runner import Job, process

BODY = 'torch.manual_seed(0)\nmodel = model.cuda()\n'


def migrate_file(tmp_path, name, data, mode="in-place"):
    path = tmp_path / name
    path.write_bytes(data)
    return path, process(Job(path), Options(), mode)


@pytest.mark.parametrize(
    "source, line, words",
    [
        (b"import torch\n\ndef f(:\n    pass\n", 3, "syntax error"),
        (b"import torch\nx = (1,\n", 2, "syntax error"),
        (b"import torch\nif x:\nreturn\n", 3, "syntax error"),
        # rejected by the compiler rather than the parser, in a file a rule changes and in one it does not
        (b"import torch\n\ndef f(model, model):\n    return model.cuda()\n", 3, "duplicate argument 'model'"),
        (b"import torch\n\ndef f(model, model):\n    return model\n", 3, "duplicate argument 'model'"),
        (b"import torch\nmodel = torch.nn.Linear(2, 2).cuda()\nreturn model\n", 3, "'return' outside function"),
        (b"import torch\nnonlocal x\n", 2, "nonlocal declaration not allowed at module level"),
    ],
)
def test_syntax_errors_name_line_and_reason(source, line, words):
    result = migrate_source(source, "bad.py")
    assert result.error is not None and result.error.line == line
    assert words in result.error.reason and "fix it" in result.error.reason
    assert not result.changed


def test_undecodable_bytes_name_the_line(tmp_path):
    path, outcome = migrate_file(tmp_path, "bad.py", b"import torch\nx = 'caf\xe9'\n")
    assert outcome.error.line == 2 and "utf-8" in outcome.error.reason and "coding cookie" in outcome.error.reason
    assert path.read_bytes() == b"import torch\nx = 'caf\xe9'\n"


def test_latin1_with_coding_cookie_is_kept(tmp_path):
    source = ("# -*- coding: latin-1 -*-\nimport torch\n# café\n" + BODY).encode("latin-1")
    path, outcome = migrate_file(tmp_path, "latin.py", source)
    assert outcome.error is None and outcome.written
    data = path.read_bytes()
    assert "# café".encode("latin-1") in data
    assert data.decode("latin-1").startswith("# -*- coding: latin-1 -*-\nimport torch\n")
    compile(data, "latin.py", "exec")


def test_bom_and_crlf_are_kept(tmp_path):
    source = b"\xef\xbb\xbf" + ("import torch\n" + BODY).replace("\n", "\r\n").encode()
    path, outcome = migrate_file(tmp_path, "bom.py", source)
    data = path.read_bytes()
    assert outcome.written and data.startswith(b"\xef\xbb\xbf")
    assert b"\n" not in data.replace(b"\r\n", b"")  # every newline, new lines included, is CRLF
    assert b"xm.set_rng_state(0)\r\n" in data


def test_tabs_indentation_is_kept(tmp_path):
    source = b"import torch\n\ndef main():\n\tif True:\n\t\ttorch.manual_seed(0)\n\t\ttorch.cuda.set_device(0)\n"
    path, outcome = migrate_file(tmp_path, "tabs.py", source)
    data = path.read_bytes()
    assert b"\t\txm.set_rng_state(0)\n" in data and b"set_device" not in data
    compile(data, "tabs.py", "exec")


def test_removing_the_only_statement_of_a_block_leaves_pass():
    result = migrate_source(b"import torch\nif ok:\n    torch.cuda.set_device(0)\nx = 1\n")
    assert result.output == b"import torch\nif ok:\n    pass\nx = 1\n"


def test_empty_file():
    result = migrate_source(b"", "empty.py")
    assert result.error is None and not result.changed


def test_read_only_file_is_an_error_and_untouched(tmp_path):
    path = tmp_path / "ro.py"
    path.write_bytes(b"import torch\n" + BODY.encode())
    path.chmod(0o444)
    outcome = process(Job(path), Options(), "in-place")
    assert outcome.error is not None and "read-only" in outcome.error.reason
    assert path.read_bytes() == b"import torch\n" + BODY.encode()


def test_file_mode_is_kept(tmp_path):
    path = tmp_path / "run.py"
    path.write_bytes(b"#!/usr/bin/env python\nimport torch\n" + BODY.encode())
    path.chmod(0o751)
    outcome = process(Job(path), Options(), "in-place")
    assert outcome.written
    assert stat.S_IMODE(path.stat().st_mode) == 0o751
    assert not [name for name in os.listdir(tmp_path) if name != "run.py"]  # no temporary left


def test_unwritable_directory_is_an_error_and_loses_nothing(tmp_path, monkeypatch):
    path = tmp_path / "train.py"
    original = b"import torch\n" + BODY.encode()
    path.write_bytes(original)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / f".train.py.{socket.gethostname()}.{os.getpid()}.0a1b.tmp"))

    monkeypatch.setattr("accrewrite.runner.write_atomically", refuse)
    outcome = process(Job(path), Options(), "in-place")
    assert outcome.error.reason.startswith(f"cannot write in {tmp_path}: Permission denied; make it writable")
    assert path.read_bytes() == original


def test_a_failed_write_leaves_the_original(tmp_path, monkeypatch):
    path = tmp_path / "train.py"
    original = b"import torch\n" + BODY.encode()
    path.write_bytes(original)

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("accrewrite.base.atomic_file.os.replace", fail)
    outcome = process(Job(path), Options(), "in-place")
    assert "No space left" in outcome.error.reason
    assert path.read_bytes() == original
    assert os.listdir(tmp_path) == ["train.py"]


@pytest.mark.slow
def test_one_megabyte_file(tmp_path):
    chunk = "def block_{i}(x):\n    # a comment\n    return x.cuda() + {i}\n\n"
    source = "import torch\n" + "".join(chunk.format(i=i) for i in range(16000))
    assert len(source) > 1_000_000
    path, outcome = migrate_file(tmp_path, "big.py", source.encode())
    assert outcome.error is None and len(outcome.fixes) == 16000
    data = path.read_text()
    assert data.count(".to(xm.xla_device())") == 16000 and "# a comment" in data


def test_a_rule_that_crashes_fails_its_file_only(tmp_path, monkeypatch):
    from accrewrite.registry import all_rules

    rule = all_rules()["ACC001"]

    def crash(self, original_node, updated_node):
        if b"crash" in self.ctx.source_text.encode():
            raise RuntimeError("boom")
        return updated_node

    monkeypatch.setattr(rule, "leave_SimpleStatementLine", crash)
    bad = tmp_path / "crash.py"
    bad.write_bytes(b"import torch\n# crash\ntorch.manual_seed(0)\n")
    good = tmp_path / "good.py"
    good.write_bytes(b"import torch\nmodel = model.cuda()\n")
    outcomes = [process(Job(path), Options(), "in-place") for path in (bad, good)]
    assert "internal error (RuntimeError: boom)" in outcomes[0].error.reason
    assert bad.read_bytes() == b"import torch\n# crash\ntorch.manual_seed(0)\n"
    assert outcomes[1].error is None and outcomes[1].written
