"""Type promotion: results follow eager's table; what eager rejects raises eager's error type.

Meta kernels skip some of eager's dtype checks; capture checks them
(:mod:`torchfuse.capture.dtype_rules`) and breaks the graph, so the code runs in Python and
raises eager's own error at the user's line."""

from __future__ import annotations

import pytest
import torch
from semantics_helpers import assert_like_eager, compiled, outcome

CASES = {
    "int - bool": lambda a, b, f: a - b,
    "1 - bool": lambda a, b, f: 1 - b,
    "bool - bool": lambda a, b, f: b - b,
    "-bool": lambda a, b, f: -b,
    "~float": lambda a, b, f: ~f,
    "float & int": lambda a, b, f: f & a,
    "int.add_(float)": lambda a, b, f: a.clone().add_(f),
    "int.mul_(1.5)": lambda a, b, f: a.clone().mul_(1.5),
    "int.div_(int)": lambda a, b, f: a.clone().div_(a),
    "float << int": lambda a, b, f: f << a,
    "bool % bool": lambda a, b, f: torch.remainder(b, b),
    "gcd float": lambda a, b, f: torch.gcd(f, f),
    "sub alpha=True": lambda a, b, f: a.sub(a, alpha=True),
    "add int alpha=1.5": lambda a, b, f: a.add(a, alpha=1.5),
    "lerp int": lambda a, b, f: torch.lerp(a, a, 0.5),
    "abs bool": lambda a, b, f: b.abs(),
    "int ** -1": lambda a, b, f: a ** -1,
    "mm int @ float": lambda a, b, f: a.view(1, 3) @ f.view(3, 1),
    "softmax int": lambda a, b, f: a.softmax(0),
    "mean int": lambda a, b, f: a.mean(),
    "index_put float into int": lambda a, b, f: a.clone().index_put_((torch.tensor([0]),), f[:1]),
    # accepted by eager: the result dtype must match
    "int + float": lambda a, b, f: a + f,
    "bool + bool": lambda a, b, f: b + b,
    "int / int": lambda a, b, f: a / a,
    "int // 2": lambda a, b, f: a // 2,
    "where(bool, int, float)": lambda a, b, f: torch.where(b, a, f),
    "sum bool": lambda a, b, f: b.sum(),
    "int * 2.5": lambda a, b, f: a * 2.5,
    "int.masked_fill_(1.5)": lambda a, b, f: a.clone().masked_fill_(b, 1.5),
}


INDUCTOR_FAILS: dict[str, str] = {}
"""Cases the default backend still gets wrong (strict xfails). Empty: bools add as ``or`` in
the codegen vocabulary now (#25)."""


@pytest.mark.parametrize("case", list(CASES))
def test_promotion(case, backend, request):
    if backend == "inductor" and case in INDUCTOR_FAILS:
        request.applymarker(pytest.mark.xfail(strict=True, reason=INDUCTOR_FAILS[case]))
    fn = CASES[case]

    def g(a, b, f):
        return fn(a, b, f)

    args = (torch.arange(3), torch.tensor([True, False, True]), torch.randn(3))
    assert_like_eager(outcome(compiled(g, backend), *args), outcome(g, *args))
