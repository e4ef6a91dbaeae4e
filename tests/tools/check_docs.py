#!/usr/bin/env python3
"""The documentation's promises, checked (`./build.sh lint`):

1. every relative link in every tracked Markdown file resolves: its file exists and its
   `#anchor` is the GitHub slug of a heading in the target file;
2. every setting the code reads is documented in README.md or docs/*.md: the `GATEWAY_*`
   environment variables (build.sh, envoy/render.py, control-plane/src, tools/local_model.py),
   the plugin configuration's fields (the serde structs of src/settings.rs, and the fields of
   the stored credentials it nests), and the gateway headers (`x-gateway-*` in the filter's
   sources outside tests).

The settings are read out of the code, not listed here, so a new one without docs fails.
`--self-test` runs both checks on a made-up tree with a broken link, a broken anchor and an
undocumented variable, field and header, and fails unless each is reported.
"""
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Names the code reads that are not settings of a user, each with why.
INTERNAL = {
    # Between the filter and the control plane only: the filter sets them on its own calls and
    # strips any a client sends.
    "x-gateway-control-plane-fetch": "marks the control plane's own calls back through the gateway",
    "x-gateway-client-authorization": "carries a managed batch's caller's Authorization to the control plane",
    "x-gateway-workspace": "names the caller's workspace on calls from the filter to the control plane",
}


# ------------------------------------------------------------------------------- Markdown links


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation but `-` and `_`
    removed, spaces as `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose_lines(text: str, keep_code: bool = False):
    """(line number, line) outside fenced code blocks, inline code removed unless `keep_code`
    (a heading's slug keeps the text of its code)."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        marker = re.match(r"^\s*(```+|~~~+)", line)
        if marker:
            if fence is None:
                fence = marker.group(1)[:3]
            elif marker.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            yield number, line if keep_code else re.sub(r"`[^`]*`", "", line)


