"""The graph profile of a side whose target counts its graphs (``[verify.executions]``), from the
``graphs`` of its steps' records (``probe.Graphs``): per step after warm-up, the graphs it
executed, those it compiled and its transfers to the host, the probe's own reads left out, and
for each graph compiled after warm-up, the script's line that changed it (made the first
operation the previous step's graph lacks) and the line that ran it.

A step is counted from its optimizer step to the next one's, as that is where the sync that ends
it (the device loader's or the script's) runs its graph; so the last step recorded is not
counted. The first two steps are the warm-up: the first step's graph compiles, and the second's
again where the first made the optimizer's state (Adam's moments).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from accrewrite.plural import counted

WARM_UP = 2  # steps
# Steps after warm-up that each compile before a run is said to compile in every step.
EVERY_STEP = 2


@dataclass
class Profile:
    """Per step counted after warm-up (``steps``): its graph executions, compilations and
    transfers to the host (None where the target does not count them)."""

    steps: list[int] = field(default_factory=list)
    executions: list[int] = field(default_factory=list)
    compiles: list[int] = field(default_factory=list)
    transfers: list[int] | None = None
    late: dict[str, list[int]] = field(default_factory=dict)  # what changed and ran a graph -> the steps it compiled in
    executions_in_all: int = 0  # every step's, the last's included
    compiles_in_all: int = 0
    ran: int = 0  # graphs executed in all, the probe's included: none, and the side trained on the CPU

    @property
    def every_step(self) -> bool:
        return len(self.steps) >= EVERY_STEP and all(self.compiles)


def profile(records: list[dict], name: Callable[[str], str] = str) -> Profile:
    """The profile of one rank's ``records``; ``name`` gives the user's name of a line the side
    ran (``path:line``)."""
    counts = [record.get("graphs") or {} for record in records]
    last = counts[-1] if counts else {}
    found = Profile(executions_in_all=last.get("executions", 0), compiles_in_all=last.get("compiles", 0),
                    ran=last.get("executions", 0) + (last.get("probe") or {}).get("executions", 0))
    found.transfers = [] if "transfers" in last else None
    for step in range(WARM_UP + 1, len(counts)):  # step's counts: from its record to the next one's
        before, after = counts[step - 1], counts[step]
        found.steps.append(step)
        found.compiles.append(after.get("compiles", 0) - before.get("compiles", 0))
        found.executions.append(after.get("executions", 0) - before.get("executions", 0))
        if found.transfers is not None:
            found.transfers.append(after.get("transfers", 0) - before.get("transfers", 0))
        if found.compiles[-1]:
            # The step's graph as the probe saw it before the step's sync is in the step's own record.
            what = _late(before.get("changed_at", ()), after.get("compiled_at", ()), name)
            found.late.setdefault(what, []).append(step)
    return found


def _late(changed: list[str], ran: list[str], name: Callable[[str], str]) -> str:
    """The line that changed a step's graph and the lines that ran the graphs compiled."""
    said = [f"{name(changed[0])} changed the step's graph"] if changed else []
    if ran:
        said.append(f"{' and '.join(dict.fromkeys(map(name, ran)))} ran it")
    return ", ".join(said) or "no line is known"


def per_step(values: list[int], noun: str) -> str:
    """A mean over the steps counted, one graph per step as ``1 graph execution``."""
    mean = round(sum(values) / len(values), 2)
    return f"{mean:g} {noun if mean == 1 else noun + 's'}"


def describe(side: str, device: str, found: Profile) -> str:
    """One line: what the side ran on the device, in all and per step after warm-up, verify's own
    reads not counted."""
    text = (f"{side}: {counted(found.executions_in_all, 'graph execution')} on the {device} device and "
            f"{counted(found.compiles_in_all, 'compilation')}, verify's own reads not counted; ")
    if not found.steps:
        return text + (f"no step after warm-up to profile (the graphs of a step are counted up to the next "
                       f"step's optimizer step: --steps {WARM_UP + 2} at least)")
    span = f"step {found.steps[0]}" if len(found.steps) == 1 else f"steps {found.steps[0]}-{found.steps[-1]}"
    what = [per_step(found.executions, "graph execution")]
    if found.transfers is not None:
        what.append(per_step(found.transfers, "host transfer"))
    text += f"per step after warm-up ({span}): {', '.join(what)}; "
    text += f"{counted(sum(found.compiles), 'compilation')} after warm-up"
    return text + (f": {sites(found)}" if found.late else "")


def sites(found: Profile) -> str:
    """What changed and ran each graph compiled after warm-up, with its steps."""
    return "; ".join(f"{what} (step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps))})"
                     for what, steps in found.late.items())


def problem(side: str, device: str, found: Profile) -> str | None:
    """Why the side fails although its numbers may match: it ran no graph on the device (it
    trained on the CPU), or it compiles in every step after warm-up."""
    if not found.ran:
        return f"{side} ran no graph on the {device} device: it trained on the CPU"
    if found.every_step:
        return (f"{side} compiles a new graph in every step after warm-up ({sum(found.compiles)} in "
                f"{counted(len(found.steps), 'step')}: {sites(found)}): a shape or a Python number in the step's "
                "graph changes from step to step, and each new graph is compiled again")
    return None
