"""`check_kernel_source` refuses every statement and expression outside the accepted form,
naming it and its line, and accepts the form our code generators write."""

from __future__ import annotations

import pytest
from torchfuse.graph.kernel_source import KernelSourceError, check_kernel_source

HEAD = "import triton\nimport triton.language as tl\n\n\n@triton.jit\ndef k(x_ptr, n, XBLOCK: tl.constexpr):\n"
GOOD = ("    offs = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)\n"
        "    for i in range(2):\n"
        "        offs += i\n"
        "    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)\n")


def test_the_generated_form_is_accepted():
    check_kernel_source(HEAD + GOOD, "k")
    with pytest.raises(KernelSourceError, match=r"defines no @triton\.jit function 'other'"):
        check_kernel_source(HEAD + GOOD, "other")


@pytest.mark.parametrize("line, message", [
    ("import os", "Import statement in kernel 'k'"),
    ("global n", "Global statement in kernel 'k'"),
    ("with x_ptr:\n        pass", "With statement in kernel 'k'"),
    ("try:\n        pass\n    except Exception:\n        pass", "Try statement in kernel 'k'"),
    ("f = lambda: 0", "Lambda expression in kernel 'k'"),
    ("y = [i for i in range(3)]", "ListComp expression in kernel 'k'"),
    ("y = (z := 1)", "NamedExpr expression in kernel 'k'"),
    ("tl.store(x_ptr, **n)", "'\\*\\*' unpacking in kernel 'k'"),
    ("y = x_ptr.__class__", "the name|attribute '__class__'"),
    ("y = x_ptr._secret", "attribute '_secret' starts with an underscore"),
    ("y = print.__self__", "attribute '__self__'"),
    ("y = open", "reads the name 'open'"),
])
def test_refused_in_a_kernel_body(line, message):
    source = HEAD + GOOD + f"    {line}\n"
    with pytest.raises(KernelSourceError, match=message) as info:
        check_kernel_source(source, "k")
    assert "line 11" in str(info.value)  # the line of the refused node
