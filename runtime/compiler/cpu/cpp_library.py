"""The C++ kernels of a compiled graph built as one library per compile thread (CPU).

Inductor builds every C++ kernel it generates for the CPU as a library of its own: one g++ run
per kernel, and each run first loads the precompiled ATen headers (150 MB): 0.45 s for an empty
kernel, 0.6-1.0 s for a GPT's. Measured on the 26 kernels of a 12-block GPT's training graphs:
18.6 s of g++ one by one, 2.2 s as one source, 1.3 s and 1.6 s as two. On a CPU the kernels'
compilation is most of a model's first step, so ``batched()`` builds each graph's kernels as
one library per compile thread: the same kernel code, with the same flags, in fewer g++ runs.

How: the Python module inductor writes for a graph defines each kernel with
``async_compile.cpp_pybinding(argtypes, source)`` and then calls ``async_compile.wait``. Under
``batched()`` the ``AsyncCompile`` those modules create (``LibraryAsyncCompile``) keeps the
kernels until ``wait``, puts each in a namespace of its own, adds one Python module with a
function per kernel, and has inductor's ``CppPythonBindingsCodeCache`` build it (flags, the
precompiled header and its on-disk cache are inductor's). A kernel whose source does not fit
that shape, or a library that fails to build, is built on its own as inductor would.

``load_functions`` builds accrewrite's own C++ (``cpu_kernels.cpp``) the same way, with its
functions bound as the kernels are.
"""

import contextlib
import contextvars
import dataclasses
import logging
import re
from concurrent.futures import Future

from accrewrite.base import torch_compat as compat

log = logging.getLogger(__name__)

_BATCHED = contextvars.ContextVar("accrewrite_cpp_library", default=False)

# inductor's CPU kernel: one C-linkage entry point named "kernel"
_ENTRY = re.compile(r'extern\s+"C"(?P<declaration>[^(;{]*?\bvoid\s+(\w+\s+)?kernel\s*\()')
_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b", re.MULTILINE)


@dataclasses.dataclass
class _Kernel:
    """One kernel waiting for its library: its argument types, its source, the includes it
    starts with, the rest of it with a C++ (not C) entry point, and the future that the graph
    module holds for it."""

    argtypes: list[str]
    source: str
    includes: list[str]
    body: str
    future: Future = dataclasses.field(default_factory=Future)


def _kernel(argtypes, source: str) -> _Kernel | None:
    """``source`` as a kernel of a library, or None where it is not one C-linkage entry point
    "kernel" after its includes."""
    lines = source.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if line.strip() and not _INCLUDE.match(line)), 0
    )
    body = "\n".join(lines[start:])
    entries = list(_ENTRY.finditer(body))
    if len(entries) != 1 or body.count('extern "C"') != 1 or _INCLUDE.search(body):
        return None
    # C linkage would make the "kernel" of every namespace one symbol
    entry = entries[0]
    body = body[: entry.start()] + entry["declaration"] + body[entry.end():]
    includes = [line.strip() for line in lines[:start] if line.strip()]
    return _Kernel(list(argtypes), source, includes, body)


class LibraryAsyncCompile(compat.async_compile.AsyncCompile):
    """Inductor's ``AsyncCompile``; under ``batched()`` its C++ kernels wait for ``wait`` and
    are built as libraries of several kernels."""

    def __init__(self):
        super().__init__()
        self._waiting: list[_Kernel] = []

    def cpp_pybinding(self, argtypes, source_code):
        kernel = _kernel(argtypes, source_code) if _BATCHED.get() else None
        if kernel is None:
            return super().cpp_pybinding(argtypes, source_code)
        self._waiting.append(kernel)
        return kernel.future

    def wait(self, scope):
        if self._waiting:
            kernels, self._waiting = self._waiting, []
            _build(kernels)
            waiting = {id(kernel.future) for kernel in kernels}
            for name, value in scope.items():
                if id(value) in waiting:
                    scope[name] = value.result()
        super().wait(scope)


