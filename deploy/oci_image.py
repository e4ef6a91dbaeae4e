#!/usr/bin/env python3
"""Writes the filter as an OCI image layout, the way Istio's `WasmPlugin` and Envoy Gateway's
`EnvoyExtensionPolicy` pull a Wasm module: one layer, a tar holding `plugin.wasm` (the
"compat" variant of Istio's Wasm image spec, made of standard OCI media types, so any
registry and any OCI tool take it).

Usage: oci_image.py WASM LAYOUT_DIR [TAG]

The image is reproducible: the same module gives the same digests (no timestamps, owner 0,
mode 0644). The layout (`oci-layout`, `index.json`, `blobs/sha256/...`) is what
`skopeo copy oci:LAYOUT_DIR:TAG docker://REGISTRY/REPO:TAG` pushes.
"""
import gzip
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def layer_tar(module: bytes) -> bytes:
    """A tar with `plugin.wasm` only, with no time, owner or name that would change its digest."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("plugin.wasm")
        info.size, info.mode, info.mtime, info.uid, info.gid = len(module), 0o644, 0, 0, 0
        tar.addfile(info, io.BytesIO(module))
    return out.getvalue()


def write_blob(blobs: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def write_layout(module: bytes, layout: Path, tag: str) -> str:
    """Writes the layout; returns the manifest's digest."""
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    tar = layer_tar(module)
    layer = write_blob(blobs, gzip.compress(tar, mtime=0))
    config = {
        "architecture": "wasm", "os": "wasip1",
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(tar).hexdigest()}"]},
        "config": {},
    }
    config_blob = write_blob(blobs, json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2, "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, **config_blob},
        "layers": [{"mediaType": LAYER, **layer, "annotations": {"org.opencontainers.image.title": "plugin.wasm"}}],
    }
    manifest_blob = write_blob(blobs, json.dumps(manifest, sort_keys=True).encode())
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
        {"mediaType": MANIFEST, **manifest_blob, "annotations": {"org.opencontainers.image.ref.name": tag}}]}
    (layout / "index.json").write_text(json.dumps(index, sort_keys=True))
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    return manifest_blob["digest"]


def main() -> None:
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    module = Path(sys.argv[1]).read_bytes()
    layout = Path(sys.argv[2])
    tag = sys.argv[3] if len(sys.argv) == 4 else "latest"
    if layout.exists() and any(layout.iterdir()):
        # Old blobs would stay beside the new ones: start from an empty directory.
        for path in sorted(layout.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    print(write_layout(module, layout, tag))


if __name__ == "__main__":
    main()
