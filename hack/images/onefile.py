#!/usr/bin/env python3
"""A PyInstaller one-file executable (the agent image's tt-smi), read without
PyInstaller: its bootloader, the files of its archive, and the glibc it needs.

    onefile.py glibc FILE      the glibc floor: the highest GLIBC_x.y version
                               the bootloader or any bundled ELF library or
                               extension needs (objdump -p, version references),
                               and which member needs it
    onefile.py missing FILE    the libraries the bootloader or a bundled ELF
                               object needs (NEEDED) that are neither bundled
                               nor glibc's own (libc, libm, libdl, libpthread,
                               librt, libutil, ld-linux): what the host must
                               provide besides glibc (PyInstaller's Linux
                               bootloader itself needs libz.so.1)
    onefile.py list FILE       the archive's members (typecode, size, name)

The archive format is PyInstaller's CArchive (PyInstaller/archive/readers.py):
a cookie "MEI\\014\\013\\012\\013\\016" + !IIII64s (package length, TOC offset,
TOC length, Python version, libpython name) at the end, TOC entries
!IIIIBc + name (entry length, offset, length, uncompressed length, zlib flag,
typecode). The bundled libraries are unpacked into /tmp/_MEI* at each run and
loaded against the host's glibc, so the floor is the highest over all of
them, not the bootloader's alone.
"""
import os
import re
import struct
import subprocess
import sys
import tempfile
import zlib

MAGIC = b"MEI\014\013\012\013\016"
COOKIE = "!8sIIII64s"
ENTRY = "!IIIIBc"


def read(path):
    """(bytes before the archive, {name: (typecode, bytes)}, libpython name)"""
    data = open(path, "rb").read()
    at = data.rfind(MAGIC)
    if at < 0:
        raise ValueError(f"{path}: no PyInstaller archive (cookie not found)")
    _, pkg_len, toc_off, toc_len, _, pylib = struct.unpack_from(COOKIE, data, at)
    start = at + struct.calcsize(COOKIE) - pkg_len
    toc = data[start + toc_off:start + toc_off + toc_len]
    members, pos = {}, 0
    while pos < len(toc):
        elen, off, length, _, compressed, typecode = struct.unpack_from(ENTRY, toc, pos)
        name = toc[pos + struct.calcsize(ENTRY):pos + elen].rstrip(b"\0").decode()
        pos += elen
        blob = data[start + off:start + off + length]
        members[name] = (typecode.decode(), zlib.decompress(blob) if compressed else blob)
    return data[:start], members, pylib.rstrip(b"\0").decode()


GLIBC_OWN = {"libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1",
             "ld-linux-x86-64.so.2", "libresolv.so.2", "libcrypt.so.1"}


def objdump_p(elf_bytes):
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(elf_bytes)
        f.flush()
        return subprocess.run(["objdump", "-p", f.name], capture_output=True, text=True, check=True).stdout


def missing(path):
    """{needed library: [bundled objects needing it]} of those not bundled and not glibc's."""
    _, members, _ = read(path)
    bundled = {os.path.basename(n) for n, (_, b) in members.items() if b[:4] == b"\x7fELF"}
    objs = {"(bootloader)": open(path, "rb").read()}
    objs.update({n: b for n, (_, b) in members.items() if b[:4] == b"\x7fELF"})
    out = {}
    for name, blob in objs.items():
        for lib in re.findall(r"(?m)^\s+NEEDED\s+(\S+)", objdump_p(blob)):
            # (the bootloader runs before anything is unpacked: it cannot use a bundled library)
            if (name == "(bootloader)" or lib not in bundled) and lib not in GLIBC_OWN:
                out.setdefault(lib, []).append(name)
    return out


def glibc_needs(elf_bytes):
    """The GLIBC_x.y versions an ELF object references, as tuples."""
    out = objdump_p(elf_bytes)
    refs = out.split("Version References:", 1)[1] if "Version References:" in out else ""
    return {tuple(int(x) for x in v.split(".")) for v in re.findall(r"\bGLIBC_(\d+\.\d+(?:\.\d+)?)\b", refs)}


def glibc_floor(path):
    """(highest version tuple, [names needing it], number of ELF objects read)"""
    _, members, _ = read(path)
    # (the bootloader is read whole: PyInstaller adds the archive to it as an
    # ELF section, the section headers after it)
    objs = {"(bootloader)": open(path, "rb").read()}
    objs.update({n: b for n, (_, b) in members.items() if b[:4] == b"\x7fELF"})
    best, who = (0,), []
    for name, blob in objs.items():
        for v in glibc_needs(blob):
            if v > best:
                best, who = v, [name]
            elif v == best:
                who.append(name)
    return best, sorted(set(who)), len(objs)


def main(argv):
    if len(argv) == 3 and argv[1] == "glibc":
        v, who, n = glibc_floor(argv[2])
        print(f"GLIBC_{'.'.join(map(str, v))} ({n} ELF objects; needed by {', '.join(who)})")
    elif len(argv) == 3 and argv[1] == "missing":
        for lib, who in sorted(missing(argv[2]).items()):
            print(f"{lib} (needed by {', '.join(who)})")
    elif len(argv) == 3 and argv[1] == "list":
        _, members, pylib = read(argv[2])
        print(f"# libpython: {pylib}")
        for n, (t, b) in members.items():
            print(f"{t} {len(b):>10} {n}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
