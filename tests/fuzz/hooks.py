"""Schemathesis hooks for fuzzing thicket serve: every generated body that names a model
names the served one (THICKET_FUZZ_MODEL), so requests reach validation and generation
instead of stopping at the unknown-model check."""

import os

import schemathesis

MODEL = os.environ.get("THICKET_FUZZ_MODEL", "smollm2")


@schemathesis.hook
def before_call(ctx, case, kwargs):
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = MODEL
