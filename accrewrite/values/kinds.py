"""The kinds of value a training script's expressions hold, and what the value analysis knows of
PyTorch, Python and host libraries: which calls give tensors, host values, models or loaders,
which read a tensor's value on the host."""

from __future__ import annotations

import enum
import re
from types import MappingProxyType

import libcst as cst

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
BUILTIN_KINDS = MappingProxyType({
    "len": Kind.INT, "id": Kind.INT, "hash": Kind.INT, "ord": Kind.INT, "isinstance": Kind.BOOL,
    "issubclass": Kind.BOOL, "hasattr": Kind.BOOL, "callable": Kind.BOOL, "any": Kind.BOOL, "all": Kind.BOOL,
    # A set compares its members by identity and hash, not by their values.
    "set": Kind.PYTHON, "frozenset": Kind.PYTHON,
    "print": Kind.NONE, "open": Kind.PYTHON, "type": Kind.PYTHON, "range": Kind.PYTHON, "chr": Kind.STR,
    "input": Kind.STR, "vars": Kind.PYTHON, "dir": Kind.PYTHON, "locals": Kind.PYTHON, "globals": Kind.PYTHON,
})
# Builtins whose result holds what their argument holds.
PASS_THROUGH = frozenset({"list", "tuple", "sorted", "reversed", "iter", "abs", "dict"})
# Builtins and wrappers whose elements are their first argument's elements (tqdm(loader), ...).
ITERATE_THROUGH = frozenset({"iter", "list", "tuple", "sorted", "reversed", "tqdm", "trange", "islice", "cycle"})
# torch namespaces whose functions return Python values or objects, not tensors.
HOST_TORCH = (
    "torch.cuda.", "torch.distributed.", "torch.backends.", "torch.utils.", "torch.optim.",
    "torch.accelerator.", "torch.mps.", "torch.xpu.", "torch.multiprocessing.", "torch.hub.",
    "torch.jit.", "torch.onnx.", "torch.profiler.", "torch.amp.", "torch.autograd.profiler",
    "torch.__future__.",
)
HOST_TORCH_FUNCTIONS = MappingProxyType({
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
HOST_MODULES = ("math.", "time.", "os.", "random.", "numpy.", "datetime.", "json.", "pickle.", "sys.",
                 "re.", "socket.", "platform.", "subprocess.", "shutil.", "glob.", "pathlib.", "logging.",
                 "statistics.", "itertools.count", "string.", "argparse.", "yaml.", "inspect.")
# Libraries whose functions take host arrays: a tensor given to them must be on the host (numpy
# converts it with ``.numpy()``, PIL and OpenCV take numpy arrays). torchvision's image writers
# copy a tensor to the host themselves.
HOST_ARRAY_CALLS = ("numpy.", "PIL.", "cv2.", "scipy.", "sklearn.", "skimage.", "matplotlib.")
# Tensor methods that give what is known without the tensor's values, a number read from it or
# a copy elsewhere: what they give is no longer the tensor (``.to(dtype)`` alone converts it).
NOT_ITS_VALUES = frozenset({*META_METHODS, "item", "tolist", "cpu", "cuda", "to"})
# A legacy CUDA tensor type (``torch.cuda.FloatTensor``), whose ``x.type(...)`` moves ``x`` to CUDA.
CUDA_TENSOR_TYPE = re.compile(r"torch\.cuda\.[A-Z][A-Za-z0-9]*Tensor")
# The nodes ``ScopeValues.host_use`` answers for; it gives None for any other.
HOST_USE_NODES = frozenset({cst.Call, cst.Subscript, cst.BinaryOperation, cst.Comparison, cst.AugAssign, cst.Assign})
MODEL_ANNOTATIONS = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})
# What a value annotated with a torch class holds.
ANNOTATION_KINDS = MappingProxyType({
    **dict.fromkeys(("torch.Tensor", "torch.FloatTensor", "torch.LongTensor", "torch.BoolTensor"), Kind.TENSOR),
    **dict.fromkeys(MODEL_ANNOTATIONS, Kind.MODEL),
    **dict.fromkeys(("torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"), Kind.LOADER),
})
PLAIN_ANNOTATIONS = MappingProxyType({"int": Kind.INT, "float": Kind.FLOAT, "bool": Kind.BOOL, "str": Kind.STR})
# A model's members that give the model itself, and those that give its tensors.
MODEL_SELF = frozenset({"to", "cuda", "cpu", "train", "eval", "half", "float", "bfloat16", "double",
                         "requires_grad_", "module", "_orig_mod"})
