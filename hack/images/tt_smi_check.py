#!/usr/bin/env python3
"""The agent image's tt-smi, checked for hack/test-images.sh: the real
PyInstaller one-file build of agent/Dockerfile's tt-smi stage, not a stand-in.

    check(files, stage) -> ([error, ...], summary line)

files: {path: (layer tarfile, member)} of the agent image (test-images.sh's
layers()); stage: agent/Dockerfile's final stage (dockerfile.py).

  - /opt/tt-smi/tt-smi is an ELF executable carrying a PyInstaller archive
    (hack/images/onefile.py) with tt_smi, tt_umd and pyluwen in it: not a
    script, not the old stand-in
  - the tt-smi stage pins tt-smi==X, and the image's ENV TT_SMI_VERSION says X
  - in the image's root (chroot: Debian minbase, no Python), with /tmp for
    its unpacking: `tt-smi --version` prints X; `--help` lists --list,
    --snapshot and --reset; `tt-smi -ls` with no driver gets as far as
    looking for one ("No Tenstorrent driver detected"), so every bundled
    module it imports on the way loads
  - every library a bundled ELF object needs is bundled or glibc's own; the
    bootloader needs glibc and HOST_NEEDS (zlib) from the host, nothing else
  - its glibc floor (the highest GLIBC_x.y the bootloader or a bundled object
    needs) is not above GLIBC_FLOOR, the one docs/agent.md documents
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import onefile  # noqa: E402

# The documented floor (docs/agent.md, agent/Dockerfile): bookworm's glibc.
GLIBC_FLOOR = (2, 36)
# What the host must have besides glibc (docs/agent.md): PyInstaller's
# bootloader links zlib, before it unpacks anything.
HOST_NEEDS = {"libz.so.1"}
PATH = "opt/tt-smi/tt-smi"
ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8",
       "TERM=dumb"]


def pinned():
    """The tt-smi version agent/Dockerfile's tt-smi stage pip-installs."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, os.path.join(here, "stage.py"), "build-stage",
                          os.path.join(here, "..", "..", "agent", "Dockerfile"), "tt-smi"],
                         capture_output=True, text=True, check=True).stdout
    pins = re.findall(r"tt-smi==([0-9][^\"' ]*)", " ".join(json.loads(out)["run"]))
    return pins[0] if len(pins) == 1 else None


def binary_problems(path):
    """What is wrong with PATH as a self-contained one-file tt-smi, and its floor."""
    data = open(path, "rb").read(4)
    if data != b"\x7fELF":
        return [f"/{PATH} is not an ELF executable (starts {data!r}): a stand-in?"], None
    try:
        _, members, pylib = onefile.read(path)
    except ValueError as e:
        return [f"/{PATH}: {e}"], None
    problems = []
    for pkg in ("tt_smi", "tt_umd", "pyluwen"):
        if not any(n.startswith(pkg + "/") for n in members):
            problems.append(f"/{PATH}: no {pkg}/ in its archive")
    for lib, who in sorted(onefile.missing(path).items()):
        if lib in HOST_NEEDS and who == ["(bootloader)"]:
            continue
        problems.append(f"/{PATH}: {lib} is needed by {', '.join(who[:3])} but not bundled")
    floor, who, n = onefile.glibc_floor(path)
    if floor > GLIBC_FLOOR:
        problems.append(f"/{PATH} needs GLIBC_{'.'.join(map(str, floor))} ({', '.join(who)}), "
                        f"above the documented floor {'.'.join(map(str, GLIBC_FLOOR))}")
    return problems, (floor, who, n, pylib)


def check(files, stage):
    errors = []

    def want(cond, msg):
        if not cond:
            errors.append(f"agent: tt-smi: {msg}")

    env = dict(e.split("=", 1) for e in stage["env"])
    pin = pinned()
    want(pin and pin == env.get("TT_SMI_VERSION"),
         f"the tt-smi stage pins {pin}, the image's ENV TT_SMI_VERSION is {env.get('TT_SMI_VERSION')}")
    if PATH not in files:
        return errors + [f"agent: /{PATH} missing"], "no tt-smi"

    with tempfile.TemporaryDirectory() as d:
        for lt, m in files.values():
            if not m.isdev():
                lt.extract(m, d, filter="tar")
        os.makedirs(os.path.join(d, "tmp"), exist_ok=True)
        os.chmod(os.path.join(d, "tmp"), 0o1777)
        problems, info = binary_problems(os.path.join(d, PATH))
        errors += [f"agent: tt-smi: {p}" for p in problems]
        if info is None:
            return errors, "not a one-file build"
        userns = [] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user"]

        def run(*args):
            r = subprocess.run(userns + ["chroot", d, "/usr/bin/env", "-i", *ENV, "/" + PATH, *args],
                               capture_output=True, text=True, timeout=300)
            return r.returncode, r.stdout + r.stderr

        rc, out = run("--version")
        want(rc == 0 and out.strip() == pin, f"--version in the image's root: rc {rc}: {out[-300:]}")
        rc, out = run("--help")
        want(rc == 0 and all(f in out for f in ("--list", "--snapshot", "--reset")), f"--help: rc {rc}: {out[-300:]}")
        rc, out = run("-ls")
        want("No Tenstorrent driver detected" in out, f"-ls without a driver: rc {rc}: {out[-400:]}")
    floor, who, n, pylib = info
    size = files[PATH][1].size >> 20
    return errors, (f"tt-smi {pin}: PyInstaller one-file, {size} MiB ({pylib}, {n} ELF objects; from the host only glibc and "
                    f"{', '.join(sorted(HOST_NEEDS))}), "
                    f"glibc floor GLIBC_{'.'.join(map(str, floor))} ({', '.join(who)}) <= "
                    f"{'.'.join(map(str, GLIBC_FLOOR))}; --version, --help and -ls run in the image's root")
