"""What each expression of a training script holds: a tensor, a Python value, a model, a data
loader, or something unknown.

One data-flow analysis per function (and one for module level), owned by the engine and read by
every rule through ``Facts.values(scope)``. It reads the file through its ``FileFacts``
(``accrewrite.file_model``) and is a forward pass over a function's bindings (assignments, loop
targets, ``with ... as``), repeated until the kinds settle, so a name assigned after its first
use in a loop is known there too. Its kinds are flow-insensitive: a name has one kind in a
function, the join of what it is bound to, where a literal initialiser (``total = 0``, ``best =
1e9``, ``out = {}``, ``scaler = None``) takes the kind of the other bindings (``total += loss``
makes ``total`` a tensor). Where a name is bound follows the paths: the statements that every
path to a statement bound it in last (``bindings_at``), none where a path binds it nowhere (only
one arm of an ``if``, a loop's body, a ``try`` body whose handler goes on, after a ``del``);
``return``, ``raise``, ``break`` and ``continue`` end their path.

Kinds come from what PyTorch code is made of, never from names alone where something better is
known: a batch from a loader, a model's output, ``torch.*`` results and tensor methods are
tensors; ``.item()``, ``len()``, ``int(...)``, argparse options, loop counters, literals and
``torch.load`` results (a checkpoint dict holds Python values too) are not. A function of the file
returns what its ``return`` statements give, and its parameters hold what its callers in the file
pass (an annotation wins). What cannot be known is ``UNKNOWN``, and rules report only what is known:
a diagnostic on a Python number is worse than none.

One module per concern: ``kinds`` (the kinds, and what is known of torch, Python and host
libraries), ``names`` (the names an expression reads or binds), ``options`` (command-line
options), ``flow`` (the walk of one scope's statements), ``expressions`` (an expression's kind
where it is), ``host_reads`` (what reads a tensor's value on the host), ``scope`` (those three as
the one object rules ask), ``calls`` (calls across the file's functions, and each scope's values).
"""


from accrewrite.values.calls import SPAWN_NAMES, FileValues, Spawn, returned_read
from accrewrite.values.kinds import (
    HOST, HOST_USE_NODES, ITERATE_THROUGH, NUMBERS, SYNC_NODES, SYNC_WORDS, TENSORS, Kind, join,
)
from accrewrite.values.names import bound_names, read_chains, read_names, target_names
from accrewrite.values.options import CommandLineOptions, parses_options
from accrewrite.values.scope import ScopeValues

__all__ = [
    "HOST", "HOST_USE_NODES", "ITERATE_THROUGH", "NUMBERS", "SPAWN_NAMES", "SYNC_NODES", "SYNC_WORDS", "TENSORS",
    "CommandLineOptions", "FileValues", "Kind", "ScopeValues", "Spawn", "bound_names", "join", "parses_options",
    "read_chains", "read_names", "returned_read", "target_names",
]