def anchors(text: str) -> set[str]:
    found, seen = set(), {}
    for _, line in prose_lines(text, keep_code=True):
        heading = re.match(r"^#{1,6} +(.*?) *#*$", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
    found.update(re.findall(r'<a (?:name|id)="([^"]+)"', text))
    return found


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def broken_links(root: Path, files: list[str]) -> list[str]:
    problems, cache = [], {}

    def anchors_of(path: Path) -> set[str]:
        if path not in cache:
            cache[path] = anchors(path.read_text(encoding="utf-8"))
        return cache[path]

    for name in files:
        source = root / name
        for number, line in prose_lines(source.read_text(encoding="utf-8")):
            for target in LINK.findall(line):
                if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("//"):
                    continue  # a URL (http:, mailto:, ...)
                path_part, _, anchor = target.partition("#")
                where = f"{name}:{number}: link `{target}`"
                path = (source.parent / path_part).resolve() if path_part else source.resolve()
                if path_part and not path.exists():
                    problems.append(f"{where}: no file {path_part}")
                    continue
                if anchor and path.suffix == ".md" and path.is_file() and anchor not in anchors_of(path):
                    problems.append(f"{where}: no heading with anchor #{anchor} in {path.relative_to(root)}")
    return problems


# ------------------------------------------------------------------------------- settings


def code_lines(path: Path):
    """(line number, line) of a source file up to its unit tests (`#[cfg(test)]`)."""
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if line.strip() == "#[cfg(test)]":
            return
        yield number, line


def is_test_file(path: Path) -> bool:
    return path.name in ("tests.rs", "fuzz.rs") or "tests" in path.parts or path.name.endswith("_tests.rs")


def environment_variables(root: Path) -> dict[str, str]:
    """Each `GATEWAY_*` name the run scripts and the control plane read, with where."""
    sources = [root / "build.sh", root / "envoy/render.py", root / "tools/local_model.py"]
    sources += sorted((root / "control-plane/src").rglob("*.rs"))
    found = {}
    for path in sources:
        if not path.is_file() or is_test_file(path.relative_to(root)):
            continue
        for number, line in code_lines(path):
            for name in re.findall(r"\bGATEWAY_[A-Z0-9_]*[A-Z0-9]\b", line):
                found.setdefault(name, f"{path.relative_to(root)}:{number}")
    return found


def struct_fields(path: Path) -> dict[str, list[tuple[str, str, int]]]:
    """The serde structs of a file: name -> [(JSON field, Rust type, line)], fields that serde
    skips left out and `rename`s applied."""
    structs, current, attributes = {}, None, []
    for number, line in code_lines(path):
        stripped = line.strip()
        opened = re.match(r"^(?:pub(?:\([^)]*\))? )?struct (\w+)\s*\{", stripped)
        if opened:
            current = structs.setdefault(opened.group(1), [])
            attributes = []
            continue
        if current is None:
            continue
        if stripped == "}":
            current = None
        elif stripped.startswith("#["):
            attributes.append(stripped)
        elif not stripped.startswith("//"):
            field = re.match(r"^(?:pub(?:\([^)]*\))? )?(\w+):\s*(.+?),?$", stripped)
            if field:
                serde = " ".join(a for a in attributes if a.startswith("#[serde"))
                renamed = re.search(r'rename\s*=\s*"([^"]+)"', serde)
                if not re.search(r"\bskip\b|skip_deserializing", serde):
                    current.append((renamed.group(1) if renamed else field.group(1), field.group(2), number))
            attributes = []
    return structs


def string_array(path: Path, name: str) -> list[tuple[str, int]]:
    """The string literals of the array constant `name` in a file, with their lines."""
    items, inside = [], False
    for number, line in code_lines(path):
        if not inside and re.search(rf"\b{name}\b[^=]*=", line):
            inside = True
            line = line.split("=", 1)[1]
        if inside:
            items += [(item, number) for item in re.findall(r'"([^"]*)"', line)]
            if "];" in line:
                return items
    return items


def plugin_fields(root: Path) -> dict[str, str]:
    """Every field of the plugin configuration, as its dotted path, with where it is read:
    the fields of `Settings` (src/settings.rs) and of the structs it nests, then the fields of
    each stored credential (`credentials.<slug>`, schema/src/credential.rs and cloud.rs)."""
    settings = root / "src/settings.rs"
    structs = struct_fields(settings)
    found = {}

    def walk(struct: str, prefix: str):
        for field, rust_type, number in structs.get(struct, []):
            path = prefix + field
            found[path] = f"src/settings.rs:{number}"
            nested = [name for name in re.findall(r"\w+", rust_type) if name in structs and name != struct]
            for name in nested:
                walk(name, path + ".")

    walk("Settings", "")
    credential = root / "schema/src/credential.rs"
    cloud = root / "schema/src/cloud.rs"
    for source, constant in ((credential, "OWN_KEYS"), (cloud, "KEYS")):
        if source.is_file():
            for field, number in string_array(source, constant):
                found.setdefault(f"credentials.*.{field}", f"{source.relative_to(root)}:{number}")
    return found


def gateway_headers(root: Path) -> dict[str, str]:
    """Each `x-gateway-*` header (and its aliases) the filter reads or sets, outside tests."""
    found = {}
    headers = root / "src/request/headers.rs"
    table = headers.read_text(encoding="utf-8") if headers.is_file() else ""
    for number, line in enumerate(table.split("\n"), 1):
        row = re.match(r"\s*\(Field::\w+, &\[(.*)\]\),", line)
        if row:
            for name in re.findall(r'"([^"]+)"', row.group(1)):
                found.setdefault(name, f"src/request/headers.rs:{number}")
    for base in ("src", "schema/src"):
        for path in sorted((root / base).rglob("*.rs")):
            if is_test_file(path.relative_to(root)):
                continue
            for number, line in code_lines(path):
                for name in re.findall(r'"(x-gateway-[a-z0-9-]*[a-z0-9])"', line, flags=re.IGNORECASE):
                    found.setdefault(name.lower(), f"{path.relative_to(root)}:{number}")
    return found


def undocumented(root: Path, docs: list[str]) -> list[str]:
    text = "\n".join((root / name).read_text(encoding="utf-8") for name in docs)
    lowered = text.lower()
    quoted = set(re.findall(r"`([^`\n]+)`", text)) | set(re.findall(r'"([^"\n]+)"', text))
    problems = []

    for name, where in sorted(environment_variables(root).items()):
        if name not in INTERNAL and not re.search(rf"\b{name}\b", text):
            problems.append(f"environment variable {name} (read at {where}) is not in the docs")

    for path, where in sorted(plugin_fields(root).items()):
        if path.startswith("credentials.*."):
            field = path.rsplit(".", 1)[1]
            documented = field in quoted
        else:
            field = path.rsplit(".", 1)[-1]
            # A nested field is documented under its whole path (`cache.semantic.model`); a
            # top-level one as a code span or JSON key.
            documented = path in quoted if "." in path else field in quoted
        if path not in INTERNAL and not documented:
            problems.append(f"plugin configuration field `{path}` (read at {where}) is not in the docs")

    for name, where in sorted(gateway_headers(root).items()):
        if name not in INTERNAL and not re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", lowered):
            problems.append(f"gateway header {name} (read at {where}) is not in the docs")
    return problems


# ------------------------------------------------------------------------------- running


def markdown_files(root: Path) -> list[str]:
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
                            cwd=root, capture_output=True, text=True, check=True).stdout.split()
    return sorted(name for name in listed if (root / name).is_file())


