"""Capture fidelity probe (issue 20): about three small cases per item of the issue (in
`capture_probe_cases.py`), each run through ``torchfuse.capture.compile(backend="eager")``
and plain Python side by side.

    python benchmarks/capture_probe.py [-v] [-k SUBSTRING]

Each case is called ``calls`` times with fresh arguments (``make(i)`` for call ``i``); before
each call, eager's and the compiled call's, both ``torch`` and Python's ``random`` are seeded
with ``100 + i``, so a random value baked in at capture shows as a mismatch on the next call.
A case passes when every call returns eager's values (and leaves its inputs as eager does),
the first call captured the expected number of graphs (1) with no graph break, and there were
no more recompiles (root + resume functions) than the case allows. Prints one line per case
and a summary; the exit status is the number of failures.
"""

from __future__ import annotations

import argparse
import collections
import copy
import random
import sys
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "packages" / "capture" / "tests"))
from capture_helpers import assert_same  # noqa: E402
from capture_probe_cases import _RNG, PROBES, Probe  # noqa: E402
from torchfuse.capture import compile as tf_compile  # noqa: E402
from torchfuse.capture.entry import counts_as_graph  # noqa: E402

# ============================================================ the runner


def _seed(i: int, p: Probe) -> None:
    torch.manual_seed(100 + i)
    random.seed(100 + i)
    _RNG.seed(100 + i)
    if p.reset is not None:
        p.reset(i)


def run_dynamo(p: Probe) -> str:
    """The same calls through torch.compile with a counting backend (for comparison)."""
    import torch._dynamo as dynamo

    dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    cf = torch.compile(p.fn, backend=backend)
    first = None
    ok = True
    for i in range(p.calls):
        want, got, _, _ = _call_both(p, i, cf)
        try:
            if not isinstance(want, Exception):
                assert_same(got, want)
        except AssertionError:
            ok = False
        if first is None:
            first = len(graphs)
    return f"dynamo: graphs={first} total={len(graphs)}{'' if ok else ' WRONG'}"


def _call_both(p: Probe, i: int, cf) -> tuple[object, object, object, object]:
    """Call ``i`` of the probe in eager and through ``cf``, each on its own copy of the
    arguments and from the same seeds: ``(eager's result, cf's result, eager's arguments,
    cf's arguments)`` after the calls, an exception in place of a result that raised."""
    args = p.make(i)
    eager_args, compiled_args = copy.deepcopy(args), copy.deepcopy(args)
    results = []
    for fn, a in ((p.fn, eager_args), (cf, compiled_args)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _seed(i, p)
            try:
                results.append(fn(*a))
            except Exception as e:
                results.append(e)
    return results[0], results[1], eager_args, compiled_args


def _recompiles(cf) -> int:
    return cf.recompiles + sum(r.recompiles for r in cf.resumes.values()) + \
        sum(c.recompiles for c in cf.callees.values())


def run_probe(p: Probe) -> tuple[bool, str]:
    from torchfuse.capture.resume import is_user_break

    cf = tf_compile(p.fn, backend="eager")
    problems = []
    graphs = None
    for i in range(p.calls):
        want, got, eager_args, compiled_args = _call_both(p, i, cf)
        if isinstance(want, Exception) or isinstance(got, Exception):
            if type(want) is not type(got):
                problems.append(f"call {i}: {got!r} vs eager {want!r}")
        else:
            try:
                assert_same(got, want)
                assert_same(compiled_args, eager_args, "inputs")
            except AssertionError as e:
                problems.append(f"call {i}: {str(e).splitlines()[0][:160]}")
        if graphs is None:
            graphs = sum(1 for r in cf.results if counts_as_graph(r))
    # breaks met on any call (a recompiled entry may break where the first did not), by place
    breaks = list({(getattr(r.error.loc, "line", None), r.error.reason): r.error
                   for r in cf.results if is_user_break(r)}.values())
    rc = _recompiles(cf)
    if graphs != p.graphs:
        problems.append(f"{graphs} graphs (want {p.graphs})")
    if len(breaks) > p.breaks:
        problems.append(f"break: {breaks[-1].reason[:120]}")
    if rc > p.recompiles:
        problems.append(f"{rc} recompiles (allowed {p.recompiles})")
    detail = f"graphs={graphs} breaks={len(breaks)} recompiles={rc}"
    return not problems, detail + ("" if not problems else "  " + "; ".join(problems))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", default="")
    ap.add_argument("-v", action="store_true")
    ap.add_argument("-d", action="store_true", help="also run torch.compile (counting backend)")
    args = ap.parse_args()
    failed = 0
    by_item: dict[str, list[bool]] = collections.defaultdict(list)
    for p in PROBES:
        if args.k not in p.name and args.k not in p.item:
            continue
        ok, detail = run_probe(p)
        by_item[p.item].append(ok)
        failed += not ok
        if args.d:
            detail += "  | " + run_dynamo(p)
        if args.v or not ok:
            print(f"{'PASS' if ok else 'FAIL'}  {p.item:34s} {p.name:34s} {detail}")
    total = sum(len(v) for v in by_item.values())
    print(f"\n{total - failed}/{total} pass")
    for item, oks in by_item.items():
        print(f"  {item:36s} {sum(oks)}/{len(oks)}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
