#!/usr/bin/env python3
"""Finds import circles between the files, and between the folders, of each Rust crate of the
workspace (src/, control-plane/src/, schema/src/).

A file depends on another when its code (tests left out) names an item defined there: `use
crate::a::b::C`, `crate::a::f()`, `super::x`, `self::x` or a child module's `x::y`. A path is
followed through the modules it names to the file that defines its item, through `use`
re-exports (`crate::guardrails::spec::Check` in the filter is the shared crate's, no file of
the filter). A folder's entry file (mod.rs, lib.rs) may use the files inside its folder (it is
made of them): only their dependencies on it, on each other and on everything else count.
Folders are then compared the same way: at each depth every file stands for its folder
(`config/parts.rs` for `config/`). Any circle (a strongly connected group of two or more files
or folders) is printed with the dependencies that close it, and the exit status is 1.

Usage: import_cycles.py [CRATE_SRC_DIR ...]   (default: the workspace's crates)
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CRATES = ["src", "control-plane/src", "schema/src"]

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
TEST_ATTR = re.compile(r"#\[cfg\((?:test|all\(test\b[^\]]*)\)\]")


def strip_comments_and_strings(text):
    """The code alone: comments, string and char literals become spaces (lines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not re.match(r"\w", text[i - 1])):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            j = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"' or (c == "b" and text.startswith('b"', i)):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i : j + 1]))
            i = j + 1
        elif c == "'" and re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", text[i:]):
            m = re.match(r"'(\\.|[^\\'])'|'\\u\{[0-9a-fA-F]+\}'|'\\x[0-9a-fA-F]{2}'", text[i:])
            out.append(" " * len(m.group(0)))
            i += len(m.group(0))
        else:
            out.append(c)
            i += 1
    return "".join(out)


def strip_test_items(code):
    """Removes every item marked `#[cfg(test)]` (an inline test module, a test-only fn)."""
    while True:
        m = TEST_ATTR.search(code)
        if not m:
            return code
        start, j = m.start(), m.end()
        # The item ends at its `;` or at the brace closing its body, whichever comes first.
        while j < len(code) and code[j] not in "{;":
            j += 1
        if j < len(code) and code[j] == "{":
            depth = 0
            while j < len(code):
                depth += {"{": 1, "}": -1}.get(code[j], 0)
                j += 1
                if depth == 0:
                    break
        else:
            j += 1
        code = code[:start] + re.sub(r"[^\n]", " ", code[start:j]) + code[j:]


def expand_use_tree(tree, with_names=False):
    """`a::{b, c::{d, e}}` -> [[a, b], [a, c, d], [a, c, e]] (globs dropped); with_names: pairs
    of each path and the name it is known by (`a::b as c`: c)."""
    tree = re.sub(r"\s+", " ", tree).strip()
    tree = re.sub(r"\s*(::|,|\{|\})\s*", r"\1", tree)
    renames = {}

    def rename(m):
        renames[m.group(1) + "#" + str(len(renames))] = m.group(2)
        return m.group(1) + "#" + str(len(renames) - 1)

    tree = re.sub(r"(" + IDENT + r") as (" + IDENT + ")", rename, tree)

    def expand(prefix, s):
        brace = s.find("{")
        if brace < 0:
            parts = [p for p in s.split("::") if p and p != "*"]
            return [prefix + parts]
        head = [p for p in s[:brace].split("::") if p]
        inner = s[brace + 1 : s.rfind("}")]
        items, depth, current = [], 0, ""
        for ch in inner:
            if ch == "," and depth == 0:
                items.append(current)
                current = ""
                continue
            depth += {"{": 1, "}": -1}.get(ch, 0)
            current += ch
        items.append(current)
        paths = []
        for item in items:
            if item == "self":
                paths.append(prefix + head)
            elif item:
                paths.extend(expand(prefix + head, item))
        return paths

    paths = []
    for path in expand([], tree):
        name = path[-1] if path else ""
        if "#" in name:
            name = renames[name]
            path = path[:-1] + [path[-1].split("#")[0]]
        if name == "self" and len(path) > 1:
            path, name = path[:-1], path[-2]
        paths.append((path, name) if with_names else path)
    return paths


