#!/usr/bin/env python3
"""Writes the tally-nccl wheel (PEP 427) from binaries `make build` already made.

    scripts/build/wheel.py --tally target/release/tally --plugin target/release/libnccl_net_tally.so --out target/wheels

The wheel holds python/tally_nccl/ with the plugin at tally_nccl/lib/libnccl-net-tally.so,
and `tally` as a script (installed into the environment's bin/). Nothing is
compiled here: CI packages what `make build` linked against glibc 2.28
(scripts/build/wheel.sh checks that floor first), so the tag is
manylinux_2_28_<arch>, the arch read from the binaries' ELF headers.
libfabric is not in the wheel: the host's is loaded (an EFA host's must win).
The archive is reproducible: fixed timestamps, sorted entries.
"""

import argparse
import base64
import hashlib
import io
import os
import re
import sys
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DIST = "tally_nccl"  # the distribution's name in file names (pip install tally-nccl)
EPOCH = (2020, 1, 1, 0, 0, 0)
# ELF e_machine -> the wheel's platform arch.
MACHINES = {62: "x86_64", 183: "aarch64"}


def workspace_version():
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        m = re.search(r'^\[workspace\.package\][^\[]*?^version\s*=\s*"([^"]+)"', f.read(), re.M | re.S)
    if not m:
        sys.exit("wheel: no version in Cargo.toml's [workspace.package]")
    return m[1]


def elf_arch(path):
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF" or head[4] != 2:
        sys.exit(f"wheel: {path} is not a 64-bit ELF file")
    machine = int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")
    if machine not in MACHINES:
        sys.exit(f"wheel: {path}: ELF machine {machine} is neither x86_64 nor aarch64")
    return MACHINES[machine]


def record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def metadata(version):
    return f"""Metadata-Version: 2.1
Name: tally-nccl
Version: {version}
Summary: tally's NCCL plugin (ncclNet + ncclCollNet over reduction servers) and the tally command
License: Apache-2.0
Requires-Python: >=3.8
Description-Content-Type: text/plain

Installs `tally` and libnccl-net-tally.so (glibc 2.28 or newer). The plugin
loads the host's libfabric (libfabric.so.1, 1.17 or newer): Debian/Ubuntu
libfabric1, or the AWS EFA installer's on EFA hosts.

    eval "$(python -m tally_nccl env --servers srv1:7400,srv2:7400 --provider tcp)"
    python -m tally_nccl check

See docs/nccl.md in the tally repository.
"""


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tally", required=True)
    p.add_argument("--plugin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--glibc", default="2.28", help="the floor the binaries were checked against")
    a = p.parse_args()

    arch = elf_arch(a.tally)
    if elf_arch(a.plugin) != arch:
        sys.exit(f"wheel: {a.tally} is {arch} but {a.plugin} is {elf_arch(a.plugin)}")
    version = workspace_version()
    tag = f"py3-none-manylinux_{a.glibc.replace('.', '_')}_{arch}"
    info = f"{DIST}-{version}.dist-info"

    # (name in the wheel, bytes, executable)
    files = []
    pkg = os.path.join(ROOT, "python", "tally_nccl")
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py"):
            with open(os.path.join(pkg, name), "rb") as f:
                files.append((f"tally_nccl/{name}", f.read(), False))
    files.append(("tally_nccl/_version.py", f'__version__ = "{version}"\n'.encode(), False))
    with open(a.plugin, "rb") as f:
        files.append(("tally_nccl/lib/libnccl-net-tally.so", f.read(), True))
    with open(a.tally, "rb") as f:
        files.append((f"{DIST}-{version}.data/scripts/tally", f.read(), True))
    files.append((f"{info}/METADATA", metadata(version).encode(), False))
    wheel = f"Wheel-Version: 1.0\nGenerator: tally scripts/build/wheel.py\nRoot-Is-Purelib: false\nTag: {tag}\n"
    files.append((f"{info}/WHEEL", wheel.encode(), False))
    record = io.StringIO()
    for name, data, _ in files:
        record.write(f"{name},{record_hash(data)},{len(data)}\n")
    record.write(f"{info}/RECORD,,\n")
    files.append((f"{info}/RECORD", record.getvalue().encode(), False))

    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, f"{DIST}-{version}-{tag}.whl")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, executable in files:
            zi = zipfile.ZipInfo(name, EPOCH)
            # pip keeps the executable bit of entries that carry it (the scripts, the .so).
            zi.external_attr = (0o100755 if executable else 0o100644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    print(path)


if __name__ == "__main__":
    main()
