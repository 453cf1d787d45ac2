"""What each expression of a training script holds: a tensor, a Python value, a model, a data
loader, or something unknown.

One data-flow analysis per function (and one for module level), owned by the engine and read by
every rule through ``Facts.values(scope)``. It is a forward pass over a function's bindings
(assignments, loop targets, ``with ... as``), repeated until the kinds settle, so a name
assigned after its first use in a loop is known there too. Its kinds are flow-insensitive: a
name has one kind in a function, the join of what it is bound to, where a literal initialiser
(``total = 0``, ``best = 1e9``, ``out = {}``, ``scaler = None``) takes the kind of the other
bindings (``total += loss`` makes ``total`` a tensor). Where a name is bound follows the paths:
the statements that every path to a statement bound it in last (``bindings_at``), none where a
path binds it nowhere (only one arm of an ``if``, a loop's body, a ``try`` body whose handler
goes on, after a ``del``); ``return``, ``raise``, ``break`` and ``continue`` end their path.

Kinds come from what PyTorch code is made of, never from names alone where something better is
known: a batch from a loader, a model's output, ``torch.*`` results and tensor methods are
tensors; ``.item()``, ``len()``, ``int(...)``, argparse options, loop counters, literals and
``torch.load`` results (a checkpoint dict holds Python values too) are not. A function of the file
returns what its ``return`` statements give, and its parameters hold what its callers in the file
pass (an annotation wins). What cannot be known is ``UNKNOWN``, and rules report only what is known:
a diagnostic on a Python number is worse than none.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType

import libcst as cst

from accrewrite.nodes import children, descendants, dotted, node_types, string_value, walk
from accrewrite.persistent import PersistentMap, merge
from accrewrite.targets import spelled_callees


class Kind(enum.Enum):
    TENSOR = "tensor"  # a tensor, or a batch/container holding tensors
    MASK = "mask"  # a boolean tensor
    # A list, tuple or dict known to hold tensors (``res.append(t)``, ``out[k] = t``,
    # ``model.state_dict()``): read like a tensor, but its truth value is its length.
    HOLDER = "container of tensors"
    CPU = "cpu tensor"  # a tensor made on the host and never moved: reading it waits for nothing
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    STR = "str"
    NONE = "None"
    PYTHON = "python"  # another host value holding no tensor: a list of numbers, a numpy array
    MODEL = "model"  # an nn.Module: calling it gives tensors
    LOADER = "loader"  # an iterable of batches
    UNKNOWN = "unknown"


TENSORS = frozenset({Kind.TENSOR, Kind.MASK, Kind.HOLDER})
NUMBERS = frozenset({Kind.INT, Kind.FLOAT, Kind.BOOL})
HOST = frozenset({*NUMBERS, Kind.STR, Kind.NONE, Kind.PYTHON})

# Tensor attributes known on the host without waiting for the device.
META_ATTRS = MappingProxyType({
    "shape": Kind.PYTHON, "dtype": Kind.PYTHON, "device": Kind.PYTHON, "layout": Kind.PYTHON,
    "names": Kind.PYTHON, "ndim": Kind.INT, "requires_grad": Kind.BOOL, "is_cuda": Kind.BOOL,
    "is_leaf": Kind.BOOL, "grad_fn": Kind.PYTHON, "is_sparse": Kind.BOOL,
})
META_METHODS = MappingProxyType({
    "size": Kind.PYTHON, "dim": Kind.INT, "numel": Kind.INT, "nelement": Kind.INT,
    "element_size": Kind.INT, "get_device": Kind.INT, "stride": Kind.PYTHON,
    "is_contiguous": Kind.BOOL, "is_floating_point": Kind.BOOL, "data_ptr": Kind.INT,
})
# Methods that copy a tensor's value to the host (the caller waits for the device).
SYNC_METHODS = MappingProxyType({"item": Kind.FLOAT, "tolist": Kind.PYTHON, "numpy": Kind.PYTHON, "cpu": Kind.TENSOR})
# Builtins that read a tensor's value when given one, and what they give.
SYNC_BUILTINS = MappingProxyType({
    "float": Kind.FLOAT, "int": Kind.INT, "bool": Kind.BOOL, "str": Kind.STR, "repr": Kind.STR,
    "format": Kind.STR, "round": Kind.FLOAT,
})
_BUILTIN_KINDS = MappingProxyType({
    "len": Kind.INT, "id": Kind.INT, "hash": Kind.INT, "ord": Kind.INT, "isinstance": Kind.BOOL,
    "issubclass": Kind.BOOL, "hasattr": Kind.BOOL, "callable": Kind.BOOL, "any": Kind.BOOL, "all": Kind.BOOL,
    # A set compares its members by identity and hash, not by their values.
    "set": Kind.PYTHON, "frozenset": Kind.PYTHON,
    "print": Kind.NONE, "open": Kind.PYTHON, "type": Kind.PYTHON, "range": Kind.PYTHON, "chr": Kind.STR,
    "input": Kind.STR, "vars": Kind.PYTHON, "dir": Kind.PYTHON, "locals": Kind.PYTHON, "globals": Kind.PYTHON,
})
# Builtins whose result holds what their argument holds.
_PASS_THROUGH = frozenset({"list", "tuple", "sorted", "reversed", "iter", "abs", "dict"})
# Builtins and wrappers whose elements are their first argument's elements (tqdm(loader), ...).
ITERATE_THROUGH = frozenset({"iter", "list", "tuple", "sorted", "reversed", "tqdm", "trange", "islice", "cycle"})
# torch namespaces whose functions return Python values or objects, not tensors.
_HOST_TORCH = (
    "torch.cuda.", "torch.distributed.", "torch.backends.", "torch.utils.", "torch.optim.",
    "torch.accelerator.", "torch.mps.", "torch.xpu.", "torch.multiprocessing.", "torch.hub.",
    "torch.jit.", "torch.onnx.", "torch.profiler.", "torch.amp.", "torch.autograd.profiler",
    "torch.__future__.",
)
_HOST_TORCH_FUNCTIONS = MappingProxyType({
    "torch.load": Kind.UNKNOWN, "torch.device": Kind.PYTHON, "torch.is_tensor": Kind.BOOL,
    "torch.is_floating_point": Kind.BOOL, "torch.is_grad_enabled": Kind.BOOL, "torch.get_num_threads": Kind.INT,
    "torch.initial_seed": Kind.INT, "torch.seed": Kind.INT, "torch.manual_seed": Kind.PYTHON,
    "torch.get_default_dtype": Kind.PYTHON, "torch.no_grad": Kind.PYTHON, "torch.enable_grad": Kind.PYTHON,
    "torch.inference_mode": Kind.PYTHON, "torch.autocast": Kind.PYTHON, "torch.set_grad_enabled": Kind.PYTHON,
    "torch.Generator": Kind.PYTHON, "torch.equal": Kind.BOOL, "torch.allclose": Kind.BOOL, "torch.Size": Kind.PYTHON, "torch.finfo": Kind.PYTHON,
    "torch.iinfo": Kind.PYTHON, "torch.save": Kind.NONE, "torch.compile": Kind.MODEL,
    "torch.set_float32_matmul_precision": Kind.NONE, "torch.get_rng_state": Kind.TENSOR,
    "torch.nn.utils.clip_grad_norm_": Kind.TENSOR, "torch.utils.data.DataLoader": Kind.LOADER,
    "torch.utils.data.dataloader.DataLoader": Kind.LOADER, "torch.distributed.get_rank": Kind.INT,
    "torch.distributed.get_world_size": Kind.INT, "torch.distributed.is_initialized": Kind.BOOL,
    "torch.distributed.is_available": Kind.BOOL, "torch.cuda.is_available": Kind.BOOL,
    "torch.cuda.device_count": Kind.INT, "torch.cuda.current_device": Kind.INT,
    "torch.cuda.is_bf16_supported": Kind.BOOL, "torch.cuda.memory_allocated": Kind.INT,
    "torch.cuda.max_memory_allocated": Kind.INT, "torch.cuda.memory_reserved": Kind.INT,
    "torch.cuda.max_memory_reserved": Kind.INT, "torch.accelerator.is_available": Kind.BOOL,
    "torch.accelerator.device_count": Kind.INT, "torch.accelerator.current_device_index": Kind.INT,
})
# Host modules: their functions give host values.
_HOST_MODULES = ("math.", "time.", "os.", "random.", "numpy.", "datetime.", "json.", "pickle.", "sys.",
                 "re.", "socket.", "platform.", "subprocess.", "shutil.", "glob.", "pathlib.", "logging.",
                 "statistics.", "itertools.count", "string.", "argparse.", "yaml.", "inspect.")
# Libraries whose functions take host arrays: a tensor given to them must be on the host (numpy
# converts it with ``.numpy()``, PIL and OpenCV take numpy arrays). torchvision's image writers
# copy a tensor to the host themselves.
_HOST_ARRAY_CALLS = ("numpy.", "PIL.", "cv2.", "scipy.", "sklearn.", "skimage.", "matplotlib.")
# Tensor methods that give what is known without the tensor's values, a number read from it or
# a copy elsewhere: what they give is no longer the tensor (``.to(dtype)`` alone converts it).
_NOT_ITS_VALUES = frozenset({*META_METHODS, "item", "tolist", "cpu", "cuda", "to"})
# The nodes ``ScopeValues.host_use`` answers for; it gives None for any other.
HOST_USE_NODES = frozenset({cst.Call, cst.Subscript, cst.BinaryOperation, cst.Comparison, cst.AugAssign, cst.Assign})
_MODEL_ANNOTATIONS = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})
# What a value annotated with a torch class holds.
_ANNOTATION_KINDS = MappingProxyType({
    **dict.fromkeys(("torch.Tensor", "torch.FloatTensor", "torch.LongTensor", "torch.BoolTensor"), Kind.TENSOR),
    **dict.fromkeys(_MODEL_ANNOTATIONS, Kind.MODEL),
    **dict.fromkeys(("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"), Kind.LOADER),
})
_PLAIN_ANNOTATIONS = MappingProxyType({"int": Kind.INT, "float": Kind.FLOAT, "bool": Kind.BOOL, "str": Kind.STR})
# A model's members that give the model itself, and those that give its tensors.
_MODEL_SELF = frozenset({"to", "cuda", "cpu", "train", "eval", "half", "float", "bfloat16", "double",
                         "requires_grad_", "module", "_orig_mod"})
_MODEL_TENSORS = frozenset({"parameters", "buffers", "weight", "bias"})
_MODEL_ATTRIBUTES = MappingProxyType({**dict.fromkeys(_MODEL_SELF, Kind.MODEL), **dict.fromkeys(_MODEL_TENSORS, Kind.TENSOR)})
# What a model's methods give; another (``estimate_mfu``) gives what the file's class returns.
_MODEL_METHODS = MappingProxyType({
    **_MODEL_ATTRIBUTES, "forward": Kind.TENSOR, "__call__": Kind.TENSOR, "named_parameters": Kind.TENSOR,
    "state_dict": Kind.HOLDER,
})
_NAMED_ITEMS = frozenset({"items", "named_parameters", "named_buffers", "named_modules", "named_children"})
# torch functions that make a tensor (on the host, unless given a device).
_FACTORIES = frozenset({
    "zeros", "ones", "full", "empty", "randn", "rand", "randint", "randperm", "arange", "linspace", "eye",
    "tensor", "as_tensor", "from_numpy", "zeros_like", "ones_like", "Tensor", "LongTensor", "FloatTensor",
})
# Methods that put their argument into a container.
_ADDS = frozenset({"append", "extend", "insert", "add", "appendleft"})
_STRING_METHODS = frozenset({"format", "join", "strip", "lower", "upper", "replace", "rjust", "ljust", "center"})
# What scripts name their parsed options.
_OPTION_NAMESPACES = frozenset({"args", "opt", "opts", "cfg", "config", "hparams", "flags"})
_ARGPARSE_TYPES = MappingProxyType({"int": Kind.INT, "float": Kind.FLOAT, "str": Kind.STR, "bool": Kind.BOOL})


# torch functions whose first argument is a sequence of tensors.
_JOINING = frozenset({"torch.cat", "torch.concat", "torch.concatenate", "torch.stack"})

# What makes a Hugging Face metric: its add_batch/add/compute turn the tensors given into numpy.
METRIC_LOADERS = frozenset({"evaluate.load", "datasets.load_metric"})
METRIC_READS = frozenset({"add_batch", "add", "compute"})
# Host modules whose functions read a tensor given as a number (``math.exp(loss)``).
_NUMBER_MODULES = ("math.", "statistics.")

# torch.cuda.synchronize() and the targets' spellings of it (xm.wait_device_ops()).
_WAITS = frozenset({"torch.cuda.synchronize", *spelled_callees("synchronize")})
# The words of the host reads that ``ScopeValues.sync`` finds (a rule's trigger words), and the
# nodes that read a tensor's value without a word of their own (its truth value, an f-string).
SYNC_WORDS = frozenset({
    *SYNC_METHODS, *SYNC_BUILTINS, "max", "min", "tensor", "as_tensor", *METRIC_READS,
    *(module.rstrip(".") for module in _NUMBER_MODULES), *(name.rsplit(".", 1)[-1] for name in _WAITS),
})
SYNC_NODES = (cst.FormattedStringExpression, cst.IfExp, cst.UnaryOperation, cst.BooleanOperation)


def join(kinds) -> Kind:
    """One kind for a value that may be any of ``kinds``."""
    found = set(kinds)
    if not found:
        return Kind.UNKNOWN
    if len(found) == 1:
        return found.pop()
    rest = found - {Kind.NONE}
    if rest <= TENSORS:
        # a tensor (or a container of them), or None on another path: what reads it reads a tensor
        return rest.pop() if len(rest) == 1 else Kind.TENSOR
    if found <= TENSORS | {Kind.CPU}:
        return Kind.TENSOR  # moved on one path
    if found <= NUMBERS:
        return Kind.FLOAT if Kind.FLOAT in found else Kind.INT
    if found <= HOST:
        return Kind.PYTHON
    return Kind.UNKNOWN


def _neutral(value: cst.BaseExpression) -> bool:
    """A literal initialiser, which takes the kind of the name's other bindings."""
    if type(value) is cst.UnaryOperation and type(value.operator) is cst.Minus:
        value = value.expression
    kind = type(value)
    if kind is cst.Integer or kind is cst.Float:
        return True
    if kind is cst.Name:
        return value.value == "None"
    if kind is cst.List or kind is cst.Dict or kind is cst.Tuple:
        return not value.elements
    if kind is cst.Call and type(value.func) is cst.Name:
        if value.func.value in ("list", "dict") and not value.args:
            return True
        if value.func.value == "float" and len(value.args) == 1 and isinstance(value.args[0].value, cst.SimpleString):
            return True  # float("inf")
    return False