def _build(kernels: list[_Kernel]) -> None:
    """Build ``kernels`` as one library per compile thread and set each kernel's future."""
    threads = compat.async_compile.get_compile_threads()
    # as AsyncCompile.cpp_pybinding: with one thread the build runs here (submitted, it would
    # wait for the file lock that load_async holds while it submits)
    submit = compat.async_compile.AsyncCompile.submit if threads > 1 else None
    count = min(threads, len(kernels))
    groups = [[] for _ in range(count)]
    sizes = [0] * count
    # the largest first, each to the smallest library so far: libraries of like build times
    for kernel in sorted(kernels, key=lambda k: len(k.body), reverse=True):
        smallest = sizes.index(min(sizes))
        groups[smallest].append(kernel)
        sizes[smallest] += len(kernel.body)
    cache = compat.CppPythonBindingsCodeCache
    loading = [
        (group, cache.load_async(library_source(group), submit_fn=submit)) for group in groups
    ]
    for group, load in loading:
        try:
            module = load()
        except Exception as error:  # noqa: BLE001 - any failure: build the kernels one by one
            log.warning("C++ kernels built one by one, their library failed: %s", error)
            for kernel in group:
                kernel.future.set_result(
                    cache.load_pybinding(kernel.argtypes, kernel.source)
                )
            continue
        for index, kernel in enumerate(group):
            kernel.future.set_result(getattr(module, f"kernel_{index}"))


def library_source(kernels: list[_Kernel]) -> str:
    """The C++ source of one library: the kernels' includes, each kernel in a namespace of its
    own, and a Python module ``kernel`` whose function ``kernel_<i>`` calls the i-th kernel, as
    inductor's binding of one kernel does (``CppPythonBindingsCodeCache.suffix_template``)."""
    includes = list(dict.fromkeys(line for kernel in kernels for line in kernel.includes))
    lines = [*includes, ""]
    for index, kernel in enumerate(kernels):
        lines += [f"namespace accrewrite_kernel_{index} {{", kernel.body, "}", ""]
    lines.append(_bindings([
        (f"kernel_{index}", f"accrewrite_kernel_{index}::kernel", kernel.argtypes)
        for index, kernel in enumerate(kernels)
    ]))
    return "\n".join(lines)


def load_functions(source: str, functions: dict[str, list[str]]):
    """The module built from the C++ ``source`` as inductor builds its kernels (its flags,
    precompiled header and on-disk cache), with a Python function for each of ``functions``:
    the name of a C-linkage function of ``source`` and its argument types, as inductor gives
    them (pointers, which take tensors, ``int64_t`` and ``float``)."""
    bindings = _bindings([(name, name, argtypes) for name, argtypes in functions.items()])
    return compat.CppPythonBindingsCodeCache.load_async(f"{source}\n{bindings}")()


def _bindings(functions: list[tuple[str, str, list[str]]]) -> str:
    """The Python module ``kernel`` with, for each (name, C++ function, argument types), a
    function of that name calling that C++ function."""
    lines = [_BINDING_PRELUDE]
    for name, callee, argtypes in functions:
        arguments = ", ".join(
            f"parse_arg<{argtype.replace('const ', '')}>(args, {n})"
            for n, argtype in enumerate(argtypes)
        )
        lines.append(_BINDING_FUNCTION.format(
            name=name, callee=callee, count=len(argtypes), arguments=arguments
        ))
    table = "".join(f'    {{"{name}", {name}_py, METH_VARARGS, ""}},\n' for name, *_ in functions)
    lines.append(_BINDING_MODULE.replace("@METHODS@", table))
    return "\n".join(lines)


