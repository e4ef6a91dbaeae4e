#!/usr/bin/env python3
"""The module's functions by their share of the CPU samples of a `node --cpu-prof` run of
v8_profile.cjs: self time (the function's own code) and inclusive time (with what it calls),
names demangled by binutils' c++filt. Shares are of the samples taken while a request was
served; JavaScript (the harness's host functions, Node's encoders) counts as one line.
Usage: v8_profile_report.py PROFILE.cpuprofile [SELF_LINES] [INCLUSIVE_LINES]"""
import collections, json, re, subprocess, sys

profile = json.load(open(sys.argv[1]))
self_lines = int(sys.argv[2]) if len(sys.argv) > 2 else 30
inclusive_lines = int(sys.argv[3]) if len(sys.argv) > 3 else 40
nodes = {node['id']: node for node in profile['nodes']}
parent = {child: node['id'] for node in profile['nodes'] for child in node.get('children', [])}
HOST = '(JavaScript: the harness\'s host functions, Node\'s text encoders)'


def stack(node_id):
    frames = []
    while node_id is not None:
        frames.append(nodes[node_id]['callFrame'])
        node_id = parent.get(node_id)
    return frames


def in_module(frame):
    return frame['url'].startswith('wasm://')


def name_of(frame):
    # The module's functions have their name section's names, V8's own work its own in
    # parentheses (`(garbage collector)`); the rest is JavaScript or Node's built-ins.
    name = frame['functionName']
    return name if in_module(frame) or name.startswith('(') else HOST


samples = collections.Counter(profile['samples'])
own, inclusive, total = collections.Counter(), collections.Counter(), 0
for node_id, count in samples.items():
    frames = stack(node_id)
    if not any(frame['functionName'] == 'serve' for frame in frames):
        continue
    total += count
    own[name_of(frames[0])] += count
    for name in {name_of(frame) for frame in frames if in_module(frame)}:
        inclusive[name] += count

names = sorted(set(own) | set(inclusive))
demangled = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True, check=True).stdout
readable = {name: re.sub(r'\[[0-9a-f]{16}\]', '', pretty) for name, pretty in zip(names, demangled.splitlines())}
print(f'{total} samples while requests were served')
print('\nself time (the function\'s own code):')
for name, count in own.most_common(self_lines):
    print(f'{100 * count / total:6.2f}%  {readable[name][:160]}')
print('\ninclusive time of the module\'s functions (with what they call):')
for name, count in inclusive.most_common(inclusive_lines):
    print(f'{100 * count / total:6.2f}%  {readable[name][:160]}')
