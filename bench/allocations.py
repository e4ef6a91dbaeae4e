#!/usr/bin/env python3
"""What the core allocates per request (issue 48), counted, not sampled: runs the exchange's
ignored test `the_benchmarks_requests_served_for_counting_allocations` (the benchmark's
provider-header request and its cache hit, through the exchange's fake Envoy) under valgrind's
dhat with 100 and with 300 requests, and prints the difference per request: in all, and by the
gateway's function that asked (the nearest frame of the gateway's own code that is not the
test's). Counts do not vary run to run, so a change of a few allocations shows.

Usage: allocations.py [--lines N]  (needs valgrind)"""
import argparse, collections, json, os, re, subprocess, sys, tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = "exchange::tests::allocations::the_benchmarks_requests_served_for_counting_allocations"
RUNS = (100, 300)
LIBRARY_FRAME = re.compile(r"^(<?(alloc|core|std|hashbrown|serde|serde_json|serde_core)::|__rust|<&mut serde)")


def test_binary() -> str:
    built = subprocess.run(["cargo", "test", "--quiet", "--features", "native", "--lib", "--no-run",
                            "--message-format=json"], cwd=ROOT, capture_output=True, text=True, check=True)
    for line in built.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message.get("executable") \
                and message["target"]["name"] == "model_gateway":
            return message["executable"]
    sys.exit("allocations: cargo built no test binary of the library")


def sites(binary: str, requests: int, cache_hit: bool) -> collections.Counter:
    """Blocks allocated in one run, by the gateway's function that asked for them."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "dhat.json"
        env = {**os.environ, "ALLOCATIONS_REQUESTS": str(requests)}
        if cache_hit:
            env["ALLOCATIONS_CACHE_HIT"] = "1"
        subprocess.run(["valgrind", "--tool=dhat", "--num-callers=60", f"--dhat-out-file={out}", binary,
                        "--ignored", "--exact", TEST, "--test-threads", "1"],
                       env=env, capture_output=True, check=True)
        profile = json.loads(out.read_text())
    frames = profile["ftbl"]
    counts = collections.Counter()
    for point in profile["pps"]:
        names = [re.sub(r" \(.*\)$", "", re.sub(r"^0x[0-9A-F]+: ", "", frames[i])) for i in point["fs"]]
        ours = [n for n in names if "model_gateway" in n and not LIBRARY_FRAME.match(n)]
        first = next((n for n in ours if "::tests" not in n), None)
        if any("FakeIo" in n or "FakeHost" in n for n in ours):  # the host's work, faked
            site = "the test's fake Envoy"
        elif first is None:
            site = "the test itself"
        else:
            site = first
        counts[site] += point["tbk"]
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20)
    args = parser.parse_args()
    binary = test_binary()
    for name, cache_hit in (("provider headers", False), ("cache hit", True)):
        few, many = (sites(binary, n, cache_hit) for n in RUNS)
        per_request = {k: (many[k] - few[k]) / (RUNS[1] - RUNS[0]) for k in set(few) | set(many)}
        core = sum(v for k, v in per_request.items() if not k.startswith("the test"))
        print(f"\n{name}: {core:.0f} allocations a request by the gateway's code "
              f"({sum(per_request.values()):.0f} with the test's fake Envoy)")
        for site, count in sorted(per_request.items(), key=lambda kv: -kv[1])[:args.lines]:
            if count >= 0.5:
                print(f"  {count:5.1f}  {site[:150]}")


if __name__ == "__main__":
    main()