@dataclass(eq=False)
class _Function:
    """A function of the file: its class (for methods), the function it is in, its parameters."""

    owner: cst.ClassDef | None
    parent: cst.FunctionDef | None
    params: list[str] = field(default_factory=list)


@dataclass
class Definitions:
    """The file's functions and classes, noted as the analysis walk meets them (``note``)."""

    functions: dict[cst.FunctionDef, _Function] = field(default_factory=dict)
    # Module-level classes by name; module-level functions and classes by name.
    classes: dict[str, cst.ClassDef] = field(default_factory=dict)
    defined: dict[str, cst.CSTNode] = field(default_factory=dict)
    methods: dict[cst.ClassDef, dict[str, cst.FunctionDef]] = field(default_factory=dict)
    # Functions defined inside functions, by (enclosing function, name).
    nested: dict[tuple[cst.FunctionDef, str], cst.FunctionDef] = field(default_factory=dict)

    def note(self, node: cst.FunctionDef | cst.ClassDef, container: cst.FunctionDef | cst.ClassDef | None) -> None:
        """``node``, defined directly in ``container`` (its body, or a block of it), or at module
        level (None)."""
        owner = container if type(container) is cst.ClassDef else None
        parent = container if type(container) is cst.FunctionDef else None
        name = node.name.value
        if type(node) is cst.FunctionDef:
            params = [p.name.value for p in (*node.params.posonly_params, *node.params.params)]
            self.functions[node] = _Function(owner, parent, params)
            if owner is not None:
                self.methods.setdefault(owner, {})[name] = node
            elif parent is None:
                self.defined.setdefault(name, node)
            else:
                self.nested.setdefault((parent, name), node)
        else:
            if container is None:
                self.defined.setdefault(name, node)
                self.classes[name] = node
            self.methods.setdefault(node, {})


# A binding's kind; whether it is a literal initialiser (``total = 0``), which gives way to the
# kind of the name's other bindings where they meet; and where every path to here bound it last:
# a statement, a frozenset of them where paths bind it in different statements, None where one
# may bind it nowhere.
_Bound = tuple[Kind, bool, object]
# The names bound where a statement starts: name -> _Bound.
_Env = PersistentMap


class _Ended(PersistentMap):
    """The names bound where a path ends (``return``, ``raise``, ``break``, ``continue``): their
    kinds still meet the other paths', but no path goes on from here to bind them."""

    __slots__ = ()


# The statements that end the path they are on (a call, ``sys.exit()`` too, is not known to).
_ENDS_PATH = frozenset({cst.Return, cst.Raise, cst.Break, cst.Continue})


def _ended(env: _Env) -> _Env:
    return env if type(env) is _Ended else _Ended.of(env)


def _merge(*envs: _Env) -> _Env:
    """Where a loop's paths meet at its head: a name bound on one path only keeps that binding
    (Python has no block scope), and an initialiser from before the loop gives way to what the
    body binds (``total = 0`` before ``total += loss``)."""
    live = [type(env) is not _Ended for env in envs]
    merged = merge(envs, lambda buckets, _: _meet_buckets(buckets, live))
    return merged if any(live) else _ended(merged)


def _meet_buckets(buckets: list[dict | None], live: list[bool]) -> dict[str, _Bound]:
    merged: dict[str, _Bound] = {}
    for bucket in buckets:
        for name, bound in (bucket or {}).items():
            merged[name] = _meet(merged[name], bound) if name in merged else bound
    for name, bound in merged.items():
        origin = _origin(name, buckets, live)
        if origin is not bound[2]:
            merged[name] = (bound[0], bound[1], origin)
    return merged


def _origin(name: str, buckets: list[dict | None], live: list[bool]):
    """Where every path that goes on from the buckets' maps (the ``live`` ones) bound ``name``
    last."""
    found = None
    for index, bucket in enumerate(buckets):
        if not live[index]:
            continue
        bound = bucket.get(name) if bucket is not None else None
        if bound is None or bound[2] is None:
            return None
        origin = bound[2]
        if found is None or found is origin:
            found = origin
        else:
            found = _statements(found) | _statements(origin)
    return found


def _statements(origin) -> frozenset:
    return origin if type(origin) is frozenset else frozenset((origin,))


def _merge_branches(before: _Env, *ends: _Env) -> _Env:
    """After an ``if``/``try``: like ``_merge``, but a literal that a branch assigns itself is
    one of the values, not an initialiser (``value = t if ... else 0.5`` written as a block)."""
    live = [type(env) is not _Ended for env in ends]

    def fresh(buckets: list[dict | None], before_bucket: dict | None) -> dict[str, _Bound]:
        known = before_bucket or {}
        return _meet_buckets([
            {name: (bound[0], False, bound[2]) if bound[1] and bound is not known.get(name) else bound
             for name, bound in (bucket or {}).items()}
            for bucket in buckets
        ], live)

    merged = merge(ends, fresh, before)
    return merged if any(live) else _ended(merged)


def _meet(first: _Bound, second: _Bound) -> _Bound:
    """The kind of a name bound as ``first`` on one path and ``second`` on another (where it is
    bound is ``_origin``'s)."""
    if first == second:
        return first
    (kind, neutral, origin), (other, other_neutral, _) = first, second
    if neutral != other_neutral:
        return first if other_neutral else second
    return join([kind, other]), neutral, origin


