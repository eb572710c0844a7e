"""Schemathesis hooks for fuzzing thicket serve: every generated body that names a model
names the served one (THICKET_FUZZ_MODEL), so requests reach validation and generation
instead of stopping at the unknown-model check.

Hypothesis raises and restores the interpreter-wide recursion limit around each test case;
with two workers one thread's change can land while the other parses a lambda's source, and
CPython 3.11 then aborts with `SystemError: AST constructor recursion depth mismatch` (seen
under load). The limit is set high once here and Hypothesis's changes are turned off."""

import os
import sys

import schemathesis
from hypothesis.internal.conjecture import junkdrawer

sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))
junkdrawer.StackframeLimiter._setrecursionlimit = lambda self, new_limit, check=True: None

MODEL = os.environ.get("THICKET_FUZZ_MODEL", "smollm2")


@schemathesis.hook
def before_call(ctx, case, kwargs):
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = MODEL
