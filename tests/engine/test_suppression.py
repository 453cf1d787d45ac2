from accrewrite.engine import migrate_source


def test_skip_file_leaves_the_file_alone():
    source = b"# accrewrite: skip-file\nimport torch\nmodel = model.cuda()\n"
    result = migrate_source(source)
    assert not result.changed and result.fixes == []


def test_noqa_suppresses_only_the_named_code_on_that_line():
    source = (
        b"import torch\n"
        b"torch.manual_seed(0)  # noqa: ACC001\n"
        b"model = model.cuda()  # noqa: ACC001\n"
        b"x = x.cuda()  # noqa: ACC002, E501\n"
    )
    result = migrate_source(source)
    text = result.output.decode()
    assert "torch.manual_seed(0)  # noqa: ACC001" in text
    assert "model = model.to(xm.xla_device())  # noqa: ACC001" in text
    assert "x = x.cuda()  # noqa: ACC002, E501" in text
    assert [fix.line for fix in result.fixes] == [3]


def test_noqa_in_a_string_suppresses_nothing():
    # Only comments count, as in ruff: a string that says "# noqa" is text.
    source = (
        b"import torch\n"
        b'model = model.cuda(); note = "# noqa: ACC002"\n'
        b'HELP = """\n'
        b"x = x.cuda()  # noqa: ACC002\n"
        b'"""; x = x.cuda()\n'
    )
    result = migrate_source(source)
    assert [fix.line for fix in result.fixes] == [2, 5]


def test_noqa_on_a_multiline_statement():
    source = b"import torch\nmodel = Net(\n    depth=2,\n).cuda()  # noqa: ACC002\n"
    assert not migrate_source(source).changed


def test_files_that_never_mention_torch_are_not_parsed(monkeypatch):
    import accrewrite.engine as engine

    def fail(*args):
        raise AssertionError("parsed")

    monkeypatch.setattr(engine, "_parse", fail)
    assert not migrate_source(b"import numpy as np\nx = np.zeros(3)\n").changed
