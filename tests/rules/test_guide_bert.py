"""The guarded BERT example of TorchAcc's migration guide, reproduced.

``fixtures/guide_bert.guide.txt`` is the example as the guide prints it, its additions marked
``+``. ``fixtures/guide_bert.in.py`` is that example with the additions removed (the original
branches kept). Migrating it with ``--target torchacc --guard TORCHACC_COMPILER_OPT`` must put
every addition of the guide in the corresponding place.
"""

import re
from pathlib import Path

from accrewrite.engine import Options, migrate_source

FIXTURES = Path(__file__).parent / "fixtures"
GUARD = "TORCHACC_COMPILER_OPT"
# The guide's lines that only open or close its guarded branches.
CONTROL = re.compile(r"^(if (not )?enable_torchacc_compiler\(\).*:|else:)$")


def guide_lines() -> list[str]:
    return (FIXTURES / "guide_bert.guide.txt").read_text().splitlines()


def statements(lines):
    """(is addition, function it is in, statement text) for each logical line of the guide."""
    function, pending, result = "<module>", "", []
    for line in lines:
        added = line.startswith("+")
        text = line[1:] if added else line
        if not pending and text and not text[0].isspace():
            header = re.match(r"def (\w+)", text)
            function = header.group(1) if header else "<module>"
        pending += " " + text.strip()
        if pending.count("(") > pending.count(")"):
            continue  # a statement continued on the next line
        result.append((added, function, pending.strip()))
        pending = ""
    return result


def normal(text: str) -> str:
    # One deliberate difference: a step closure that prints runs on the calling thread
    # (run_async=False), so that the printed lines keep their order (ACC009).
    return re.sub(r"\s+", "", text).replace("run_async=True", "run_async=False")


def functions_of(code: str) -> dict[str, str]:
    """Each top-level function's normalised source, and the rest as "<module>"."""
    chunks, name = {"<module>": ""}, "<module>"
    for line in code.splitlines():
        header = re.match(r"def (\w+)", line)
        if header:
            name = header.group(1)
        elif line and not line[0].isspace():
            name = "<module>"
        chunks[name] = chunks.get(name, "") + "\n" + normal(line)
    return chunks


def test_the_input_is_the_guide_without_its_additions():
    kept = [text for added, _, text in statements(guide_lines()) if not added]
    plain = [text for _, _, text in statements((FIXTURES / "guide_bert.in.py").read_text().splitlines())]
    assert [normal(t) for t in kept] == [normal(t) for t in plain]


def test_every_addition_of_the_guide_appears_in_its_place():
    source = (FIXTURES / "guide_bert.in.py").read_bytes()
    result = migrate_source(source, "guide_bert.py", Options(target="torchacc", guard=GUARD))
    assert result.error is None
    output = result.output.decode()
    compile(output, "guide_bert.py", "exec")
    chunks = functions_of(output)
    imported = normal(output)
    missing = []
    for added, function, text in statements(guide_lines()):
        if not added or CONTROL.match(text):
            continue
        wanted = normal(text)
        if text.startswith(("import ", "from ")):
            # The guide imports the target inside its guarded branches; the migration imports it
            # once, in the guarded block after the file's imports, name by name.
            if text.startswith("import "):
                found = normal(text) in imported
            else:
                module, _, names = text.removeprefix("from ").partition(" import ")
                lines = [line for line in output.splitlines() if line.strip().startswith(f"from {module} import ")]
                found = all(
                    any(re.search(rf"\b{name.strip()}\b", line) for line in lines) for name in names.split(",")
                )
        elif text.startswith("xm.set_rng_state("):
            # The guide's constant (101) is arbitrary; any constant makes every worker alike.
            found = re.search(r"xm\.set_rng_state\(\d+\)", chunks[function]) is not None
        else:
            found = wanted in chunks.get(function, "")
        if not found:
            missing.append(f"{function}: {text}")
    assert missing == []
    # The original path is still there, in the else branches.
    assert "else:\n      device = torch.device(f\"cuda:{args.local_rank}\")" in output.replace("    device", "  device") or \
        'device = torch.device(f"cuda:{args.local_rank}")' in output
    assert "model = torch.nn.parallel.DistributedDataParallel(model)" in output


def test_guarded_migration_is_stable():
    source = (FIXTURES / "guide_bert.in.py").read_bytes()
    once = migrate_source(source, "guide_bert.py", Options(target="torchacc", guard=GUARD)).output
    assert migrate_source(once, "guide_bert.py", Options(target="torchacc", guard=GUARD)).output == once
