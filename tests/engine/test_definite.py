"""Definite assignment (``accrewrite.definite``), the net's second check: each read of a scope's
own name on a path where no binding of it has run, as Python runs the code."""

import ast
import textwrap

import pytest

from accrewrite.definite import unbound_on_a_path

# name -> (code, the reads found: (scope, name, line); the code starts on line 2)
CASES = {
    "one arm of an if": ("""
        def f(c):
            if c:
                loc = 1
            print(loc)
        """, [("f", "loc", 5)]),
    "both arms": ("""
        def f(c):
            if c:
                loc = 1
            else:
                loc = 2
            print(loc)
        """, []),
    "the other arm returns": ("""
        def f(c):
            if c:
                loc = 1
            else:
                return
            print(loc)
        """, []),
    "the other arm raises": ("""
        def f(c):
            if not c:
                raise ValueError(c)
            elif c > 1:
                loc = 1
            else:
                loc = 0
            print(loc)
        """, []),
    "sys.exit() is not known to end a path": ("""
        import sys
        def f(c):
            if c:
                loc = 1
            else:
                sys.exit(1)
            print(loc)
        """, [("f", "loc", 8)]),
    "a loop that may not run": ("""
        def f(xs):
            for x in xs:
                d = x
            print(d, x)
        """, [("f", "d", 5), ("f", "x", 5)]),
    "below the read in a loop": ("""
        def f(xs):
            for x in xs:
                print(d)
                d = x
        """, [("f", "d", 4)]),
    "a while loop that may not run": ("""
        def f(c):
            while c:
                d = 1
            print(d)
        """, [("f", "d", 5)]),
    "while True leaves by its break": ("""
        def f(g):
            while True:
                d = g()
                if d:
                    break
            print(d)
        """, []),
    "continue goes back to the head": ("""
        def f(xs):
            for x in xs:
                if not x:
                    continue
                d = x
                print(d)
        """, []),
    "for-else binds where no break left": ("""
        def f(xs):
            for x in xs:
                if x:
                    d = x
                    break
            else:
                d = 0
            print(d)
        """, []),
    "a break skips the else": ("""
        def f(xs):
            for x in xs:
                if x:
                    break
            else:
                d = 0
            print(d)
        """, [("f", "d", 8)]),
    "a handler may start before the try body ran": ("""
        def f(g):
            try:
                d = g()
            except KeyError:
                print(d)
            print(d)
        """, [("f", "d", 6), ("f", "d", 7)]),
    "a handler that raises": ("""
        def f(g):
            try:
                d = g()
            except KeyError:
                raise
            print(d)
        """, []),
    "a handler that binds too": ("""
        def f(g):
            try:
                d = g()
            except KeyError:
                d = None
            print(d)
        """, []),
    "finally is read on an exception's path": ("""
        def f(g):
            try:
                d = g()
            finally:
                print(d)
            print(d)
        """, [("f", "d", 6)]),
    "except as unbinds at the handler's end": ("""
        def f(g):
            try:
                g()
            except KeyError as e:
                print(e)
            print(e)
        """, [("f", "e", 7)]),
    "del": ("""
        def f():
            d = 1
            del d
            print(d)
        """, [("f", "d", 5)]),
    "with ... as": ("""
        def f():
            with open("a") as handle:
                d = handle.read()
            print(handle, d)
        """, []),
    "match captures bind in their case": ("""
        def f(p):
            match p:
                case [a, b]:
                    c = a + b
                case _:
                    c = 0
            print(c, a)
        """, [("f", "a", 8)]),
    "match without a case for the rest": ("""
        def f(p):
            match p:
                case 1:
                    c = 0
            print(c)
        """, [("f", "c", 6)]),
    "walrus": ("""
        def f(g, a):
            if (n := g()):
                pass
            if a or (m := g()):
                pass
            print(n, m)
        """, [("f", "m", 7)]),
    "a comprehension's names are its own": ("""
        def f(xs):
            ys = [x * 2 for x in xs if x]
            print(x)
            x = 1
        """, [("f", "x", 4)]),
    "global and nonlocal names are not the scope's": ("""
        def f(c):
            global g
            if c:
                g = 1
            print(g)
            d = 0
            def h():
                nonlocal d
                d = 1
            h()
            print(d)
        """, []),
    "a nested function reads later bindings when it runs": ("""
        def f():
            def g():
                return d
            d = 1
            return g, lambda: e + d
        """, []),
    "a repeated test takes the branch it took": ("""
        def f(args):
            if args.resume:
                loc = 1
            print("loaded")
            for epoch in range(2):
                if args.resume:
                    print(loc)
        """, []),
    "a repeated test's else takes the branch it took": ("""
        def f(args):
            if args.resume:
                print("resumed")
            else:
                loc = 1
            if not args.resume:
                print(loc)
            if args.resume:
                pass
            else:
                print(loc)
        """, []),
    "a negated test and the test repeated": ("""
        def f(args):
            if not args.resume:
                loc = 1
            if args.resume:
                loc = 2
            else:
                print(loc)
            print(loc)
        """, []),
    "a negated test is not the test": ("""
        def f(args):
            if not args.resume:
                loc = 1
            if args.resume:
                print(loc)
        """, [("f", "loc", 6)]),
    "a test whose name is bound again between": ("""
        def f(args):
            if args.resume:
                loc = 1
            args.resume = None
            if args.resume:
                print(loc)
        """, [("f", "loc", 7)]),
    "a test bound again later in the loop": ("""
        def f(t, r):
            if t:
                loc = 1
            for i in r:
                if t:
                    print(loc)
                t = i
        """, [("f", "loc", 7)]),
    "a test that calls": ("""
        def f(g):
            if g():
                loc = 1
            if g():
                print(loc)
        """, [("f", "loc", 6)]),
    "a repeated test not on every path to the second": ("""
        def f(a, t):
            if a:
                if t:
                    loc = 1
            if t:
                print(loc)
        """, [("f", "loc", 7)]),
    "module level, and a builtin it may shadow": ("""
        import torch
        if torch.cuda.is_available():
            writer = open("log")
            input = print
        writer.write("x")
        input()
        """, [("<module>", "writer", 6)]),
    "a method's scope is named by its class": ("""
        class Trainer:
            def fit(self, c):
                if c:
                    device = 1
                return device
        """, [("Trainer.fit", "device", 6)]),
    "a star import may bind anything": ("""
        from helpers import *
        if c:
            a = 1
        print(a)
        """, []),
    "unreachable code is read on no path": ("""
        def f():
            return
            print(d)
            d = 1
        """, []),
}


@pytest.mark.parametrize("code, found", CASES.values(), ids=list(CASES))
def test_reads_on_a_path_that_binds_nothing(code, found):
    assert unbound_on_a_path(ast.parse(textwrap.dedent(code))) == found


def test_the_guard_function_gives_the_same_answer_each_time():
    code = "if enabled():\n    import xm\nif enabled():\n    xm.mark_step()\n"
    assert unbound_on_a_path(ast.parse(code)) == [("<module>", "xm", 4)]
    assert unbound_on_a_path(ast.parse(code), steady=frozenset({"enabled"})) == []


def test_the_guard_functions_negation_fails_where_it_holds():
    # A statement the migration moves: kept where it was without the guard, written later with it.
    code = ("if not enabled():\n    opt = 1\nif enabled():\n    opt = 2\nelse:\n    pass\nopt.step()\n")
    assert unbound_on_a_path(ast.parse(code)) == [("<module>", "opt", 7)]
    assert unbound_on_a_path(ast.parse(code), steady=frozenset({"enabled"})) == []