def doc_files(root: Path) -> list[str]:
    return ["README.md"] + sorted(str(p.relative_to(root)) for p in (root / "docs").glob("*.md"))


def check(root: Path) -> list[str]:
    return broken_links(root, markdown_files(root)) + undocumented(root, doc_files(root))


def self_test() -> None:
    """A made-up tree: each kind of fault must be reported, and the tree without them passes."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "docs").mkdir()
        (root / "src/request").mkdir(parents=True)
        (root / "schema/src").mkdir(parents=True)
        (root / "control-plane/src").mkdir(parents=True)
        (root / "build.sh").write_text('port="${GATEWAY_PORT:-8787}"\nnew="${GATEWAY_NEW_THING:-x}"\n')
        (root / "src/settings.rs").write_text(
            "#[derive(Deserialize)]\npub(crate) struct Settings {\n    pub(crate) api_keys: Vec<String>,\n"
            "    #[serde(default)]\n    pub(crate) cache: CacheSettings,\n    #[serde(skip)]\n    layout: u8,\n}\n"
            "#[derive(Deserialize)]\npub(crate) struct CacheSettings {\n    pub(crate) byte_budget: u64,\n"
            "    pub(crate) hidden_knob: u64,\n}\n")
        (root / "src/request/headers.rs").write_text(
            'const HEADERS: &[(Field, &[&str])] = &[\n    (Field::ApiKey, &["x-gateway-api-key", "api_key"]),\n];\n')
        (root / "src/pipeline.rs").write_text('const H: &str = "x-gateway-secret-knob";\n')
        (root / "docs/a.md").write_text("# Title\n\n## Some `code` (here)\n\n[ok](#some-code-here) [up](../README.md#start)\n")
        readme = ("# Start\n\n[a](docs/a.md#some-code-here) [gone](docs/missing.md) [bad](docs/a.md#nowhere)\n\n"
                  "`GATEWAY_PORT`, `api_keys`, `cache`, `cache.byte_budget`, `x-gateway-api-key` (`api_key`)\n")
        (root / "README.md").write_text(readme)
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
        problems = check(root)
        expected = ["no file docs/missing.md", "no heading with anchor #nowhere", "GATEWAY_NEW_THING",
                    "`cache.hidden_knob`", "x-gateway-secret-knob"]
        missed = [what for what in expected if not any(what in problem for problem in problems)]
        if missed or len(problems) != len(expected):
            sys.exit(f"check_docs self-test failed: expected {expected}, got {problems}")
        (root / "README.md").write_text(readme.replace(" [gone](docs/missing.md) [bad](docs/a.md#nowhere)", "")
                                        + "`GATEWAY_NEW_THING` `cache.hidden_knob` x-gateway-secret-knob\n")
        if check(root):
            sys.exit(f"check_docs self-test failed: a clean tree reported {check(root)}")
    print("check_docs self-test: broken links, broken anchors and undocumented settings are caught")


def main() -> None:
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    problems = check(ROOT)
    for problem in problems:
        print(problem)
    if problems:
        sys.exit(f"check_docs: {len(problems)} problem(s) in the documentation")
    print("check_docs: links resolve and every setting the code reads is documented")


if __name__ == "__main__":
    main()
