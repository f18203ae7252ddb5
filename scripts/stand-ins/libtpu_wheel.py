"""Writes a wheel that stands in for libtpu where Google's libtpu index is out of reach (scripts/images.sh).

tensorflow-tpu declares the exact libtpu release it needs; that release is only on Google's find-links index.
The stand-in has its name and version, so pip resolves the trainer-tpu image's install as it would in the
cloud, and a ``libtpu/libtpu.so`` that is no TPU runtime: a text file saying so (loading it fails with an
invalid-ELF error). TensorFlow looks for a TPU device before it loads libtpu, so on a machine without TPUs
nothing loads it.

    python scripts/stand-ins/libtpu_wheel.py OUT_DIR VERSION
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
import zipfile

STAND_IN_NOTE = (
    "stand-in for libtpu {version} built by scripts/images.sh: Google's libtpu index was out of reach; this is "
    "no TPU runtime\n"
)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(out_dir: str, version: str) -> str:
    """Writes ``libtpu-VERSION-py3-none-any.whl`` into ``out_dir``; returns its path."""
    info = f"libtpu-{version}.dist-info"
    files = {
        "libtpu/__init__.py": f'"""{STAND_IN_NOTE.format(version=version).strip()}"""\n'.encode(),
        "libtpu/libtpu.so": STAND_IN_NOTE.format(version=version).encode(),
        f"{info}/METADATA": (
            f"Metadata-Version: 2.1\nName: libtpu\nVersion: {version}\n"
            "Summary: stand-in for Google's libtpu (scripts/images.sh)\n"
        ).encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: effnet-pipeline\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [_record_line(name, data) for name, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = os.path.join(out_dir, f"libtpu-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python scripts/stand-ins/libtpu_wheel.py OUT_DIR VERSION")
    print(write_wheel(sys.argv[1], sys.argv[2]))
