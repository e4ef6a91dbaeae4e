"""The OCI image of the filter (`./build.sh image`, `deploy/oci_image.py`): a valid OCI image
layout whose one layer holds `plugin.wasm`, byte for byte the module built, the same digests on
every build, and a module that Envoy loads and serves from; pushed by `./build.sh image --push` to
a registry on loopback (Debian's docker-registry) and pulled back with skopeo, it is the same
image."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx2 as httpx
import pytest

from helpers import chat_body, config
from pg_server import free_ports, stop_group
from support import WASM, host, running_mesh

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy/oci_image.py"


def build(layout: Path, tag: str = "0.1.0") -> str:
    return subprocess.run([sys.executable, str(SCRIPT), str(WASM), str(layout), tag], check=True,
                          capture_output=True, text=True).stdout.strip()


def blob(layout: Path, descriptor: dict) -> bytes:
    algorithm, digest = descriptor["digest"].split(":")
    data = (layout / "blobs" / algorithm / digest).read_bytes()
    assert (algorithm, hashlib.sha256(data).hexdigest(), len(data)) == ("sha256", digest, descriptor["size"])
    return data


def test_the_image_is_one_layer_holding_the_module_and_is_reproducible(tmp_path):
    layout = tmp_path / "oci"
    digest = build(layout)
    assert json.loads((layout / "oci-layout").read_text()) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads((layout / "index.json").read_text())
    [entry] = index["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "0.1.0"
    manifest = json.loads(blob(layout, entry))
    assert manifest["mediaType"] == entry["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert manifest["config"]["mediaType"] == "application/vnd.oci.image.config.v1+json"
    image_config = json.loads(blob(layout, manifest["config"]))
    [layer] = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.oci.image.layer.v1.tar+gzip"
    tar = gzip.decompress(blob(layout, layer))
    assert image_config["rootfs"]["diff_ids"] == [f"sha256:{hashlib.sha256(tar).hexdigest()}"]
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        [member] = archive.getmembers()
        assert (member.name, member.mode, member.mtime, member.uid) == ("plugin.wasm", 0o644, 0, 0)
        assert archive.extractfile(member).read() == WASM.read_bytes()
    assert build(tmp_path / "again") == digest, "the same module gives the same image"
    assert build(layout) == digest and len(list((layout / "blobs/sha256").iterdir())) == 3, "rebuilt in place"


def module_of(layout: Path) -> bytes:
    """`plugin.wasm` of the one image in `layout`."""
    manifest = json.loads(blob(layout, json.loads((layout / "index.json").read_text())["manifests"][0]))
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob(layout, manifest["layers"][0])))) as archive:
        return archive.extractfile("plugin.wasm").read()


def serves(module: Path, openai_mock, directory: Path) -> None:
    with running_mesh(directory, [openai_mock], module) as gw:
        r = gw.chat(config(host(openai_mock)), chat_body())
        assert r.status_code == 200, r.text


def test_the_module_from_the_image_loads_in_envoy_and_serves(tmp_path, openai_mock):
    layout = tmp_path / "oci"
    build(layout)
    module = tmp_path / "plugin.wasm"
    module.write_bytes(module_of(layout))
    serves(module, openai_mock, tmp_path)


@pytest.fixture
def registry(tmp_path):
    """Debian's docker-registry on a loopback port, storing in a temporary directory."""
    (port,) = free_ports(1)
    settings = tmp_path / "registry.yml"
    settings.write_text(json.dumps({"version": 0.1, "log": {"level": "warn"},
                                    "storage": {"filesystem": {"rootdirectory": str(tmp_path / "storage")}},
                                    "http": {"addr": f"127.0.0.1:{port}"}}))
    with open(tmp_path / "registry.log", "wb") as log:
        proc = subprocess.Popen(["docker-registry", "serve", str(settings)], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "registry.log").read_text()
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        stop_group(proc)


def test_the_image_pushed_to_a_registry_comes_back_the_same_and_serves(tmp_path, registry, openai_mock):
    reference = f"{registry}/platform/model-gateway:0.1.0"
    pushed = subprocess.run(["bash", str(REPO / "build.sh"), "image", "0.1.0", "--push", reference, "--insecure"],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    built = json.loads((REPO / "target/oci/model-gateway/index.json").read_text())["manifests"][0]["digest"]
    pulled = tmp_path / "pulled"
    subprocess.run(["skopeo", "copy", "--src-tls-verify=false", f"docker://{reference}", f"oci:{pulled}:0.1.0"],
                   check=True, capture_output=True, timeout=120)
    assert json.loads((pulled / "index.json").read_text())["manifests"][0]["digest"] == built, "the same manifest"
    module = tmp_path / "plugin.wasm"
    module.write_bytes(module_of(pulled))
    assert module.read_bytes() == WASM.read_bytes()
    serves(module, openai_mock, tmp_path)


def test_build_sh_image_writes_the_layout_under_target():
    result = subprocess.run(["bash", str(REPO / "build.sh"), "image", "e2e-tag"], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    layout = REPO / "target/oci/model-gateway"
    [entry] = json.loads((layout / "index.json").read_text())["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "e2e-tag"
    assert entry["digest"] in result.stderr
    # --push without a reference says what is missing instead of failing obscurely.
    pushed = subprocess.run(["bash", str(REPO / "build.sh"), "image", "--push"], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert pushed.returncode != 0 and "--push needs a reference" in pushed.stderr
