"""An independent check of a token budget: a plain process per bucket, as a token-bucketing sampler fills it.

    python benchmarks/harness/token_edge.py SPEC.yaml --tokens T [--budget BYTES] [--json]

For a spec with ``search.unit: tokens``, each check is a fresh ``python -c``
process that imports only torch and runs the spec's steps of the classic loop
under the CPU cap (``plain_edge``'s trial: ``RLIMIT_DATA`` set before exec, the
same ``MALLOC_MMAP_THRESHOLD_``): for every bucket length L, floor(T / L)
samples of length L must fit; and at T + 1 tokens, some bucket whose batch
grows by one sample (those L that divide T + 1) must run out of memory, or T
is not the largest budget (its plain peak is reported: within half a MiB of
the cap, a batch fits or runs out by chance, in a plain process as in a trial;
see tests/integration/test_plain_edge.py). Nothing of isoprobe runs in a trial; the parent
only reads the spec.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import plain_edge  # noqa: E402 - the same trial, environment and cap
from isoprobe.spec.load import load_spec  # noqa: E402 - the parent only: trials never import isoprobe
from isoprobe.spec.model import Spec  # noqa: E402


def at_length(spec: Spec, length: int) -> Spec:
    """The spec with its first input dimension set to ``length`` (written here, not taken from isoprobe)."""
    plain = spec.model_dump(mode="json")
    plain["input"]["shape"][0] = length
    plain["search"].update(unit="samples", bucket_lengths=None)
    return Spec.model_validate(plain)


def check(spec: Spec, tokens: int, budget: int, report=lambda length, batch, fit: None) -> dict:
    """Every bucket at ``tokens`` (must fit), and the buckets that grow at ``tokens + 1`` (one must not)."""
    lengths = sorted(set(spec.search.bucket_lengths))
    at_budget = {}
    for length in lengths:
        batch = tokens // length
        fit = batch == 0 or plain_edge.fits(at_length(spec, length), batch, budget)
        report(length, batch, fit)
        at_budget[length] = {"samples": batch, "fits": fit}
    one_more = {}
    for length in lengths:
        batch = (tokens + 1) // length
        if batch > tokens // length:  # this bucket's batch grows by one sample at one more token
            peak = plain_edge.peak(at_length(spec, length), batch, budget)
            report(length, batch, peak is not None)
            one_more[length] = {"samples": batch, "fits": peak is not None, "peak_bytes": peak}
    return {"tokens": tokens, "budget": budget, "at_budget": at_budget, "at_budget_plus_one": one_more,
            "all_fit": all(v["fits"] for v in at_budget.values()),
            "one_more_fails": any(not v["fits"] for v in one_more.values())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec")
    parser.add_argument("--tokens", type=int, required=True, help="the token budget to check")
    parser.add_argument("--budget", type=int, default=None, help="bytes (default: the spec's memory_budget)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    spec = load_spec(args.spec)
    budget = args.budget or spec.memory_budget
    say = lambda length, batch, fit: print(  # noqa: E731
        f"length {length:>6} batch {batch:>6}: {'fits' if fit else 'out_of_memory'}", file=sys.stderr, flush=True)
    started = time.monotonic()
    found = check(spec, args.tokens, budget, say)
    found["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(found) if args.json else
          f"{args.spec}: {args.tokens} tokens: every bucket fits: {found['all_fit']}; "
          f"one more token runs out of memory: {found['one_more_fails']} ({found['seconds']} s)")
    return 0 if found["all_fit"] and found["one_more_fails"] else 1


if __name__ == "__main__":
    sys.exit(main())
