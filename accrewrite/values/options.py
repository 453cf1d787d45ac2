"""A script's command-line options: what ``parser.add_argument`` declares (each option's type and
string default) and which names hold the parsed options (``args = parser.parse_args()``)."""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

import libcst as cst

from accrewrite.nodes import call_arg, dotted, string_value, walk
from accrewrite.values.kinds import Kind, literal_kind

# What scripts name their parsed options.
_OPTION_NAMESPACES = frozenset({"args", "opt", "opts", "cfg", "config", "hparams", "flags"})
_ARGPARSE_TYPES = MappingProxyType({"int": Kind.INT, "float": Kind.FLOAT, "str": Kind.STR, "bool": Kind.BOOL})


def parses_options(assign: cst.Assign) -> bool:
    """Whether ``assign`` binds parsed command-line options (``args = parser.parse_args()``)."""
    value = assign.value
    return type(value) is cst.Call and type(value.func) is cst.Attribute \
        and value.func.attr.value in ("parse_args", "parse_known_args")


class CommandLineOptions:
    """The options of one file, from its calls and its ``parse_args`` assignments in source
    order (read when first asked)."""

    def __init__(self, calls: Iterable[cst.Call], parses: Iterable[cst.Assign], text: str | None) -> None:
        declares = text is None or "add_argument" in text
        self.calls = [call for call in calls if declares and type(call.func) is cst.Attribute
                      and call.func.attr.value == "add_argument"]
        self._parses = parses
        self._kinds: dict[str, Kind] | None = None
        self._namespaces: set[str] = set()
        self._defaults: dict[str, str] | None = None

    @classmethod
    def scanned(cls, module: cst.Module, text: str | None) -> "CommandLineOptions":
        """The options of a module whose analysis walk has not ended (a device read from an
        option's default is asked mid-walk): one walk of its own finds the calls, where the
        text declares any."""
        calls, parses = [], []

        def enter(node):
            if type(node) is cst.Call:
                calls.append(node)
            elif type(node) is cst.Assign and parses_options(node):
                parses.append(node)

        if text is None or "add_argument" in text:
            walk(module, enter)
        return cls(calls, parses, text)

    def kind(self, node: cst.Attribute) -> Kind | None:
        """``args.lr`` where ``args`` holds parsed command-line options: the option's type."""
        if not isinstance(node.value, cst.Name):
            return None
        kinds = self._read()
        if not kinds or node.attr.value not in kinds:
            return None
        return kinds[node.attr.value] if self.names_options(node.value.value) else None

    def names_options(self, name: str) -> bool:
        """Whether ``name`` holds the file's parsed command-line options: assigned
        ``parser.parse_args()``, or named as scripts name them."""
        self._read()
        return name in self._namespaces or name in _OPTION_NAMESPACES

    def string_defaults(self) -> dict[str, str]:
        """``parser.add_argument("--device", default="cuda")`` -> {"device": "cuda"}."""
        if self._defaults is None:
            self._defaults = {}
            for node in reversed(self.calls):  # later ones come first: the first one wins
                default = call_arg(node, 99, "default")
                value = string_value(default.value) if default is not None else None
                flags = [string_value(arg.value) for arg in node.args if arg.keyword is None]
                dest = call_arg(node, 99, "dest")
                names = [string_value(dest.value)] if dest is not None else \
                    [f for f in flags if f and f.startswith("--")] or flags
                if value is not None and names and names[0]:
                    self._defaults[names[0].lstrip("-").replace("-", "_")] = value
        return self._defaults

    def _read(self) -> dict[str, Kind]:
        """The options' kinds by destination, and the names assigned ``parser.parse_args()``."""
        if self._kinds is not None:
            return self._kinds
        self._kinds = {}
        for call in reversed(self.calls):  # later options come first: the first of a name wins
            self._note_option(call)
        for assign in self._parses:
            for target in assign.targets:
                first = target.target
                if isinstance(first, cst.Tuple) and first.elements:
                    first = first.elements[0].value
                if isinstance(first, cst.Name):
                    self._namespaces.add(first.value)
        return self._kinds

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
                kind = literal_kind(default)
        elif option_type is None and "nargs" not in keywords and action is None:
            kind = Kind.STR
        if "nargs" in keywords:
            kind = Kind.PYTHON
        self._kinds[name] = kind