class ScopeValues:
    """The kinds of one function's (or module level's) names, and questions about its
    expressions.

    The function's statements are walked in order with an environment (name -> kind) that an
    assignment updates, that meets its other branch after an ``if`` and that a loop carries
    round to its head until it settles; each statement keeps the environment it starts with, so
    ``loss`` is a tensor after ``loss = criterion(...)`` even where the same name held a float
    earlier in the script.
    """

    def __init__(self, file: "FileValues", scope: cst.FunctionDef | None, parent: "ScopeValues | None" = None):
        self.file = file
        self.scope = scope
        self.facts = file.facts
        self._parent = parent
        # The environment the expression being evaluated sees.
        self._env = _Env()
        # Each statement's environment before it runs (small statements and compound headers).
        # (Both by the nodes' ids: a node hashes by a Python method of libcst's, an id in C; the
        # syntax tree outlives them.)
        self._before: dict[int, _Env] = {}
        # Each compound statement's environment after it (where its paths meet again).
        self._after: dict[int, _Env] = {}
        self._statement_of: dict[int, cst.CSTNode] = {}
        # The comprehension whose names each node of one sees (``_note_comprehension``).
        self._comprehension_of: dict[cst.CSTNode, cst.CSTNode] = {}
        # Every kind each name is bound to anywhere in the scope (what nested scopes see).
        self._summary: dict[str, list[tuple[Kind, bool]]] = {}
        # The dotted names bound under each name (``args.lr`` under ``args``), which a binding of
        # the name forgets.
        self._attributes: dict[str, set[str]] = {}
        self._memo: dict[cst.CSTNode, Kind] = {}
        self._final = False
        self._inline = False
        self._local: set[str] = set()
        # Whether the walk used a placeholder for the return of a function still being computed
        # (that function asked this scope what it passes): walked again once it is known.
        self.provisional = False
        # Plain ``name = value`` assignments, in order (for loops over such a name).
        self._assignments: dict[str, list[cst.BaseExpression]] = {}
        # The statement whose bindings are being walked (a statement line, a compound header,
        # an except clause; the function for its parameters).
        self._binder: cst.CSTNode | None = scope if scope is not None else file.module

    def walk(self) -> None:
        """Walk the scope's statements (once, when its values are first asked for)."""
        body = self.scope.body if self.scope is not None else self.file.module
        self._local = self.file.local_names(body)
        env = self._bind_params(self.scope) if self.scope is not None else _Env()
        self._block(body.body, env)
        self._final = True

    @classmethod
    def of_comprehension(cls, outer: "ScopeValues", for_in: cst.CompFor) -> "ScopeValues":
        """A comprehension's own names over the enclosing scope's (as its element sees them)."""
        values = cls(outer.file, outer.scope, outer)
        values._inline = True
        env = _Env()
        while for_in is not None:
            values._env = env
            env = values._bind_loop(for_in.target, for_in.iter, env)
            values._local |= target_names(for_in.target)
            for_in = for_in.inner_for_in
        values._env = env
        values._final = True
        return values

    def waits(self) -> None:
        """Mark the scope (not a comprehension's, which belongs to it) as walked with a placeholder."""
        values = self
        while values._inline and values._parent is not None:
            values = values._parent
        values.provisional = True

    # The walk ------------------------------------------------------------------------------------

    def _bind(self, env: _Env, name: str, kind: Kind | None, neutral: bool = False) -> _Env:
        """``env`` with ``name`` bound to a value of ``kind`` by the statement being walked."""
        return self._put(env, name, kind, neutral, self._binder)

    def _refine(self, env: _Env, name: str, kind: Kind) -> _Env:
        """``env`` knowing more of what ``name`` holds (``loss.backward()``: a tensor), bound
        where it was."""
        bound = env.get(name)
        return self._put(env, name, kind, False, bound[2] if bound is not None else None)

    def _put(self, env: _Env, name: str, kind: Kind | None, neutral: bool, origin) -> _Env:
        if kind is None:
            return env
        self._summary.setdefault(name, []).append((kind, neutral))
        prefix, dot, _ = name.rpartition(".")
        while dot:
            self._attributes.setdefault(prefix, set()).add(name)
            prefix, dot, _ = prefix.rpartition(".")
        return env.set(name, (kind, neutral, origin))

    def _bind_params(self, scope: cst.FunctionDef) -> _Env:
        env = _Env()
        owner = self.file.owner_of(scope)
        params = scope.params
        for index, param in enumerate([*params.posonly_params, *params.params, *params.kwonly_params]):
            name = param.name.value
            if index == 0 and owner is not None and name in ("self", "cls"):
                env = self._bind(env, name, self.file.class_kind(owner))
            else:
                env = self._bind(env, name, self.file.param_kind(scope, param))
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                env = self._bind(env, star.name.value, Kind.UNKNOWN)
        return env

    def _block(self, statements, env: _Env) -> _Env:
        ended = False
        for statement in statements:
            env = self._statement(statement, env)
            ended = ended or type(env) is _Ended
        return _ended(env) if ended else env  # (what follows a return is walked, and reached by no path)

    def _body(self, suite, env: _Env) -> _Env:
        if suite is None:
            return env
        if isinstance(suite, (cst.IndentedBlock, cst.SimpleStatementSuite)):
            if isinstance(suite, cst.SimpleStatementSuite):
                return self._smalls(suite, suite.body, env)
            return self._block(suite.body, env)
        if type(suite) is cst.If:
            return self._statement(suite, env)  # elif: its test, body and what else it has
        return self._body(suite.body, env)  # Else, Finally, ExceptHandler: their own suite

    def _smalls(self, line, smalls, env: _Env) -> _Env:
        self._record(line, env)
        self._binder = line
        ended = False
        for small in smalls:
            self._record(small, env)
            env = self._small(small, env)
            ended = ended or type(small) in _ENDS_PATH
        return _ended(env) if ended else env

    def _record(self, statement: cst.CSTNode, env: _Env) -> None:
        """Keep the environment ``statement`` starts with (a loop's last, settled pass wins),
        and note which statement each of its expressions belongs to."""
        key = id(statement)
        if key not in self._before:
            statement_of = self._statement_of
            for child in descendants(statement, _BLOCK_TYPES):
                kind = type(child)
                if kind in _BLOCK_TYPES:
                    continue  # a block nested in the statement: its statements are recorded on their own
                statement_of.setdefault(id(child), statement)
                if kind in _COMPREHENSIONS:
                    self._note_comprehension(child)
        self._before[key] = env

    def _note_comprehension(self, comprehension) -> None:
        """Note the nodes that see a comprehension's own names: its element, conditions and inner
        loops (not its first iterable, which the enclosing scope evaluates). A comprehension
        nested in another is noted after it and keeps its own nodes."""
        first = comprehension.for_in.iter
        noted = self._comprehension_of

        def enter(node):
            if node is first:
                return False
            noted[node] = comprehension
            return True

        for child in children(comprehension):
            walk(child, enter)

    def _statement(self, node: cst.CSTNode, env: _Env) -> _Env:
        if isinstance(node, cst.SimpleStatementLine):
            return self._smalls(node, node.body, env)
        self._record(node, env)
        if isinstance(node, (cst.FunctionDef, cst.ClassDef)):
            return env  # calls of the file's functions and classes are answered by what they return
        self._after[id(node)] = after = self._compound(node, env)
        return after

    def _compound(self, node: cst.CSTNode, env: _Env) -> _Env:
        if isinstance(node, cst.If):
            return _merge_branches(env, self._body(node.body, env), self._body(node.orelse, env))
        if isinstance(node, (cst.For, cst.While)):
            return self._loop(node, env)
        if isinstance(node, cst.With):
            inner = env
            self._env = env
            for item in node.items:
                if item.asname is not None:
                    self._binder = node
                    inner = self._assign(item.asname.name, self._entered(item.item), False, None, inner)
            return self._body(node.body, inner)
        if isinstance(node, cst.Try):
            body = self._body(node.body, env)
            ends = [self._body(node.orelse, body)]
            for handler in node.handlers:
                start = _merge(env, body)
                if handler.name is not None:
                    self._binder = handler
                    start = self._bind(start, dotted(handler.name.name) or "", Kind.PYTHON)
                self._record(handler, start)
                ends.append(self._body(handler.body, start))
            merged = _merge_branches(env, *ends)
            return self._body(node.finalbody, merged) if node.finalbody is not None else merged
        # match and other compound statements: each block from the same start
        ends = [env]
        for child in children(node):
            if isinstance(child, (cst.BaseSuite, cst.BaseStatement)) or hasattr(child, "body"):
                if not isinstance(child, cst.BaseExpression):
                    ends.append(self._body(child, env))
        return _merge_branches(env, *ends)

    def _loop(self, node: cst.For | cst.While, env: _Env) -> _Env:
        """A loop's body runs with what the previous iteration left, until that settles."""
        head = env
        for _ in range(4):
            self._record(node, head)
            start = head
            if isinstance(node, cst.For):
                self._env = head
                self._binder = node
                start = self._bind_loop(node.target, node.iter, head)
            end = self._body(node.body, start)
            settled = _merge(env, end)
            if settled == head:
                break
            head = settled
        if node.orelse is None:
            return head
        after = self._body(node.orelse, head)
        # (a ``break`` leaves without the ``else`` clause)
        return _merge_branches(head, after, head) if _breaks(node) else after

    def _small(self, small: cst.BaseSmallStatement, env: _Env) -> _Env:
        self._env = env
        small_type = type(small)
        if small_type is cst.Assign:
            for target in small.targets:
                if isinstance(target.target, cst.Name):
                    value = small.value
                    if _wraps_iterable(value):
                        inner = self.assigned_value(value.args[0].value)
                        if isinstance(inner, cst.Call) and (dotted(inner.func) in ("enumerate", "zip")
                                                            or _wraps_iterable(inner)):
                            value = inner  # pbar = tqdm(pbar, total=n) after pbar = enumerate(loader)
                    self._assignments.setdefault(target.target.value, []).append(value)
            kind = self._eval(small.value)
            for target in small.targets:
                env = self._assign(target.target, kind, _neutral(small.value), small.value, env)
        elif small_type is cst.AnnAssign:
            annotated = self.file.annotation_kind(small.annotation.annotation)
            if small.value is not None and annotated is Kind.UNKNOWN:
                env = self._assign(small.target, self._eval(small.value), _neutral(small.value), small.value, env)
            else:
                env = self._assign(small.target, annotated, False, None, env)
        elif small_type is cst.AugAssign:
            augmented = cst.BinaryOperation(left=small.target, operator=_binary_of(small.operator), right=small.value)
            env = self._assign(small.target, self._eval(augmented), False, None, env)
        elif small_type is cst.Expr and type(small.value) is cst.Call:
            call = small.value
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
                receiver = call.func.value
                if isinstance(receiver, cst.Call) and receiver.args:  # scaler.scale(loss).backward()
                    receiver = receiver.args[0].value
                elif call.args and call.args[0].keyword is None:  # accelerator.backward(loss)
                    receiver = call.args[0].value
                name = dotted(receiver)
                if name:
                    env = self._refine(env, name, Kind.TENSOR)
            elif isinstance(call.func, cst.Attribute) and call.func.attr.value in _ADDS and self._any_tensor_argument(call):
                # ``res.append(correct_k.mul_(100.0 / batch_size))``: the list holds a tensor, like
                # ``out[k] = t``
                name = dotted(call.func.value)
                if name and self._eval(call.func.value) in HOST | {Kind.UNKNOWN}:
                    env = self._refine(env, name, Kind.HOLDER)
        elif small_type is cst.Del:
            for name in target_names(small.target):
                bound = env.get(name)
                if bound is not None:
                    env = env.set(name, (bound[0], bound[1], None))  # what it held, bound on no path now
        elif (small_type is cst.Import or small_type is cst.ImportFrom) and type(small.names) is not cst.ImportStar:
            for alias in small.names:
                name = dotted(alias.asname.name if alias.asname is not None else alias.name)
                if name:
                    env = self._bind(env, name.split(".")[0], Kind.UNKNOWN)
        return env

    def _assign(self, target: cst.CSTNode, kind: Kind, neutral: bool, value, env: _Env):
        """``env`` after binding ``target`` (a name, attribute, subscript or unpacking) to a value
        of ``kind`` (``value``, when known, unpacks element by element)."""
        if isinstance(target, (cst.Tuple, cst.List)):
            elements = [e.value.value if isinstance(e.value, cst.StarredElement) else e.value for e in target.elements]
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elements) and not any(
                isinstance(e.value, cst.StarredElement) for e in value.elements
            ):
                kinds = [(self._eval(e.value), _neutral(e.value), e.value) for e in value.elements]
            else:
                returned = self._returned_parts(value, len(elements))
                kinds = [(part, False, None) for part in returned] if returned else [(_element(kind), False, None)] * len(elements)
            for element, (part, part_neutral, part_value) in zip(elements, kinds):
                env = self._assign(element, part, part_neutral, part_value, env)
            return env
        if isinstance(target, cst.StarredElement):
            return self._assign(target.value, kind, neutral, None, env)
        if isinstance(target, cst.Subscript):
            # ``out[k] = t`` puts a tensor into a container; a Python value put into a tensor
            # (``losses[k] = loss.item()``) leaves it a tensor.
            name = dotted(target.value)
            if name and kind in TENSORS:
                env = self._refine(env, name, Kind.TENSOR if env.get(name, (None,))[0] in (Kind.TENSOR, Kind.MASK) else Kind.HOLDER)
            return env
        name = dotted(target)
        if name is None:
            return env
        if name.startswith("self.") and name.count(".") == 1 and self.scope is not None:
            self.file.note_attribute(self.scope, name[5:], target, kind, neutral)
        for attribute in self._attributes.get(name, ()):
            env = env.without(attribute)  # ``args = ...`` forgets what was known of ``args.lr``
        return self._bind(env, name, kind, neutral)

    def _returned_parts(self, value, count: int) -> list[Kind] | None:
        """Each part's kind where ``value`` calls a function of the file that returns ``count``
        values (``perplexity, eval_loss = evaluate(...)``: a float and a tensor)."""
        if not isinstance(value, cst.Call) or not isinstance(value.func, cst.Name):
            return None
        name = value.func.value
        defined = self.file.defined.get(name)
        if not isinstance(defined, cst.FunctionDef) or self.name_kind(name) is not Kind.UNKNOWN:
            return None
        return self.file.returned_parts(defined, count)

    def _bind_loop(self, target: cst.BaseExpression, iterable: cst.BaseExpression, env: _Env):
        """``env`` after ``for target in iterable``: ``enumerate``, ``zip``, ``.items()`` and
        ``.named_parameters()`` bind element by element (the counter of ``enumerate(loader)``
        is an int, not a batch), also through a name assigned one of them (``pbar =
        tqdm(enumerate(loader))``)."""
        source = self.assigned_value(iterable)
        if isinstance(source, cst.Call) and isinstance(target, (cst.Tuple, cst.List)):
            func = source.func
            name = dotted(func)
            method = func.attr.value if isinstance(func, cst.Attribute) else None
            args = [arg.value for arg in source.args if arg.keyword is None and not arg.star]
            elements = [element.value for element in target.elements]
            if name == "enumerate" and args and len(elements) == 2:
                env = self._assign(elements[0], Kind.INT, False, None, env)
                return self._bind_loop(elements[1], args[0], env)
            if name == "zip" and len(args) == len(elements):
                for element, arg in zip(elements, args):
                    env = self._bind_loop(element, arg, env)
                return env
            if method in _NAMED_ITEMS and len(elements) == 2:
                env = self._assign(elements[0], Kind.STR if method != "items" else Kind.PYTHON, False, None, env)
                return self._assign(elements[1], self._item_kind(source), False, None, env)
            if _wraps_iterable(source):
                return self._bind_loop(target, args[0], env)
        return self._assign(target, self._element_of(iterable), False, None, env)

    def assigned_value(self, node: cst.BaseExpression) -> cst.BaseExpression:
        """For a name assigned before (``pbar = tqdm(enumerate(loader))``), its latest value."""
        if isinstance(node, cst.Name):
            found = self._assignments.get(node.value)
            if found:
                return found[-1]
        return node

    def _item_kind(self, call: cst.Call) -> Kind:
        """The values of ``d.items()``, ``model.named_parameters()``, ``model.named_modules()``."""
        method = call.func.attr.value
        if method in ("named_modules", "named_children"):
            return Kind.MODEL
        if method in ("named_parameters", "named_buffers"):
            return Kind.TENSOR
        owner = self._eval(call.func.value)
        return Kind.TENSOR if owner in TENSORS else self._container_kind([owner])

    # Names -------------------------------------------------------------------------------------

    def name_kind(self, name: str) -> Kind:
        """The kind of a (dotted) name where the expression being evaluated is."""
        bound = self._env.get(name)
        if bound is not None:
            return bound[0]
        root = name.split(".")[0]
        if root in self._local or self._parent is None:
            return Kind.UNKNOWN
        if self._inline:
            return self._parent.name_kind(name)  # a comprehension runs where it is written
        return self._parent.summary_kind(name)

    def summary_kind(self, name: str) -> Kind:
        """A name's kind anywhere in this scope (as a nested function, run later, sees it)."""
        bound = self._summary.get(name)
        if bound:
            plain = [kind for kind, neutral in bound if not neutral]
            return join(plain) if plain else join(kind for kind, _ in bound)
        bound = self._env.get(name)
        if bound is not None:
            return bound[0]
        root = name.split(".")[0]
        if root not in self._local and self._parent is not None:
            return self._parent.summary_kind(name)
        return Kind.UNKNOWN

    # Kinds of expressions ---------------------------------------------------------------------

    def kind(self, node: cst.CSTNode) -> Kind:
        """What ``node`` evaluates to, where it is in the scope. (Asked while the scope is still
        being walked, by a function it calls: what the walk has seen so far.)"""
        found = self._memo.get(node)
        if found is None:
            walking = self._env
            self._env = self._before.get(id(self._statement_of.get(id(node), node)), walking)
            comprehension = self._comprehension_of.get(node)
            try:
                # (a node of a comprehension sees the comprehension's names: ``v`` of ``[v.cpu() for v in out]``)
                found = self._eval(node) if comprehension is None else self._comprehension(comprehension.for_in, node)
            finally:
                self._env = walking
            if self._final:
                self._memo[node] = found
        return found

    def _eval(self, node: cst.CSTNode) -> Kind:
        """``node``'s kind in the environment being evaluated (``self._env``)."""
        if self._final:
            found = self._memo.get(node)
            if found is None:
                found = self._memo[node] = self._kind(node)
            return found
        return self._kind(node)

    def _kind(self, node: cst.CSTNode) -> Kind:
        node_type = type(node)  # libcst's node types are concrete: ``is``, not isinstance against its ABCs
        if node_type is cst.Integer:
            return Kind.INT
        if node_type is cst.Float:
            return Kind.FLOAT
        if node_type is cst.Imaginary:
            return Kind.PYTHON
        if node_type in (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString):
            return Kind.STR
        if node_type is cst.Name:
            if node.value in ("True", "False"):
                return Kind.BOOL
            if node.value == "None":
                return Kind.NONE
            return self._dotted_kind(node)
        if node_type is cst.Attribute:
            return self._attribute_kind(node)
        if node_type is cst.Subscript:
            return self._subscript_kind(node)
        if node_type is cst.Call:
            return self._call_kind(node)
        if node_type is cst.BinaryOperation:
            return self._binary_kind(node)
        if node_type is cst.UnaryOperation:
            if isinstance(node.operator, cst.Not):
                return Kind.BOOL
            return self._eval(node.expression)
        if node_type is cst.Comparison:
            if any(isinstance(c.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for c in node.comparisons):
                return Kind.BOOL
            sides = [self._eval(node.left), *(self._eval(c.comparator) for c in node.comparisons)]
            if any(side in TENSORS for side in sides):
                return Kind.MASK
            if Kind.CPU in sides and all(side in NUMBERS or side is Kind.CPU for side in sides):
                return Kind.CPU
            return Kind.BOOL if all(side in HOST for side in sides) else Kind.UNKNOWN
        if node_type is cst.BooleanOperation:
            sides = {self._eval(node.left), self._eval(node.right)}
            if sides & TENSORS:
                return Kind.TENSOR
            return join(sides) if sides <= HOST else Kind.UNKNOWN
        if node_type is cst.IfExp:
            return join([self._eval(node.body), self._eval(node.orelse)])
        if node_type in (cst.List, cst.Tuple, cst.Set):
            return self._container_kind(self._eval(e.value) for e in node.elements)
        if node_type is cst.Dict:
            return self._container_kind(self._eval(e.value) for e in node.elements if isinstance(e, cst.DictElement))
        if node_type in (cst.ListComp, cst.SetComp, cst.GeneratorExp):
            return self._container_kind([self._comprehension(node.for_in, node.elt)])
        if node_type is cst.DictComp:
            return self._container_kind([self._comprehension(node.for_in, node.value)])
        if node_type is cst.NamedExpr:
            return self._eval(node.value)
        if node_type is cst.StarredElement:
            return self._eval(node.value)
        if node_type is cst.Lambda:
            return Kind.PYTHON
        return Kind.UNKNOWN

    @staticmethod
    def _container_kind(kinds) -> Kind:
        found = set(kinds)
        if found & TENSORS:
            return Kind.HOLDER
        if Kind.CPU in found and found <= HOST | {Kind.CPU}:
            return Kind.CPU
        if found <= HOST:
            return Kind.PYTHON
        if found <= {Kind.MODEL}:
            return Kind.MODEL
        return Kind.UNKNOWN

    def _comprehension(self, for_in: cst.CompFor, element: cst.BaseExpression) -> Kind:
        """The kind of a comprehension's element, its loop names bound as the loop binds them."""
        return ScopeValues.of_comprehension(self, for_in).kind(element)

    def _dotted_kind(self, node: cst.CSTNode) -> Kind:
        name = dotted(node)
        kind = self.name_kind(name)
        if kind is not Kind.UNKNOWN:
            return kind
        if isinstance(node, cst.Name):
            if self.facts.qualname(node) is not None and node.value in self.facts.imports:
                return Kind.UNKNOWN  # an imported module or object
            if node.value in self.facts.models:
                return Kind.MODEL
            if node.value in self.facts.loaders or "loader" in node.value.lower():
                return Kind.LOADER
        return Kind.UNKNOWN

    def _attribute_kind(self, node: cst.Attribute) -> Kind:
        name = dotted(node)
        if name is not None:
            known = self.name_kind(name)
            if known is not Kind.UNKNOWN:
                return known
            if isinstance(node.value, cst.Name) and node.value.value == "self":
                owner = self.file.owner_of(self.scope)
                attribute = self.file.attribute_kind(owner, node.attr.value) if owner is not None else Kind.UNKNOWN
                if attribute is not Kind.UNKNOWN:
                    return attribute
            option = self.file.option_kind(node)
            if option is not None:
                return option
            qualified = self.facts.qualname(node)
            if qualified is not None:
                return Kind.PYTHON if qualified.startswith("torch.") else Kind.UNKNOWN  # torch.float16
            if name in self.facts.models:
                return Kind.MODEL
            if name in self.facts.loaders or "loader" in node.attr.value.lower():
                return Kind.LOADER
        base = self._eval(node.value)
        attr = node.attr.value
        if base in TENSORS or base is Kind.CPU:
            return META_ATTRS.get(attr, base if base is Kind.CPU else Kind.TENSOR)
        if base is Kind.MODEL and attr in _MODEL_ATTRIBUTES:
            return _MODEL_ATTRIBUTES[attr]
        if base in HOST:
            return Kind.PYTHON
        return Kind.UNKNOWN

    def _subscript_kind(self, node: cst.Subscript) -> Kind:
        base = self._eval(node.value)
        if base in TENSORS:
            return Kind.TENSOR
        if base is Kind.CPU:
            return Kind.CPU
        if base is Kind.STR:
            return Kind.STR
        if base in HOST:
            if dotted(node.value) in ("os.environ",):
                return Kind.STR
            return Kind.PYTHON
        if dotted(node.value) == "os.environ" or self.facts.qualname(node.value) == "os.environ":
            return Kind.STR
        if base is Kind.MODEL:
            return Kind.MODEL  # nn.Sequential / ModuleList
        return Kind.UNKNOWN

    def _binary_kind(self, node: cst.BinaryOperation) -> Kind:
        left, right = self._eval(node.left), self._eval(node.right)
        if left is Kind.STR and isinstance(node.operator, cst.Modulo):
            return Kind.STR  # "%f" % loss is a string whatever it formats
        if left in TENSORS or right in TENSORS:
            if isinstance(node.operator, (cst.BitAnd, cst.BitOr, cst.BitXor)) and Kind.MASK in (left, right):
                return Kind.MASK
            return Kind.TENSOR
        if Kind.CPU in (left, right) and {left, right} <= {Kind.CPU, *NUMBERS}:
            return Kind.CPU
        if left in NUMBERS and right in NUMBERS:
            return Kind.FLOAT if isinstance(node.operator, cst.Divide) else join([left, right])
        if left in HOST and right in HOST:
            return join([left, right]) if left is right else Kind.PYTHON
        return Kind.UNKNOWN

    def _call_kind(self, node: cst.Call) -> Kind:
        func = node.func
        facts = self.facts
        if _wraps_iterable(node):
            return self._eval(node.args[0].value)  # tqdm(loader) is still the loader
        callee = facts.qualname(func)
        if isinstance(func, cst.Attribute) and callee is None:
            return self._method_kind(node, func)
        if callee is not None:
            return self._library_kind(node, callee)
        if isinstance(func, cst.Name):
            name = func.value
            if not self._bound_here_or_around(name) and name not in self.file.defined:
                builtin = self._builtin_kind(node, name)
                if builtin is not None:
                    return builtin
            defined = self.file.defined.get(name)
            if defined is not None and self.name_kind(name) is Kind.UNKNOWN:
                return self.file.call_kind(defined, node, self)
            called = self._eval(func)
            if called is Kind.MODEL:
                return Kind.TENSOR
            if called is Kind.LOADER:
                return Kind.LOADER
        return self._unknown_call(node)

    def _unknown_call(self, node: cst.Call) -> Kind:
        """A call of something this analysis cannot see into: a function given a tensor gives one
        (a loss, a metric); a class (``ModelEMA(model)``, ``DistAdam(params)``) builds an object."""
        last = (dotted(node.func) or "").split(".")[-1]
        if last[:1].isupper():
            return Kind.UNKNOWN
        return Kind.TENSOR if self._any_tensor_argument(node) else Kind.UNKNOWN

    def _bound_here_or_around(self, name: str) -> bool:
        values = self
        while values is not None:
            if name in values._local:
                return True
            values = values._parent
        return False

    def _builtin_kind(self, node: cst.Call, name: str) -> Kind | None:
        args = [arg.value for arg in node.args]
        if name in SYNC_BUILTINS:
            if name == "round" and len(args) == 1:
                return Kind.INT
            return SYNC_BUILTINS[name]
        if name in _BUILTIN_KINDS:
            return _BUILTIN_KINDS[name]
        if name in ("max", "min", "sum", "pow", "divmod"):
            kinds = [self._element_of(args[0])] if len(args) == 1 else [self._eval(a) for a in args]
            if any(kind in TENSORS for kind in kinds):
                return Kind.TENSOR
            return join(kinds) if kinds and all(kind in NUMBERS for kind in kinds) else Kind.UNKNOWN
        if name == "next" and args:
            return self._element_of(args[0])
        if name in ("enumerate", "zip", "map", "filter"):
            kinds = {self._eval(a) for a in args}
            return Kind.LOADER if Kind.LOADER in kinds else Kind.TENSOR if kinds & TENSORS else Kind.PYTHON
        if name in _PASS_THROUGH:
            if not args:
                return Kind.PYTHON
            inner = self._eval(args[0])
            return Kind.LOADER if inner is Kind.LOADER and name == "iter" else inner
        if name in ("getattr", "super", "object"):
            return Kind.UNKNOWN
        return None

    def _library_kind(self, node: cst.Call, callee: str) -> Kind:
        if callee in _HOST_TORCH_FUNCTIONS:
            return _HOST_TORCH_FUNCTIONS[callee]
        if callee.startswith("torch.nn.") and not callee.startswith(("torch.nn.functional.", "torch.nn.init.")):
            # nn.Linear(...), nn.SyncBatchNorm.convert_sync_batchnorm(model), DDP(model): modules
            parts = callee.split(".")
            if callee.startswith("torch.nn.parallel.") or any(part[:1].isupper() for part in parts[2:]):
                return Kind.MODEL
            return Kind.UNKNOWN
        if callee.startswith("torch."):
            if callee.startswith(_HOST_TORCH) and not callee.startswith("torch.distributed.nn."):
                return Kind.PYTHON  # (torch.distributed.nn's collectives are differentiable: tensors)
            return self._torch_function_kind(node, callee)
        if callee in ("os.environ.get", "os.getenv"):
            return Kind.STR
        if callee.startswith(("math.floor", "math.ceil", "math.isqrt", "math.prod")):
            return Kind.INT
        if callee.startswith(("math.", "time.")):
            return Kind.FLOAT
        if callee.startswith(_HOST_MODULES):
            return Kind.PYTHON
        if callee.split(".")[-1] == "DataLoader":
            return Kind.LOADER
        return self._unknown_call(node)

    def _torch_function_kind(self, node: cst.Call, callee: str) -> Kind:
        """A torch function's tensor: on the host where it makes one without a device, or
        computes from host tensors only (``torch.zeros(n)``, ``torch.stack([...from_numpy...])``)."""
        if any(arg.keyword is not None and arg.keyword.value == "device" for arg in node.args):
            return Kind.TENSOR
        kinds = set()
        for arg in node.args:
            value = arg.value
            elements = value.elements if isinstance(value, (cst.List, cst.Tuple)) else [value]
            for element in elements:
                kinds.add(self._eval(element.value if isinstance(element, cst.BaseElement) else element))
        if kinds & TENSORS:
            return Kind.TENSOR
        if Kind.CPU in kinds or callee.rpartition(".")[2] in _FACTORIES:
            return Kind.CPU
        return Kind.TENSOR

    def _method_kind(self, node: cst.Call, func: cst.Attribute) -> Kind:
        method = func.attr.value
        if method in _STRING_METHODS:
            return Kind.STR  # "...".format(loss) is a string whatever it formats
        receiver = self._eval(func.value)
        if receiver is Kind.UNKNOWN:
            # Methods that hardly anything but tensors and modules have.
            if method in META_METHODS or method == "item":
                return META_METHODS.get(method, Kind.FLOAT)
            if method in _MODEL_TENSORS:
                return Kind.TENSOR
        if receiver is Kind.CPU:
            if method in ("to", "cuda") and not self._casts_only(node):
                return Kind.TENSOR  # moved to the device
            if method in SYNC_METHODS or method in META_METHODS:
                return META_METHODS.get(method) or (SYNC_METHODS[method] if method != "cpu" else Kind.CPU)
            return Kind.CPU
        if receiver in TENSORS:
            if method in SYNC_METHODS:
                return SYNC_METHODS[method]
            if method in META_METHODS:
                return META_METHODS[method]
            if method == "bool":
                return Kind.MASK
            if method == "backward":
                return Kind.NONE
            return Kind.TENSOR
        if receiver is Kind.MODEL:
            return _MODEL_METHODS.get(method) or self._own_method_kind(node, func)
        if receiver is Kind.LOADER:
            return Kind.LOADER if method in ("__iter__",) else Kind.UNKNOWN
        if receiver is Kind.STR:
            return Kind.PYTHON if method in ("split", "rsplit", "splitlines", "partition", "encode") else (
                Kind.BOOL if method.startswith(("is", "startswith", "endswith")) else Kind.STR
            )
        if receiver in HOST:
            if method in ("item",):
                return Kind.PYTHON
            if method in ("get", "pop", "values", "items", "keys", "copy", "index", "count"):
                return Kind.PYTHON
            return Kind.PYTHON if not self._any_tensor_argument(node) else Kind.UNKNOWN
        return self._own_method_kind(node, func)

    def _own_method_kind(self, node: cst.Call, func: cst.Attribute) -> Kind:
        """``self.method(...)`` of a class of this file gives what that method returns."""
        if isinstance(func.value, cst.Name) and func.value.value in ("self", "cls"):
            owner = self.file.owner_of(self.scope)
            defined = self.file.method(owner, func.attr.value) if owner is not None else None
            if defined is not None:
                return self.file.call_kind(defined, node, self)
        return self._unknown_call(node)

    def _casts_only(self, call: cst.Call) -> bool:
        """``x.to(torch.float16)``: a dtype, no device."""
        return bool(call.args) and all(
            (self.facts.qualname(arg.value) or "").startswith("torch.") and arg.keyword in (None,) or
            arg.keyword is not None and arg.keyword.value in ("dtype", "non_blocking", "copy", "memory_format")
            for arg in call.args
        ) and not any(arg.keyword is not None and arg.keyword.value == "device" for arg in call.args)

    def _any_tensor_argument(self, node: cst.Call) -> bool:
        return any(self._eval(arg.value) in TENSORS for arg in node.args)

    def _entered(self, node: cst.BaseExpression) -> Kind:
        """What ``with node as x`` binds: the value of most context managers holds what the
        expression holds (``open`` gives a file, ``autocast`` nothing of interest)."""
        kind = self._eval(node)
        return kind if kind in TENSORS else Kind.UNKNOWN

    def _element_of(self, node: cst.BaseExpression) -> Kind:
        """The kind of what iterating over ``node`` gives."""
        if isinstance(node, (cst.GeneratorExp, cst.ListComp, cst.SetComp)):
            return self._comprehension(node.for_in, node.elt)
        if isinstance(node, cst.Call):
            callee = dotted(node.func) or ""
            last = callee.split(".")[-1]
            args = [arg.value for arg in node.args if arg.keyword is None]
            if callee == "range" or last == "trange":
                return Kind.INT
            if callee in ("enumerate", "zip") or last.lower() in ITERATE_THROUGH:
                if not args:
                    return Kind.UNKNOWN
                kinds = [self._element_of(arg) for arg in args]
                if callee == "enumerate":
                    kinds = [kinds[0]]
                return Kind.TENSOR if any(k in TENSORS for k in kinds) else join(kinds)
            if isinstance(node.func, cst.Attribute) and node.func.attr.value in ("items", "values"):
                owner = self._eval(node.func.value)
                return Kind.TENSOR if owner in TENSORS else self._container_kind([owner])
            kind = self._eval(node)
            if kind in (Kind.LOADER, Kind.UNKNOWN) and any(self._eval(a) is Kind.LOADER for a in args):
                return Kind.TENSOR  # metric_logger.log_every(loader, ...) yields the loader's batches
        kind = self._eval(node)
        if kind is Kind.LOADER or kind in TENSORS:
            return Kind.TENSOR
        if kind is Kind.CPU:
            return Kind.CPU
        if kind is Kind.MODEL:
            return Kind.MODEL
        if kind in HOST:
            return Kind.PYTHON if kind is not Kind.STR else Kind.STR
        return Kind.UNKNOWN

    # Questions rules ask ------------------------------------------------------------------------

    def statement_of(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The small statement (or compound statement's header) of this scope that holds the
        expression ``node``."""
        return self._statement_of.get(id(node))

    def bindings_at(self, name: str, statement: cst.CSTNode) -> frozenset[cst.CSTNode]:
        """The statements whose binding of ``name`` the paths to ``statement`` (a statement line,
        small statement or compound header of this scope) come through last: none where a path
        binds it nowhere (statement lines and compound headers: the ``.statement`` of the
        analysis's ``Binding``)."""
        return _bindings_in(self._before.get(id(statement)), name)

    def bindings_after(self, name: str, statement: cst.CSTNode) -> frozenset[cst.CSTNode]:
        """The same where the paths that go on past the compound ``statement`` meet again."""
        after = self._after.get(id(statement))
        return frozenset() if type(after) is _Ended else _bindings_in(after, name)

    def passed_string(self, name: str, statement: cst.CSTNode) -> bool:
        """Whether ``name`` may hold at ``statement`` what a caller passed for a parameter
        annotated ``str`` (``def main(device: str)``, before the function makes a device of it)."""
        scope = self.scope
        if scope is None or scope not in self.bindings_at(name, statement):
            return False
        params = scope.params
        param = next((p for p in (*params.posonly_params, *params.params, *params.kwonly_params)
                      if p.name.value == name), None)
        return param is not None and param.annotation is not None and \
            self.file.annotation_kind(param.annotation.annotation) is Kind.STR

    def binds(self, name: str) -> bool:
        """Whether this scope binds ``name`` itself (an assignment, a parameter, a loop target)."""
        return name in self._local or self.scope is not None and name in self.file.functions[self.scope].params

    def is_tensor(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is known to hold a tensor (or a batch, a container of tensors)."""
        return self.kind(node) in TENSORS

    def tested_as_tensor(self, node: cst.CSTNode) -> bool:
        """Whether ``node``'s truth value is a tensor's (read on the host): not a container of
        tensors, whose truth value is its length."""
        kind = self.kind(node)
        return kind in TENSORS and kind is not Kind.HOLDER

    def is_mask(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is known to be a boolean tensor."""
        return self.kind(node) is Kind.MASK

    def is_host(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is known to be a Python value (no tensor inside)."""
        return self.kind(node) in HOST

    def is_int(self, node: cst.CSTNode) -> bool:
        return self.kind(node) is Kind.INT

    def is_model(self, node: cst.CSTNode) -> bool:
        return self.kind(node) is Kind.MODEL

    def holds_tensor(self, node: cst.CSTNode) -> bool:
        """Whether ``node`` is a tensor or a display (list, tuple, dict) with one inside."""
        if self.is_tensor(node):
            return True
        if isinstance(node, cst.Dict):
            return any(self.holds_tensor(e.value) for e in node.elements if isinstance(e, cst.DictElement))
        if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
            return any(self.holds_tensor(e.value) for e in node.elements)
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "dict":
            return any(self.holds_tensor(arg.value) for arg in node.args)  # dict(loss=loss)
        return False

    def sync(self, node: cst.CSTNode) -> str | None:
        """How ``node`` itself (not its children) reads a tensor's value on the host, else None."""
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Attribute) and func.attr.value in SYNC_METHODS:
                if self.facts.qualname(func) is None and self._reads_receiver(func):
                    return f".{func.attr.value}()"
            if self.facts.qualname(func) in _WAITS:
                return "waiting for the device"
            if isinstance(func, cst.Attribute) and func.attr.value == "to" and node.args:
                first = node.args[0].value
                if isinstance(first, cst.Call) and self.facts.qualname(first.func) == "torch.device" and first.args:
                    first = first.args[0].value
                if isinstance(first, cst.SimpleString) and first.evaluated_value == "cpu" and self.is_tensor(func.value):
                    return '.to("cpu")'
            if isinstance(func, cst.Name) and func.value in SYNC_BUILTINS and func.value not in self.facts.imports:
                if any(self.is_tensor(arg.value) for arg in node.args):
                    return f"{func.value}() of a tensor"
            if isinstance(func, cst.Name) and func.value in ("max", "min") and func.value not in self.facts.imports:
                compared = [self._element_of(node.args[0].value)] if len(node.args) == 1 else [
                    self._eval(arg.value) for arg in node.args if arg.keyword is None]
                if any(kind in TENSORS for kind in compared):
                    return f"{func.value}() comparing tensors"
            callee = self.facts.qualname(func) or ""
            if callee.startswith(_NUMBER_MODULES) and any(self.is_tensor(arg.value) for arg in node.args):
                return f"{callee}() of a tensor"
            if callee in ("torch.tensor", "torch.as_tensor") and node.args and self._several_tensors(node.args[0].value):
                return f"{callee}() of tensors, each read"
            if (isinstance(func, cst.Attribute) and func.attr.value in METRIC_READS
                    and self.facts.assigned_calls.get(dotted(func.value) or "") in METRIC_LOADERS
                    and any(self.holds_tensor(arg.value) for arg in node.args)):
                return "a metric given tensors"
            if isinstance(func, cst.Attribute) and func.attr.value == "format":
                if any(self.is_tensor(arg.value) for arg in node.args):
                    return "formatting a tensor"
            if isinstance(func, cst.Name) and self.name_kind(func.value) is Kind.UNKNOWN:
                read = self.file.returned_reads(func.value)
                if read and any(self.is_tensor(arg) for param, arg in self.file.arguments(node, func.value).items()
                                if param in read):
                    return f"{func.value}() returns it read on the host"
        if isinstance(node, cst.FormattedStringExpression) and self.is_tensor(node.expression):
            return "formatting a tensor"
        if isinstance(node, cst.IfExp) and self.tested_as_tensor(node.test):
            return "a tensor's truth value"
        if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Not):
            if self.tested_as_tensor(node.expression):
                return "a tensor's truth value"
        if isinstance(node, cst.BooleanOperation) and self.tested_as_tensor(node.left):
            return "a tensor's truth value"
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo):
            if self.kind(node.left) is Kind.STR and self.holds_tensor(node.right):
                return "formatting a tensor"
        return None

    def _several_tensors(self, node: cst.BaseExpression) -> bool:
        """A list of tensors (``torch.tensor(losses)`` reads each), not one tensor (a copy)."""
        if isinstance(node, (cst.List, cst.Tuple)):
            return any(self.holds_tensor(e.value) for e in node.elements)
        return self.kind(node) is Kind.HOLDER

    def _reads_receiver(self, func: cst.Attribute) -> bool:
        """Whether ``x.item()``-like calls read a tensor: ``x`` is one, or (for ``.item()``,
        which hardly anything else has) is not known to be something else."""
        receiver = self.kind(func.value)
        if receiver in TENSORS:
            return True
        return func.attr.value == "item" and receiver is Kind.UNKNOWN

    def reads_value(self, node: cst.CSTNode) -> bool:
        """Whether evaluating ``node`` reads some tensor's value on the host."""
        if type(node) in _DEFINED_CODE:
            return False
        return self.sync(node) is not None or any(
            type(child) not in _DEFINED_CODE and self.sync(child) is not None
            for child in descendants(node, _DEFINED_CODE)
        )

    def tensor_read(self, node: cst.CSTNode, names) -> str | None:
        """The first of ``names`` whose tensor values evaluating ``node`` reads, else None: not
        through what is known of a tensor without them (``x.size(0)``, ``x.shape``, ``len(x)``),
        a number read from it (``x.item()``) or a copy elsewhere (``x.to(device)``, ``x.cpu()``);
        a name that holds a Python value here (a loop counter) reads none."""
        pending = [node]
        while pending:
            child = pending.pop()
            kind = type(child)
            if kind is cst.Name:
                if child.value in names and self.kind(child) not in HOST:
                    return child.value
            elif kind is cst.Attribute:
                if child.attr.value not in META_ATTRS:
                    pending.append(child.value)
            elif kind is cst.Arg:
                pending.append(child.value)  # not its keyword
            elif kind is cst.Call and self._not_its_values(child):
                continue
            elif kind not in _DEFINED_CODE:
                pending.extend(reversed(children(child)))
        return None

    def carries(self, node: cst.CSTNode, names) -> bool:
        """Whether ``node`` gives one of ``names``' tensors or one computed from it where it is:
        read from it (``x[i]``, ``x.float()``, ``batch["x"]``), arithmetic with it, a torch
        function of it, a display holding one; not a number or shape read from it, a copy
        elsewhere, nor what another function makes of it (a model's output, a library's result)."""
        kind = type(node)
        if kind is cst.Name:
            return node.value in names and self.kind(node) not in HOST
        if kind is cst.Attribute:
            return node.attr.value not in META_ATTRS and self.carries(node.value, names)
        if kind is cst.Subscript:
            return self.carries(node.value, names)
        if kind is cst.BinaryOperation:
            return self.carries(node.left, names) or self.carries(node.right, names)
        if kind is cst.UnaryOperation:
            return self.carries(node.expression, names)
        if kind is cst.IfExp:
            return self.carries(node.body, names) or self.carries(node.orelse, names)
        if kind in (cst.Tuple, cst.List):
            return any(self.carries(element.value, names) for element in node.elements)
        if kind is cst.Call:
            func = node.func
            if type(func) is cst.Attribute and self.facts.qualname(func) is None:
                return not self._not_its_values(node) and self.carries(func.value, names)
            return (self.facts.qualname(func) or "").startswith("torch.") and any(
                self.carries(arg.value, names) for arg in node.args)
        return False

    def _not_its_values(self, call: cst.Call) -> bool:
        func = call.func
        if type(func) is cst.Name:
            return func.value == "len" and "len" not in self.facts.imports
        return type(func) is cst.Attribute and func.attr.value in _NOT_ITS_VALUES and not (
            func.attr.value == "to" and self._casts_only(call))

    def host_use(self, node: cst.CSTNode, names) -> tuple[str, str] | None:
        """How ``node`` itself (not its children) works on the tensor values of one of ``names``
        where they must be on the host: (the name, what it does), else None. It reads them with
        ``.numpy()`` or passes them to numpy, PIL or OpenCV; it indexes, fills or
        computes with a tensor or numpy array made on the host (``out[rows, labels] = 1``
        after ``out = torch.zeros(n, d)``, ``torch.cat([x, c])``). Indexing such a tensor itself
        (``labels[torch.randperm(n)]``) works where it is."""
        kind = type(node)
        if kind is cst.Call:
            return self._host_call(node, names)
        if kind is cst.Subscript:
            if self._made_on_host(node.value, names):
                name = self._first_read(node.slice, names)
                return (name, "indexes a tensor made on the host with it") if name else None
        elif kind is cst.BinaryOperation:
            return self._computed_with_host(names, node.left, node.right)
        elif kind is cst.Comparison:
            return self._computed_with_host(names, node.left, *(c.comparator for c in node.comparisons))
        elif kind is cst.AugAssign:
            return self._computed_with_host(names, node.target, node.value)
        elif kind is cst.Assign:
            filled = any(type(t.target) is cst.Subscript and self._made_on_host(t.target.value, names)
                         for t in node.targets)
            name = self.tensor_read(node.value, names) if filled else None
            return (name, "puts it into a tensor made on the host") if name else None
        return None

    def _host_call(self, call: cst.Call, names) -> tuple[str, str] | None:
        func = call.func
        arguments = [arg.value for arg in call.args]
        if type(func) is cst.Attribute:
            if func.attr.value == "numpy":
                name = self.tensor_read(func.value, names)
                return (name, "reads it with .numpy()") if name else None
            if self.facts.qualname(func) is None:  # a tensor's method: the tensor is an operand
                return self._computed_with_host(names, func.value, *arguments)
        callee = self.facts.qualname(func) or ""
        if callee.startswith(_HOST_ARRAY_CALLS):
            name = self._first_read(arguments, names)
            return (name, f"passes it to {callee}()") if name else None
        if callee.startswith("torch."):
            operands = []  # torch.cat([x, c]): each tensor of a list
            for argument in arguments:
                listed = type(argument) in (cst.List, cst.Tuple)
                operands += [element.value for element in argument.elements] if listed else [argument]
            return self._computed_with_host(names, *operands)
        return None

    def _computed_with_host(self, names, *operands: cst.CSTNode) -> tuple[str, str] | None:
        """(the name, what it does) where one operand reads the values of one of ``names`` and
        another is a tensor made on the host."""
        name = self._first_read(operands, names)
        if name is None or not any(self._made_on_host(operand, names) for operand in operands):
            return None
        return name, "computes with it and a tensor made on the host"

    def _first_read(self, nodes, names) -> str | None:
        return next(filter(None, (self.tensor_read(node, names) for node in nodes)), None)

    def _made_on_host(self, node: cst.CSTNode, names) -> bool:
        """A tensor or numpy array made on the host (``torch.zeros(n, d)``, ``np.zeros((n, d))``),
        not from ``names``' values."""
        made = self.kind(node) is Kind.CPU or (self._made_by(node) or "").startswith("numpy.")
        return made and self.tensor_read(node, names) is None

    def _made_by(self, node: cst.CSTNode) -> str | None:
        """What made ``node``: the callee of a call, or of the call a name is assigned in the file."""
        if type(node) is cst.Call:
            return self.facts.qualname(node.func)
        return self.facts.assigned_calls.get(dotted(node) or "")


_COMPREHENSIONS = node_types(cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)
# A function or lambda: defining it runs none of its code (a class's body runs).
_DEFINED_CODE = frozenset({cst.Lambda, cst.FunctionDef})
# A statement or block nested in a compound statement (not part of its header).
_BLOCK_TYPES = node_types(cst.BaseSuite, cst.BaseStatement, cst.BaseSmallStatement, cst.Else, cst.Finally,
                          cst.ExceptHandler)


def _bindings_in(env: _Env | None, name: str) -> frozenset[cst.CSTNode]:
    bound = env.get(name) if env is not None else None
    return frozenset() if bound is None or bound[2] is None else _statements(bound[2])


def _breaks(loop: cst.For | cst.While) -> bool:
    """Whether a ``break`` of ``loop`` itself (not of a loop in it) leaves it."""
    return any(type(node) is cst.Break for node in descendants(loop.body, _OWN_BREAKS))


# What a ``break`` inside belongs to instead of the loop around it.
_OWN_BREAKS = frozenset({cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda})


def _wraps_iterable(node: cst.CSTNode) -> bool:
    """``tqdm(it, ...)``, ``iter(it)``, ``list(it)``: iterating it gives ``it``'s elements."""
    if not isinstance(node, cst.Call) or not node.args or node.args[0].keyword is not None:
        return False
    return (dotted(node.func) or "").split(".")[-1].lower() in ITERATE_THROUGH


# Names ----------------------------------------------------------------------------------------


def read_names(node: cst.CSTNode) -> set[str]:
    """The names an expression reads: ``a`` and ``c`` of ``a.b(k=c)`` (not attribute names or keywords)."""
    return _reads(node, chains=False)


def read_chains(node: cst.CSTNode) -> set[str]:
    """The names and dotted chains an expression reads: ``a``, ``a.b`` and ``c`` of ``a.b(k=c)``."""
    return _reads(node, chains=True)


def _reads(node: cst.CSTNode, chains: bool) -> set[str]:
    found: set[str] = set()
    pending = [node]
    while pending:
        child = pending.pop()
        kind = type(child)
        if kind is cst.Name:
            found.add(child.value)
        elif kind is cst.Attribute or kind is cst.Arg:
            if chains and kind is cst.Attribute:
                chain = dotted(child)
                if chain:
                    found.add(chain)
            pending.append(child.value)  # not the attribute's name, nor the argument's keyword
        else:
            pending.extend(children(child))
    return found


def target_names(target: cst.CSTNode) -> set[str]:
    """The plain names an assignment target binds (``a``, ``a, (b, *c)``; not ``a.b`` or ``a[i]``)."""
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(target_names(e.value) for e in target.elements)) if target.elements else set()
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return set()


def bound_names(node: cst.CSTNode) -> set[str]:
    """The names an expression binds for itself: comprehension targets and lambda parameters."""
    found: set[str] = set()

    def enter(child):
        if isinstance(child, cst.CompFor):
            found.update(target_names(child.target))
        elif isinstance(child, cst.Lambda):
            found.update(p.name.value for p in child.params.params)
        return True

    walk(node, enter)
    return found


def parses_options(assign: cst.Assign) -> bool:
    """Whether ``assign`` binds parsed command-line options (``args = parser.parse_args()``)."""
    value = assign.value
    return type(value) is cst.Call and type(value.func) is cst.Attribute \
        and value.func.attr.value in ("parse_args", "parse_known_args")


_NESTED_SCOPES = frozenset({cst.FunctionDef, cst.ClassDef, cst.Lambda})


def _moves(call: cst.Call) -> bool:
    """``x.to(...)`` or ``x.cuda()``, but for ``x.to("cpu")`` (a course's "keep the model on
    the CPU")."""
    func = call.func
    if type(func) is not cst.Attribute or func.attr.value not in ("to", "cuda"):
        return False
    return func.attr.value == "cuda" or not call.args or string_value(call.args[0].value) != "cpu"


def _binary_of(operator: cst.BaseAugOp) -> cst.BaseBinaryOp:
    name = type(operator).__name__.replace("Assign", "")
    return getattr(cst, name)()


class FileValues:
    """The per-file state of the analysis: functions and classes of the file, what their
    callers pass, what they return, and each scope's values (computed when first asked)."""

    def __init__(self, module: cst.Module, facts) -> None:
        self.module = module
        self.facts = facts
        # As the analysis walk notes them (still noting, where a question it asks makes this).
        definitions = facts.definitions
        self.functions, self.classes, self.defined = definitions.functions, definitions.classes, definitions.defined
        self._methods, self._nested = definitions.methods, definitions.nested
        self._scopes: dict[cst.FunctionDef | None, ScopeValues] = {}
        self._returning: set = set()
        self._returns: dict[cst.FunctionDef, Kind] = {}
        self._params: dict[tuple, Kind] = {}
        self._attributes: dict[cst.ClassDef, dict[str, list]] = {}
        self._attribute_kinds: dict[tuple, Kind] = {}
        self._calls: dict[cst.CSTNode, list[tuple[cst.Call, cst.FunctionDef | None, int]]] | None = None
        # Every call of the file with the function it is in, and the assignments of parsed
        # command-line options (``args = parser.parse_args()``): as ``Facts.calls`` has them.
        self._every_call: list[tuple[cst.Call, cst.FunctionDef | None]] | None = None
        self._parsing: list[cst.Assign] = []
        self._option_calls: list[cst.Call] | None = None
        self._options: dict[str, Kind] | None = None
        self._namespaces: set[str] = set()
        # How many scope walks are under way (``of`` re-walks provisional scopes at none).
        self._walking = 0
        # Per function, what ``_joined`` gives (a provisional scope's walk runs again, and asks).
        self._joined_names: dict[cst.FunctionDef, frozenset[str]] = {}
        # The names a ``.to()``/``.cuda()`` may move (``kept_on_host``), found when first asked.
        self._handed: frozenset[str] | None = None

    def forget(self) -> None:
        """Drop the scopes' values, which refer back to this analysis."""
        self._scopes.clear()

    def local_names(self, body: cst.CSTNode) -> frozenset[str]:
        """The names a function's body (or the module) binds, which are local to it throughout."""
        return self.facts.local_names[body]

    # Scopes ------------------------------------------------------------------------------------

    def of(self, scope: cst.FunctionDef | None) -> ScopeValues:
        """A scope's values; while they are being computed (a function called from the scope
        asks what its callers pass), what the walk has seen so far."""
        found = self._scopes.get(scope)
        if found is None:
            self._walking += 1
            try:
                parent = self.parent_values(scope)
                found = self._scopes.get(scope)  # the parent's walk may have asked for this scope
                if found is None:
                    found = self._scopes[scope] = ScopeValues(self, scope, parent)
                    found.walk()
            finally:
                self._walking -= 1
        if found.provisional and not self._walking:
            # Walked while a function it calls was being computed (``test()`` asked this scope what
            # it passes while the scope bound ``test()``'s result): that return is known now, so
            # the provisional scopes are walked again (each round knows more returns: it ends).
            for stale in [key for key, values in self._scopes.items() if values.provisional]:
                del self._scopes[stale]
            found = self.of(scope)
        return found

    def parent_values(self, scope: cst.FunctionDef | None) -> ScopeValues | None:
        if scope is None:
            return None
        function = self.functions.get(scope)
        return self.of(function.parent if function is not None else None)

    def owner_of(self, scope: cst.FunctionDef | None) -> cst.ClassDef | None:
        function = self.functions.get(scope)
        return function.owner if function is not None else None

    def method(self, owner: cst.ClassDef, name: str) -> cst.FunctionDef | None:
        found = self._methods.get(owner, {}).get(name)
        if found is not None:
            return found
        for base in owner.bases:
            parent = self.classes.get(dotted(base.value) or "")
            if parent is not None and parent is not owner:
                found = self.method(parent, name)
                if found is not None:
                    return found
        return None

    def class_kind(self, owner: cst.ClassDef) -> Kind:
        return Kind.MODEL if self._is_module(owner) else Kind.UNKNOWN

    def _is_module(self, owner: cst.ClassDef, seen=()) -> bool:
        for base in owner.bases:
            name = dotted(base.value) or ""
            qualified = self.facts.qualname(base.value) or ""
            if qualified in _MODEL_ANNOTATIONS or qualified.startswith("torch.nn.") or name in ("nn.Module", "Module"):
                return True
            parent = self.classes.get(name)
            if parent is not None and parent not in seen and self._is_module(parent, (*seen, owner)):
                return True
        return False

    # Calls -------------------------------------------------------------------------------------

    def call_kind(self, defined: cst.CSTNode, call: cst.Call, caller: ScopeValues) -> Kind:
        """What calling a function or class of this file gives."""
        if isinstance(defined, cst.ClassDef):
            return self.class_kind(defined)
        if defined in self._returning and defined not in self._returns:
            caller.waits()
            return Kind.UNKNOWN
        returned = self.return_kind(defined)
        if returned is Kind.UNKNOWN and caller._any_tensor_argument(call):
            return Kind.TENSOR
        return returned

    def return_kind(self, function: cst.FunctionDef) -> Kind:
        if function in self._returns:
            return self._returns[function]
        if function in self._returning:
            return Kind.UNKNOWN
        self._returning.add(function)
        try:
            values = self.of(function)
            returned, yielded = _returns_and_yields(function)
            if yielded:
                kinds = [values.kind(node) for node in yielded]
                kind = Kind.LOADER if any(k in TENSORS for k in kinds) else Kind.UNKNOWN
            elif not returned:
                kind = Kind.NONE
            else:
                kinds = [values.kind(node) if node is not None else Kind.NONE for node in returned]
                plain = [k for k in kinds if k is not Kind.NONE] or kinds
                kind = join(plain)
        finally:
            self._returning.discard(function)
        self._returns[function] = kind
        return kind

    def returned_parts(self, function: cst.FunctionDef, count: int) -> list[Kind] | None:
        """The kind of each of the ``count`` values that every return of ``function`` gives as a
        tuple, or None."""
        returned, yielded = _returns_and_yields(function)
        if yielded or not returned or function in self._returning:
            return None
        if not all(isinstance(r, cst.Tuple) and len(r.elements) == count for r in returned):
            return None
        if any(isinstance(e, cst.StarredElement) for r in returned for e in r.elements):
            return None
        self._returning.add(function)
        try:
            values = self.of(function)
            return [join([values.kind(r.elements[i].value) for r in returned]) for i in range(count)]
        finally:
            self._returning.discard(function)

    def returned_reads(self, name: str) -> frozenset[str]:
        """The parameters that the file's function ``name`` returns read on the host (apex's
        ``def to_python_float(t): return t.float().item()``): a call passing a tensor there waits
        for it."""
        if not isinstance(self.defined.get(name), cst.FunctionDef):
            return frozenset()
        return self.facts.returned_reads.get(name, frozenset())

    def arguments(self, call: cst.Call, name: str) -> dict[str, cst.BaseExpression]:
        """Parameter name -> argument of a call of the file's function ``name``."""
        info = self.functions.get(self.defined.get(name))
        return _passing(info, call, 0) if info is not None else {}

    def param_kind(self, scope: cst.FunctionDef, param: cst.Param) -> Kind:
        """A parameter's kind: its annotation's, else what the file's callers pass, else its
        default's."""
        key = (scope, param.name.value)
        if key in self._params:
            return self._params[key]
        self._params[key] = Kind.UNKNOWN  # while computing (recursion)
        kind = Kind.UNKNOWN
        if param.annotation is not None:
            kind = self.annotation_kind(param.annotation.annotation)
        if kind is Kind.UNKNOWN:
            passed = self._passed(scope, param)
            if param.default is not None and not _neutral(param.default):
                passed.append(_literal_kind(param.default))
            kind = join(passed) if passed else Kind.UNKNOWN
        if kind is Kind.UNKNOWN and param.name.value in self._joined(scope):
            kind = Kind.TENSOR  # torch.cat((idx, idx_next)) takes tensors only
        if kind is Kind.UNKNOWN and self._spawned_index(scope, param):
            kind = Kind.INT  # mp.spawn(fn, ...) calls fn(index, *args)
        self._params[key] = kind
        return kind

    def _spawned_index(self, scope: cst.FunctionDef, param: cst.Param) -> bool:
        """Whether ``param`` is the first parameter of a function the file spawns processes of."""
        params = scope.params
        first = (*params.posonly_params, *params.params)[:1]
        return bool(first) and first[0] is param and any(scope in spawn.workers for spawn in self.facts.spawns())

    def _joined(self, scope: cst.FunctionDef) -> frozenset[str]:
        """The names that ``scope`` concatenates or stacks (``torch.cat((idx, idx_next), dim=1)``):
        tensors, whatever its callers pass."""
        known = self._joined_names.get(scope)
        if known is not None:
            return known
        found: set[str] = set()
        for node in descendants(scope.body, _NESTED_SCOPES):
            if type(node) is cst.Call and node.args and self.facts.qualname(node.func) in _JOINING:
                parts = node.args[0].value
                if isinstance(parts, (cst.Tuple, cst.List)):
                    found.update(e.value.value for e in parts.elements if isinstance(e.value, cst.Name))
        found = self._joined_names[scope] = frozenset(found)
        return found

    def _passed(self, scope: cst.FunctionDef, param: cst.Param) -> list[Kind]:
        kinds = []
        for caller, _, arguments in self.passed(scope):
            if param.name.value in arguments:
                kinds.append(self.of(caller).kind(arguments[param.name.value]))
        return kinds

    def passed(self, function: cst.FunctionDef) -> list[tuple[cst.FunctionDef | None, cst.Call, dict]]:
        """What each call of ``function`` in this file passes: (calling scope, the call,
        parameter name -> argument)."""
        info = self.functions.get(function)
        if info is None:
            return []
        return [(caller, call, _passing(info, call, shift)) for call, caller, shift in self.calls_of(function)]

    def callee(self, call: cst.Call, scope) -> tuple[cst.FunctionDef, dict[str, cst.BaseExpression]] | None:
        """The function of this file that ``call`` (in ``scope``) runs, and parameter name ->
        argument; None for a call of anything else."""
        function, shift = self._target(call, scope)
        info = self.functions.get(function)
        return (function, _passing(info, call, shift)) if info is not None else None

    def calls_of(self, function: cst.FunctionDef) -> list[tuple[cst.Call, cst.FunctionDef | None, int]]:
        """The calls of ``function`` in this file: (call, calling scope, how many leading
        parameters the call does not pass: 1 for ``self``)."""
        if self._calls is None:
            self._calls = {}
            for call, scope in self._calls_in_file():
                self._note_call(call, scope)
        return self._calls.get(function, [])

    def _calls_in_file(self) -> list[tuple[cst.Call, cst.FunctionDef | None]]:
        """Every call of the file in source order, with the function it is in (None outside
        any): what the analysis walk recorded; asked before that walk has ended (a device read
        from a command-line option's default), a walk of their own finds them."""
        if self._every_call is None:
            if self.facts.calls is not None:
                self._every_call, self._parsing = self.facts.calls, self.facts.option_parses
            else:
                self._every_call = []
                self._find_calls(self.module, None)
        return self._every_call

    def _find_calls(self, node: cst.CSTNode, scope) -> None:
        for child in children(node):
            kind = type(child)
            if kind is cst.FunctionDef:
                self._find_calls(child, child)
                continue
            if kind is cst.Call:
                self._every_call.append((child, scope))
            elif kind is cst.Assign and parses_options(child):
                self._parsing.append(child)
            self._find_calls(child, scope)

    def kept_on_host(self, name: str) -> bool:
        """Whether the module ``name`` stays on the host where the file builds it (a course's
        first model, trained on the CPU before others are placed): each assignment of it builds
        one (no ``.to()``, no ``device=``, no other model inside), no ``.to()``/``.cuda()`` is
        called on it, and it is passed only to functions of this file that neither move nor
        pass on that parameter (a wrapper or a helper of another file may move it)."""
        if self._handed is None:
            self._handed = self._moved_or_passed()
        built = self.facts.assignments.get(name)
        return bool(built) and name not in self._handed and all(self._builds_on_host(value) for value in built)

    def _builds_on_host(self, value: cst.BaseExpression) -> bool:
        if type(value) is not cst.Call:
            return False
        for node in (value, *descendants(value, _NESTED_SCOPES)):
            if type(node) is cst.Arg and node.keyword is not None and node.keyword.value == "device":
                return False
            if type(node) is cst.Call and _moves(node):
                return False
            if type(node) is cst.Name and node.value in self.facts.models:
                return False
        return True

    def _moved_or_passed(self) -> frozenset[str]:
        """The names of the file that a ``.to()``/``.cuda()`` may move: in place, or in a
        function they are passed to (or in anything of another file)."""
        moved: set[str] = set()
        handled: dict[cst.FunctionDef | None, set[str]] = {}  # per scope: names moved or passed on
        passing: list[tuple[cst.Call, cst.FunctionDef | None, str]] = []
        for call, scope in self._calls_in_file():
            if _moves(call):
                receiver = call.func.value
                while type(receiver) in (cst.Attribute, cst.Subscript):
                    receiver = receiver.value
                if type(receiver) is cst.Name:
                    moved.add(receiver.value)
                    handled.setdefault(scope, set()).add(receiver.value)
            for arg in call.args:
                if type(arg.value) is cst.Name:
                    handled.setdefault(scope, set()).add(arg.value.value)
                    passing.append((call, scope, arg.value))
        for call, scope, name in passing:
            found = self.callee(call, scope)
            param = None if found is None else next((p for p, value in found[1].items() if value is name), None)
            if param is None or param in handled.get(found[0], ()):
                moved.add(name.value)
        # Another name for the module (``model = model_0``, ``models = [model_0]``) may move it.
        for values in self.facts.assignments.values():
            for value in values:
                parts = [e.value for e in value.elements] if type(value) in (cst.Tuple, cst.List, cst.Set) else [value]
                moved.update(part.value for part in parts if type(part) is cst.Name)
        return frozenset(moved)

    def option_calls(self) -> list[cst.Call]:
        """The file's ``parser.add_argument(...)`` calls, in source order."""
        if self._option_calls is None:
            text = self.facts.text
            self._option_calls = [] if text is not None and "add_argument" not in text else [
                call for call, _ in self._calls_in_file()
                if type(call.func) is cst.Attribute and call.func.attr.value == "add_argument"
            ]
        return self._option_calls

    def _note_call(self, call: cst.Call, scope) -> None:
        target, shift = self._target(call, scope)
        if target is not None:
            self._calls.setdefault(target, []).append((call, scope, shift))

    def _target(self, call: cst.Call, scope) -> tuple[cst.FunctionDef | None, int]:
        """The function of this file that ``call`` runs (None if none), and how many leading
        parameters the call does not pass (1 for ``self``)."""
        func = call.func
        target, shift = None, 0
        kind = type(func)
        if kind is cst.Name:
            defined = self._visible(scope, func.value)
            if type(defined) is cst.FunctionDef:
                target = defined
            elif type(defined) is cst.ClassDef:
                target, shift = self.method(defined, "__init__"), 1
        elif kind is cst.Attribute and type(func.value) is cst.Name and func.value.value == "self":
            owner = self.owner_of(scope)
            if owner is not None:
                target, shift = self.method(owner, func.attr.value), 1
        return target, shift

    def _visible(self, scope, name: str) -> cst.CSTNode | None:
        """The function or class ``name`` calls from ``scope``: one defined in it or in a
        function around it, else one of module level."""
        while scope is not None:
            nested = self._nested.get((scope, name))
            if nested is not None:
                return nested
            function = self.functions.get(scope)
            scope = function.parent if function is not None else None
        return self.defined.get(name)

    # self.attributes ---------------------------------------------------------------------------

    def note_attribute(self, scope, attribute: str, target: cst.CSTNode, kind: Kind, neutral: bool) -> None:
        """Record that ``target`` (``self.attribute = ...`` in method ``scope``) binds a value of
        ``kind``; a loop's later, settled pass over the same target replaces the earlier one."""
        owner = self.owner_of(scope)
        if owner is not None:
            self._attributes.setdefault(owner, {}).setdefault(attribute, {})[target] = (kind, neutral)

    def attribute_kind(self, owner: cst.ClassDef, attribute: str) -> Kind:
        """The kind of ``self.attribute`` in ``owner``'s methods: the join of what every method
        assigns it."""
        key = (owner, attribute)
        if key in self._attribute_kinds:
            return self._attribute_kinds[key]
        self._attribute_kinds[key] = Kind.UNKNOWN  # while computing
        for method in self._methods.get(owner, {}).values():
            self.of(method)  # walking a method records its self.attribute bindings
        plain, neutral = [], []
        for kind, is_neutral in self._attributes.get(owner, {}).get(attribute, {}).values():
            (neutral if is_neutral else plain).append(kind)
        kind = join(plain) if plain else join(neutral)
        self._attribute_kinds[key] = kind
        return kind

    # Annotations and argparse ------------------------------------------------------------------

    def annotation_kind(self, annotation: cst.BaseExpression) -> Kind:
        name = dotted(annotation)
        if name in _PLAIN_ANNOTATIONS:
            return _PLAIN_ANNOTATIONS[name]
        return _ANNOTATION_KINDS.get(self.facts.qualname(annotation) or "", Kind.UNKNOWN)

    def option_kind(self, node: cst.Attribute) -> Kind | None:
        """``args.lr`` where ``args`` holds parsed command-line options: the option's type."""
        if not isinstance(node.value, cst.Name):
            return None
        options = self._argparse_options()
        if not options or node.attr.value not in options:
            return None
        return options[node.attr.value] if self.names_options(node.value.value) else None

    def names_options(self, name: str) -> bool:
        """Whether ``name`` holds the file's parsed command-line options: assigned
        ``parser.parse_args()``, or named as scripts name them."""
        self._argparse_options()
        return name in self._namespaces or name in _OPTION_NAMESPACES

    def _argparse_options(self) -> dict[str, Kind]:
        """The file's ``parser.add_argument`` options by destination, and the names assigned
        ``parser.parse_args()``."""
        if self._options is not None:
            return self._options
        self._options = {}
        for call in reversed(self.option_calls()):  # later options come first: the first of a name wins
            self._note_option(call)
        for assign in self._parsing:
            for target in assign.targets:
                first = target.target
                if isinstance(first, cst.Tuple) and first.elements:
                    first = first.elements[0].value
                if isinstance(first, cst.Name):
                    self._namespaces.add(first.value)
        return self._options

    def _note_option(self, call: cst.Call) -> None:
        flags = [a.value for a in call.args if a.keyword is None]
        names = [f.evaluated_value for f in flags if isinstance(f, cst.SimpleString)]
        keywords = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        dest = keywords.get("dest")
        if isinstance(dest, cst.SimpleString):
            name = dest.evaluated_value
        else:
            long = [n for n in names if n.startswith("--")]
            name = (long[0] if long else names[0] if names else "").lstrip("-").replace("-", "_")
        if not name:
            return
        kind = Kind.UNKNOWN
        option_type = keywords.get("type")
        action = keywords.get("action")
        if option_type is not None and dotted(option_type) in _ARGPARSE_TYPES:
            kind = _ARGPARSE_TYPES[dotted(option_type)]
        elif isinstance(action, cst.SimpleString) and action.evaluated_value in ("store_true", "store_false"):
            kind = Kind.BOOL
        elif isinstance(action, cst.SimpleString) and action.evaluated_value == "count":
            kind = Kind.INT
        elif "default" in keywords and option_type is None and "nargs" not in keywords:
            default = keywords["default"]
            if isinstance(default, (cst.Integer, cst.Float, cst.SimpleString)) or dotted(default) in ("True", "False"):
                kind = _literal_kind(default)
        elif option_type is None and "nargs" not in keywords and action is None:
            kind = Kind.STR
        if "nargs" in keywords:
            kind = Kind.PYTHON
        self._options[name] = kind


def _passing(info: _Function, call: cst.Call, shift: int) -> dict[str, cst.BaseExpression]:
    """Parameter name -> argument of ``call`` of a function whose first ``shift`` parameters
    the call does not pass."""
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    arguments = dict(zip(info.params[shift:], positional))
    arguments.update((a.keyword.value, a.value) for a in call.args if a.keyword is not None)
    return arguments


def _literal_kind(node: cst.BaseExpression) -> Kind:
    if isinstance(node, cst.Integer):
        return Kind.INT
    if isinstance(node, cst.Float):
        return Kind.FLOAT
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        return Kind.STR
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return Kind.BOOL
    return Kind.UNKNOWN


def _element(kind: Kind) -> Kind:
    """The kind of each name of ``a, b = value``."""
    if kind in TENSORS:
        return Kind.TENSOR
    if kind is Kind.CPU:
        return Kind.CPU
    return Kind.PYTHON if kind in HOST else Kind.UNKNOWN


def returned_read(statement: cst.Return, params: set[str]) -> frozenset[str]:
    """The ``params`` whose value a return statement reads on the host: ``t`` of
    ``return t.float().item()`` or ``return float(t[0])``."""
    found = set()
    for node in descendants(statement):
        if not isinstance(node, cst.Call):
            continue
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in SYNC_METHODS:
            read = func.value
        elif isinstance(func, cst.Name) and func.value in SYNC_BUILTINS and node.args:
            read = node.args[0].value
        else:
            continue
        while isinstance(read, (cst.Attribute, cst.Subscript, cst.Call)):
            read = read.func if isinstance(read, cst.Call) else read.value
        if isinstance(read, cst.Name) and read.value in params:
            found.add(read.value)
    return frozenset(found)


def _returns_and_yields(function: cst.FunctionDef) -> tuple[list, list]:
    """The values of ``function``'s own return and yield statements (None for a bare return)."""
    returned, yielded = [], []
    for node in descendants(function.body, _NESTED_SCOPES):
        kind = type(node)
        if kind is cst.Return:
            returned.append(node.value)
        elif kind is cst.Yield:
            value = node.value
            if isinstance(value, cst.From):
                value = value.item
            yielded.append(value if value is not None else cst.Name("None"))
    return returned, yielded
