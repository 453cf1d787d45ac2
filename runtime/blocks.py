"""Finding a model's repeated blocks: the unit of regional compilation and of checkpointing."""

from torch import nn


def repeated_blocks(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """The ``nn.ModuleList``/``nn.Sequential`` containers of ``model`` whose children (two or
    more) are all of one class, as ``(qualified name, container)``, outermost first.

    Containers nested inside a found container are not listed: the outer blocks already cover
    them.
    """
    found = []
    covered = []
    for name, module in model.named_modules():
        if any(name.startswith(prefix) for prefix in covered):
            continue
        if isinstance(module, (nn.ModuleList, nn.Sequential)):
            children = list(module.children())
            if len(children) >= 2 and len({type(child) for child in children}) == 1:
                found.append((name, module))
                covered.append(f"{name}." if name else "")
    return found