class Crate:
    def __init__(self, src):
        self.src = src
        self.files = {}  # module path (tuple) -> file
        for path in sorted(src.rglob("*.rs")):
            self.files[self.module_of(path)] = path
        self.test_modules = set()
        self.code = {}
        for module, path in self.files.items():
            text = strip_comments_and_strings(path.read_text())
            self.code[module] = strip_test_items(text)
            for m in re.finditer(TEST_ATTR.pattern + r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", text):
                self.test_modules.add(module + (m.group(1),))

    def module_of(self, path):
        parts = list(path.relative_to(self.src).with_suffix("").parts)
        if parts[-1] in ("mod", "lib", "main") and (len(parts) > 1 or parts[-1] != "main"):
            parts.pop()
        elif parts == ["main"]:
            parts = ["<main>"]
        return tuple(parts)

    def is_test(self, module):
        return any(module[: i + 1] in self.test_modules for i in range(len(module)))

    def definitions(self, module):
        """The names a file defines at its top level, and the paths its `use`s bring in."""
        if not hasattr(self, "_definitions"):
            self._definitions = {}
        if module not in self._definitions:
            code = self.code[module]
            defined = set(
                re.findall(
                    r"^(?:pub(?:\([^)]*\))?\s+)?(?:async\s+|unsafe\s+|const\s+)*"
                    r"(?:fn|struct|enum|trait|type|const|static|union|macro_rules!)\s+(" + IDENT + ")",
                    code,
                    re.M,
                )
            )
            imported = {}
            for m in re.finditer(r"^(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]*);", code, re.M):
                for path, name in expand_use_tree(m.group(1), with_names=True):
                    imported.setdefault(name, path)
            self._definitions[module] = (defined, imported)
        return self._definitions[module]

    def resolve(self, module, segments, seen=None):
        """The file a path (written in `module`'s file) leads to, or None (another crate)."""
        if not segments:
            return None
        seen = seen or set()
        first = segments[0]
        if first == "crate":
            base, rest = (), segments[1:]
        elif first in ("self", "super"):
            base, rest = module, segments
            while rest and rest[0] in ("self", "super"):
                if rest[0] == "super":
                    base = base[:-1]
                rest = rest[1:]
        elif module + (first,) in self.files:
            base, rest = module, segments
        else:
            return None
        target = base
        for i, seg in enumerate(rest):
            if target + (seg,) in self.files:
                target = target + (seg,)
                continue
            defined, imported = self.definitions(target)
            if seg not in defined and seg in imported and (target, seg) not in seen:
                seen.add((target, seg))
                through = self.resolve(target, imported[seg] + list(rest[i + 1 :]), seen)
                if through is not None:
                    return through
            break
        return target

    def edges(self):
        graph = {}
        for module, path in self.files.items():
            if self.is_test(module) or module == ("<main>",):
                continue
            code = self.code[module]
            paths = []
            for m in re.finditer(r"\buse\s+([^;]*);", code):
                paths.extend(expand_use_tree(m.group(1)))
            without_uses = re.sub(r"\buse\s+[^;]*;", "", code)
            children = [c[-1] for c in self.files if c[:-1] == module and len(c) == len(module) + 1]
            heads = "|".join(["crate", "super", "self"] + children)
            for m in re.finditer(r"(?<![\w:])((?:" + heads + r")(?:\s*::\s*" + IDENT + r")+)", without_uses):
                paths.append(re.sub(r"\s+", "", m.group(1)).split("::"))
            targets = set()
            for segments in paths:
                target = self.resolve(module, segments)
                # A folder's entry file (mod.rs, lib.rs) may use its own parts.
                if target is None or target[: len(module)] == module:
                    continue
                if not self.is_test(target):
                    targets.add(target)
            graph[module] = targets
        return graph


def strongly_connected(graph):
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return groups


def name_of(crate, unit):
    """A unit's name for the report: a file, or a folder (`src/config/`)."""
    base = ROOT if crate.src.is_relative_to(ROOT) else crate.src.parent
    if unit in crate.files and not any(m[: len(unit)] == unit and m != unit for m in crate.files):
        return str(crate.files[unit].relative_to(base))
    return str((crate.src.joinpath(*unit)).relative_to(base)) + "/"


def circles(crate, graph):
    """Circles between files, then between folders: at each depth every module stands for its
    folder at that depth (`config::parts` at depth 1 is `config/`)."""
    depth = max(len(m) for m in graph)
    reported = []
    for level in [depth + 1] + list(range(depth, 0, -1)):
        units = {}
        for source, targets in graph.items():
            edges = units.setdefault(source[:level], set())
            for target in targets:
                a, b = source[:level], target[:level]
                # Inside one unit, or from a folder's entry file into the folder: no dependency.
                if a != b and b[: len(a)] != a:
                    edges.add(b)
        for group in strongly_connected(units):
            if group not in reported:
                reported.append(group)
                yield group, units


def self_test():
    """The check itself finds a planted circle (a/x.rs -> b.rs -> a/x.rs, so a/ <-> b.rs too)
    and nothing once it is broken: a check that cannot fail would let circles back."""
    import tempfile

    files = {
        "lib.rs": "mod a;\nmod b;\n",
        "a/mod.rs": "mod x;\npub use x::h;\npub fn f() {}\n",
        "a/x.rs": "use crate::b::g;\npub fn h() { g() }\n",
        "b.rs": "pub fn g() { crate::a::x::h() }\n#[cfg(test)]\nmod tests { use crate::a::f; }\n",
    }
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        for name, text in files.items():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            (src / name).write_text(text)
        crate = Crate(src)
        found = [[name_of(crate, u) for u in group] for group, _ in circles(crate, crate.edges())]
        assert found == [["src/a/x.rs", "src/b.rs"], ["src/a/", "src/b.rs"]], found
        (src / "b.rs").write_text("pub fn g() {}\n")
        crate = Crate(src)
        assert list(circles(crate, crate.edges())) == [], "a circle found where there is none"


def main(args):
    self_test()
    crates = [ROOT / a for a in (args or DEFAULT_CRATES)]
    found = False
    for src in crates:
        if not src.is_dir():
            if args:
                print(f"{src}: no such directory", file=sys.stderr)
                return 2
            continue
        crate = Crate(src)
        for group, units in circles(crate, crate.edges()):
            found = True
            print(f"import circle: {', '.join(name_of(crate, u) for u in group)}")
            for u in group:
                inside = sorted(name_of(crate, t) for t in units[u] if t in group)
                print(f"    {name_of(crate, u)} -> {', '.join(inside)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
