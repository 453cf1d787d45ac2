"""Code the rules write, parsed once per process.

A migration inserts the same few target expressions and statements (``xm.mark_step()``, an
import line) into file after file. Syntax trees are immutable, so one parsed copy can stand in
every place, and every file, that uses it; parsing them again was a tenth of the rule walk.
"""

from __future__ import annotations

import functools

import libcst as cst


@functools.lru_cache(maxsize=1024)
def expression(code: str, config: cst.PartialParserConfig) -> cst.BaseExpression:
    return cst.parse_expression(code, config=config)


@functools.lru_cache(maxsize=1024)
def statement(code: str, config: cst.PartialParserConfig) -> cst.BaseStatement:
    return cst.parse_statement(code, config=config)
