"""How every accrewrite kernel becomes an operator that compiled graphs call: ``define``.

Inductor does not look inside such an operator: it calls it as an opaque kernel and plans memory
and fusion around it from its fake implementation. The operators are defined on a
``torch.library.Library`` rather than with ``torch.library.custom_op``, whose Python wrapper
cost 100-220 us more per call (at (2048, 256) @ (256, 768), 3-5% of the GEMM).
"""

import torch

_LIBRARY = torch.library.Library("accrewrite", "FRAGMENT")


def define(schema: str, kernels: dict, fake, *, backward=None, setup_context=None, tags=()):
    """Define ``accrewrite::<name>`` by its ``schema``: ``kernels`` by dispatch key ("CPU",
    "CUDA", or "CompositeExplicitAutograd" for any device), ``fake`` for inductor's planning and,
    for an op that autograd differentiates, ``backward`` and ``setup_context`` as
    ``torch.library.register_autograd`` takes them. Returns the operator."""
    name = schema.split("(", 1)[0]
    _LIBRARY.define(schema, tags=tags)
    for key, kernel in kernels.items():
        _LIBRARY.impl(name, kernel, key)
    torch.library.register_fake(f"accrewrite::{name}", fake, lib=_LIBRARY)
    if backward is not None:
        torch.library.register_autograd(
            f"accrewrite::{name}", backward, setup_context=setup_context, lib=_LIBRARY
        )
    return getattr(torch.ops.accrewrite, name)