_BINDING_PRELUDE = r"""
// Python bindings: the module "kernel", a function per C++ function
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>

// defined in torch's guards.cpp; its address comes in an environment variable (see PyInit)
static void* (*tensor_data_ptr)(PyObject* obj);

template <typename T> static inline T parse_arg(PyObject* args, size_t n) {
    static_assert(std::is_pointer_v<T>, "arg type must be pointer, int64_t, uintptr_t or float");
    return static_cast<T>(tensor_data_ptr(PyTuple_GET_ITEM(args, n)));
}
template <> inline int64_t parse_arg<int64_t>(PyObject* args, size_t n) {
    auto result = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, n));
    if (result == -1 && PyErr_Occurred()) [[unlikely]]
        throw std::runtime_error("expected int arg");
    return result;
}
template <> inline uintptr_t parse_arg<uintptr_t>(PyObject* args, size_t n) {
    auto result = PyLong_AsVoidPtr(PyTuple_GET_ITEM(args, n));
    if (result == reinterpret_cast<void*>(-1) && PyErr_Occurred()) [[unlikely]]
        throw std::runtime_error("expected int arg");
    return reinterpret_cast<uintptr_t>(result);
}
template <> inline float parse_arg<float>(PyObject* args, size_t n) {
    auto result = PyFloat_AsDouble(PyTuple_GET_ITEM(args, n));
    if (result == -1.0 && PyErr_Occurred()) [[unlikely]]
        throw std::runtime_error("expected float arg");
    return static_cast<float>(result);
}

template <typename Call> static PyObject* call_kernel(PyObject* args, Py_ssize_t count, Call call) {
    try {
        if (!PyTuple_CheckExact(args)) [[unlikely]]
            throw std::runtime_error("tuple args required");
        if (PyTuple_GET_SIZE(args) != count) [[unlikely]]
            throw std::runtime_error("requires " + std::to_string(count) + " args");
        call();
        Py_RETURN_NONE;
    } catch (std::exception const& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        return nullptr;
    } catch (...) {
        PyErr_SetString(PyExc_RuntimeError, "unhandled error");
        return nullptr;
    }
}
"""

_BINDING_FUNCTION = """\
static PyObject* {name}_py(PyObject* self, PyObject* args) {{
    return call_kernel(args, {count}, [&] {{ {callee}({arguments}); }});
}}"""

_BINDING_MODULE = r"""
static PyMethodDef py_methods[] = {
@METHODS@    {NULL, NULL, 0, NULL}};

static struct PyModuleDef py_module = {PyModuleDef_HEAD_INIT, "kernel", NULL, -1, py_methods};

PyMODINIT_FUNC PyInit_kernel(void) {
    const char* address = std::getenv("_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
    if (!address) {
        PyErr_SetString(PyExc_RuntimeError, "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR must be set");
        return nullptr;
    }
    char* end = nullptr;
    errno = 0;
    uintptr_t value = std::strtoull(address, &end, 10);
    if (errno != 0 || end == address || value == 0) {
        PyErr_SetString(
            PyExc_RuntimeError, "Failed to parse _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR");
        return nullptr;
    }
    tensor_data_ptr = reinterpret_cast<decltype(tensor_data_ptr)>(value);
    PyObject* module = PyModule_Create(&py_module);
#ifdef Py_GIL_DISABLED
    if (module != nullptr)
        PyUnstable_Module_SetGIL(module, Py_MOD_GIL_NOT_USED);
#endif
    return module;
}
"""


@contextlib.contextmanager
def batched():
    """Build the C++ kernels of the graphs inductor compiles (or loads from its cache) in this
    context as libraries of several kernels."""
    # Generated graph modules import AsyncCompile when they load, inside this context: they get
    # the subclass, which does what inductor's class does outside it. Restored on the way out.
    module = compat.async_compile
    previous, module.AsyncCompile = module.AsyncCompile, LibraryAsyncCompile
    token = _BATCHED.set(True)
    try:
        yield
    finally:
        _BATCHED.reset(token)
        module.AsyncCompile = previous
