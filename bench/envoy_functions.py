#!/usr/bin/env python3
"""Where a stripped Envoy spends a request's CPU, one profile against another (issue 48): the PyPI
Envoy has no symbols, but its `.eh_frame_hdr` lists where every function starts, and the strings a
function's code loads (its log lines, assertion texts, source paths) say which one it is. Each
sample's frames are attributed to those functions; the gateway's module counts as one line (its own
code in the self list, with what it calls in the inclusive one); and two profiles (say the native
hold floor and the native module) are set side by side in µs per request, largest difference
first. `--under ADDRESS` lists instead what the function at ADDRESS (as printed; `module`: the
module) calls, and
`--outside` leaves out the samples taken in the module, to see Envoy's own work.

Record each with the proxy under load (e.g. `bench.py --pin --duration 14 --variants native`):

    perf record -p ENVOY_PID --call-graph dwarf,16384 -F 999 -o A.data -- sleep 4
    perf script -i A.data > A.txt

Usage: envoy_functions.py [--under ADDRESS] [--outside] BASE.txt BASE_US RUN.txt RUN_US [LINES]
(`*_US`: the proxy's CPU µs per request in that run, from the benchmark's table). Needs binutils'
`objdump` and `nm`, and the Envoy of the runs (`--envoy PATH`, default the one in .venv)."""
import argparse, bisect, collections, functools, re, struct, subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENVOY = ROOT / ".venv/lib/python3.11/site-packages/envoy/_bin/envoy"
MODULE = "the gateway's module"


class Binary:
    """A stripped ELF: its functions' start addresses (from `.eh_frame_hdr`'s search table), and
    the mapping from the file offsets `perf script` prints for it to addresses."""

    def __init__(self, path: Path):
        self.path = path
        self.data = path.read_bytes()
        data = self.data
        phoff, = struct.unpack_from("<Q", data, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        # The executable segment: perf prints its addresses as file offsets.
        self.segments = []
        for i in range(phnum):
            kind, flags, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
            if kind == 1:  # PT_LOAD
                self.segments.append((offset, vaddr, filesz, flags))
            if kind == 0x6474E550:  # PT_GNU_EH_FRAME
                hdr_offset, hdr_vaddr = offset, vaddr
        version, _, count_encoding, table_encoding = data[hdr_offset:hdr_offset + 4]
        # The table as linkers write it: a 4-byte count, then (start, FDE) pairs of signed 4-byte
        # offsets from the header.
        if version != 1 or count_encoding & 0x0F != 0x03 or table_encoding != 0x3B:
            raise SystemExit(f"envoy_functions: {path}: an .eh_frame_hdr table this script does not read")
        count, = struct.unpack_from("<I", data, hdr_offset + 8)
        table = struct.unpack_from(f"<{2 * count}i", data, hdr_offset + 12)
        self.starts = sorted(hdr_vaddr + table[2 * i] for i in range(count))
        # The few names a stripped binary keeps: what it exports (the dynamic modules' ABI
        # callbacks, the allocator's entry points).
        exported = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True).stdout
        self.exported = {int(f[0], 16): f[2] for f in map(str.split, exported.splitlines()) if len(f) == 3}

    def address(self, file_offset: int) -> int:
        for offset, vaddr, size, flags in self.segments:
            if flags & 1 and offset <= file_offset < offset + size:
                return file_offset - offset + vaddr
        return file_offset

    def function(self, address: int) -> int:
        """The start of the function holding `address`."""
        i = bisect.bisect_right(self.starts, address) - 1
        return self.starts[i] if i >= 0 else 0

    def read_only_string(self, address: int) -> str | None:
        for offset, vaddr, size, flags in self.segments:
            if not flags & 1 and vaddr <= address < vaddr + size:
                start = address - vaddr + offset
                text = self.data[start:start + 120].split(b"\0")[0]
                if len(text) >= 6 and all(32 <= c < 127 for c in text):
                    return text.decode()
        return None

    @functools.cache
    def name(self, start: int) -> str:
        """The function at `start`: its exported name, or the strings its code loads (source paths
        first, then the rest, shortest first: the longest are log lines)."""
        if start in self.exported:
            return f"{hex(start)}: {self.exported[start]}"
        i = bisect.bisect_right(self.starts, start)
        end = self.starts[i] if i < len(self.starts) else start + 4096
        listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f"--start-address={start}",
                                  f"--stop-address={end}", str(self.path)], capture_output=True, text=True).stdout
        strings = {s for s in (self.read_only_string(int(t, 16)) for t in re.findall(r"# ([0-9a-f]+)", listing)) if s}
        ranked = sorted(strings, key=lambda s: (not s.startswith("source/"), len(s)))
        return f"{hex(start)} ({end - start} B): " + " | ".join(ranked[:4])


def profile(path: Path, us_per_request: float, envoy: Binary, under: int | str | None, outside: bool):
    """Self and inclusive µs per request by function, from a `perf script` listing; with `under`,
    what that function calls (its own code as itself) and, inclusive, the samples under it."""
    own, inclusive, samples = collections.Counter(), collections.Counter(), 0
    frames: list[str | int] | None = None

    def count():
        nonlocal samples
        samples += 1
        if not frames or outside and MODULE in frames:
            return
        if under is None:
            own[frames[0]] += 1
        elif under in frames:
            depth = frames.index(under)
            own[frames[depth - 1] if depth else under] += 1
        else:
            return
        for frame in set(frames):
            inclusive[frame] += 1

    for line in path.open():
        if not line.strip():
            if frames is not None:
                count()
            frames = None
        elif not line[0].isspace():
            frames = []
        elif frames is not None:
            address, _, rest = line.strip().partition(" ")
            dso = rest.rsplit("(", 1)[-1].rstrip(")")
            if Path(dso).name == envoy.path.name:
                frames.append(envoy.function(envoy.address(int(address, 16))))
            elif "model_gateway" in dso:
                frames.append(MODULE)
            else:
                frames.append(f"{Path(dso).name}: {re.sub(r'[+]0x[0-9a-f]+$', '', rest.rsplit(' (', 1)[0])[:70]}")
    if frames is not None:
        count()
    scale = us_per_request / max(samples, 1)
    return {k: v * scale for k, v in own.items()}, {k: v * scale for k, v in inclusive.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", type=Path)
    parser.add_argument("base_us", type=float)
    parser.add_argument("run", type=Path)
    parser.add_argument("run_us", type=float)
    parser.add_argument("lines", type=int, nargs="?", default=25)
    parser.add_argument("--envoy", type=Path, default=ENVOY)
    parser.add_argument("--under", type=lambda text: MODULE if text == "module" else int(text, 16))
    parser.add_argument("--outside", action="store_true")
    args = parser.parse_args()
    envoy = Binary(args.envoy)
    base, run = (profile(path, us, envoy, args.under, args.outside)
                 for path, us in ((args.base, args.base_us), (args.run, args.run_us)))
    first = "callees" if args.under is not None else "self"
    for title, a, b in ((first, base[0], run[0]), ("inclusive", base[1], run[1])):
        print(f"\n{title}: µs per request, {args.run.name} − {args.base.name}")
        for key in sorted(set(a) | set(b), key=lambda k: a.get(k, 0) - b.get(k, 0))[:args.lines]:
            name = envoy.name(key) if isinstance(key, int) else key
            print(f"  {b.get(key, 0) - a.get(key, 0):+6.2f}  ({a.get(key, 0):5.2f} → {b.get(key, 0):5.2f})  {name}")


if __name__ == "__main__":
    main()