MODEL_TENSORS = frozenset({"parameters", "buffers", "weight", "bias"})
MODEL_ATTRIBUTES = MappingProxyType({**dict.fromkeys(MODEL_SELF, Kind.MODEL), **dict.fromkeys(MODEL_TENSORS, Kind.TENSOR)})
# What a model's methods give; another (``estimate_mfu``) gives what the file's class returns.
MODEL_METHODS = MappingProxyType({
    **MODEL_ATTRIBUTES, "forward": Kind.TENSOR, "__call__": Kind.TENSOR, "named_parameters": Kind.TENSOR,
    "state_dict": Kind.HOLDER,
})
NAMED_ITEMS = frozenset({"items", "named_parameters", "named_buffers", "named_modules", "named_children"})
# torch functions that make a tensor (on the host, unless given a device).
FACTORIES = frozenset({
    "zeros", "ones", "full", "empty", "randn", "rand", "randint", "randperm", "arange", "linspace", "eye",
    "tensor", "as_tensor", "from_numpy", "zeros_like", "ones_like", "Tensor", "LongTensor", "FloatTensor",
})
# Methods that put their argument into a container.
ADDS = frozenset({"append", "extend", "insert", "add", "appendleft"})
STRING_METHODS = frozenset({"format", "join", "strip", "lower", "upper", "replace", "rjust", "ljust", "center"})


# torch functions whose first argument is a sequence of tensors.
JOINING = frozenset({"torch.cat", "torch.concat", "torch.concatenate", "torch.stack"})

# What makes a Hugging Face metric: its add_batch/add/compute turn the tensors given into numpy.
METRIC_LOADERS = frozenset({"evaluate.load", "datasets.load_metric"})
METRIC_READS = frozenset({"add_batch", "add", "compute"})
# Host modules whose functions read a tensor given as a number (``math.exp(loss)``).
NUMBER_MODULES = ("math.", "statistics.")

# torch.cuda.synchronize() and the targets' spellings of it (xm.wait_device_ops()).
WAITS = frozenset({"torch.cuda.synchronize", *spelled_callees("synchronize")})
# The targets' device loaders: iterating one gives its loader's elements, their tensors moved.
DEVICE_LOADERS = frozenset(spelled_callees("device_loader"))
# The words of the host reads that ``ScopeValues.sync`` finds (a rule's trigger words), and the
# nodes that read a tensor's value without a word of their own (its truth value, an f-string).
SYNC_WORDS = frozenset({
    *SYNC_METHODS, *SYNC_BUILTINS, "max", "min", "tensor", "as_tensor", *METRIC_READS,
    *(module.rstrip(".") for module in NUMBER_MODULES), *(name.rsplit(".", 1)[-1] for name in WAITS),
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


def is_initialiser(value: cst.BaseExpression) -> bool:
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


def literal_kind(node: cst.BaseExpression) -> Kind:
    if isinstance(node, cst.Integer):
        return Kind.INT
    if isinstance(node, cst.Float):
        return Kind.FLOAT
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        return Kind.STR
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return Kind.BOOL
    return Kind.UNKNOWN


def element_kind(kind: Kind) -> Kind:
    """The kind of each name of ``a, b = value``."""
    if kind in TENSORS:
        return Kind.TENSOR
    if kind is Kind.CPU:
        return Kind.CPU
    return Kind.PYTHON if kind in HOST else Kind.UNKNOWN


