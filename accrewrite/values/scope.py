"""One scope's values: its flow, the kinds of its expressions, and its host reads, as one object
that the rules ask (``Facts.values(scope)``)."""

from __future__ import annotations

from accrewrite.values.expressions import ExpressionKinds
from accrewrite.values.flow import ScopeFlow
from accrewrite.values.host_reads import HostReads


class ScopeValues(HostReads, ExpressionKinds, ScopeFlow):
    """The kinds of one function's (or module level's) names, and questions about its
    expressions. Each concern is its own module: ``flow`` walks the statements, ``expressions``
    gives an expression's kind where it is, ``host_reads`` finds what reads a tensor's value on
    the host; they ask each other through this one object."""
