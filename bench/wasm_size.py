#!/usr/bin/env python3
"""The module's code size by crate and its largest functions, from the name section of an
unstripped build (`./build.sh size` makes one and runs this). Usage: wasm_size.py WASM [CRATES] [FUNCTIONS]"""
import sys, collections, re
data = open(sys.argv[1], 'rb').read()
def leb(b, i):
    r = s = 0
    while True:
        x = b[i]; i += 1; r |= (x & 0x7f) << s; s += 7
        if x < 0x80: return r, i
pos = 8; sections = []
imports = 0; bodies = []; names = {}; customs = {}
while pos < len(data):
    sid = data[pos]; size, p = leb(data, pos + 1); end = p + size
    if sid == 2:
        n, q = leb(data, p)
        for _ in range(n):
            l, q = leb(data, q); q += l; l, q = leb(data, q); q += l
            kind = data[q]; q += 1
            if kind == 0: _, q = leb(data, q); imports += 1
            elif kind == 1: q += 1; fl, q = leb(data, q); _, q = leb(data, q); q = leb(data, q)[1] if fl & 1 else q
            elif kind == 2: fl, q = leb(data, q); _, q = leb(data, q); q = leb(data, q)[1] if fl & 1 else q
            elif kind == 3: q += 2
    elif sid == 10:
        n, q = leb(data, p)
        for _ in range(n):
            l, q = leb(data, q); bodies.append(l); q += l
    elif sid == 0:
        l, q = leb(data, p); name = data[q:q + l].decode(); q += l
        customs[name] = end - q
        if name == 'name':
            while q < end:
                sub = data[q]; sl, q = leb(data, q + 1); se = q + sl
                if sub == 1:
                    n, r = leb(data, q)
                    for _ in range(n):
                        idx, r = leb(data, r); l, r = leb(data, r); names[idx] = data[r:r + l].decode('utf8', 'replace'); r += l
                q = se
    sections.append((sid, size)); pos = end
def crate(sym):
    m = re.search(r'C(?:s[0-9a-zA-Z]*_)?(\d+)', sym) if sym.startswith('_R') else None
    if m:
        n = int(m.group(1)); return sym[m.end():m.end() + n]
    return 'other (libc, the proxy-wasm exports)'
by = collections.Counter(); funcs = []
for i, size in enumerate(bodies):
    sym = names.get(imports + i, '?')
    by[crate(sym)] += size; funcs.append((size, sym))
total = sum(bodies)
print(f'{len(data)} bytes unstripped, {total} bytes of code; by crate (generic code counts under the crate that defines it):')
for c, s in by.most_common(int(sys.argv[2]) if len(sys.argv) > 2 else 25):
    print(f'{s:9d} {100*s/total:5.1f}%  {c}')
if len(sys.argv) > 3:
    for s, f in sorted(funcs, reverse=True)[:int(sys.argv[3])]:
        print(s, f[:150])
