#!/usr/bin/env python3
"""The flasher image's own checks, for hack/test-images.sh: in the image's
root (chroot), the real tools answer and a simulated flash works end to end.

    check(files, stage) -> [error, ...]

files: {path: (layer tarfile, member)} of the image (test-images.sh's
layers()); stage: flasher/Dockerfile's final stage (dockerfile.py).

  - the final stage's pip RUN pins tt-flash and tt-smi (==), and the image's
    ENV names the same versions
  - tt-flash --version and tt-smi --version print them; tt-flash flash
    --help still takes the bundle as ttdrv-flash passes it (positional
    fwbundle) and --force; tt-smi --help has -s, -r and -glx_reset
  - ttdrv-flash --help lists flash and fetch
  - TTDRV_FLASH_SIMULATE: a bundle written by Python's tarfile (as real
    bundles are tars), two cards on 19.7.0.0 -> the report says 19.8.0.0 for
    both; with fail-flash, exit 1 and reason FlashJobFailed
"""
import io
import json
import os
import re
import subprocess
import tarfile
import tempfile

ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"]


def check(files, stage):
    errors = []

    def want(cond, msg):
        if not cond:
            errors.append(f"flasher: {msg}")

    env = dict(e.split("=", 1) for e in stage["env"])
    pins = dict(re.findall(r"(tt-flash|tt-smi)==([0-9][^\"' ]*)", stage.get("pip_run", "")))
    want(pins.get("tt-flash") and pins.get("tt-flash") == env.get("TT_FLASH_VERSION"),
         f"pip RUN pins tt-flash {pins.get('tt-flash')}, ENV TT_FLASH_VERSION {env.get('TT_FLASH_VERSION')}")
    want(pins.get("tt-smi") and pins.get("tt-smi") == env.get("TT_SMI_VERSION"),
         f"pip RUN pins tt-smi {pins.get('tt-smi')}, ENV TT_SMI_VERSION {env.get('TT_SMI_VERSION')}")

    with tempfile.TemporaryDirectory() as d:
        for lt, m in files.values():
            if not m.isdev():
                lt.extract(m, d, filter="tar")
        userns = [] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user"]

        def run(*cmd, extra=()):
            r = subprocess.run(userns + ["chroot", d, "/usr/bin/env", "-i", *ENV, *extra, *cmd],
                               capture_output=True, text=True, timeout=300)
            return r.returncode, r.stdout + r.stderr

        rc, out = run("/usr/local/bin/tt-flash", "--version")
        want(rc == 0 and out.strip().endswith(pins.get("tt-flash", "?")), f"tt-flash --version: {out[-300:]}")
        rc, out = run("/usr/local/bin/tt-flash", "flash", "--help")
        want(rc == 0 and "fwbundle" in out and "--force" in out, f"tt-flash flash --help: {out[-300:]}")
        rc, out = run("/usr/local/bin/tt-smi", "--version")
        want(rc == 0 and pins.get("tt-smi", "?") in out, f"tt-smi --version: {out[-300:]}")
        rc, out = run("/usr/local/bin/tt-smi", "--help")
        want(rc == 0 and all(f in out for f in ("--snapshot", "--reset", "-glx_reset")), f"tt-smi --help: {out[-300:]}")
        rc, out = run(stage["entrypoint"][0], "--help")
        want(rc == 0 and "flash" in out and "fetch" in out, f"ttdrv-flash --help: {out[-300:]}")

        sim = os.path.join(d, "tmp/sim")
        os.makedirs(sim)
        json.dump(["19.7.0.0", "19.7.0.0"], open(os.path.join(sim, "cards.json"), "w"))
        with tarfile.open(os.path.join(sim, "fw_pack-19.8.0.fwbundle"), "w") as t:
            data = json.dumps({"version": "19.8.0"}).encode()
            info = tarfile.TarInfo("./manifest.json")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        # The version comes from the bundle's manifest: TT_FW_VERSION says otherwise.
        job = ["TTDRV_FLASH_SIMULATE=/tmp/sim", "TT_FW_BUNDLE_PATH=/tmp/sim/fw_pack-19.8.0.fwbundle",
               "TT_FW_VERSION=0.0.1", "TT_FW_READBACK=19.8.0.0"]
        rc, out = run(stage["entrypoint"][0], *stage["cmd"], extra=job)
        report_path = os.path.join(sim, "termination-log")
        report = json.load(open(report_path)) if os.path.exists(report_path) else None
        want(rc == 0 and report == {"before": ["19.7.0.0", "19.7.0.0"], "after": ["19.8.0.0", "19.8.0.0"],
                                    "skipped": False},
             f"simulated flash: exit {rc}, report {report}: {out[-500:]}")
        calls = open(os.path.join(sim, "calls.log")).read() if os.path.exists(os.path.join(sim, "calls.log")) else ""
        want("tt-flash --no-color flash /tmp/sim/fw_pack-19.8.0.fwbundle\n" in calls, f"simulated calls: {calls!r}")
        open(os.path.join(sim, "fail-flash"), "w").close()
        rc, out = run(stage["entrypoint"][0], *stage["cmd"], extra=job[:3] + ["TT_FW_READBACK=19.9.0.0"])
        report = json.load(open(report_path))
        want(rc == 1 and report.get("reason") == "FlashJobFailed" and report.get("before") == ["19.8.0.0"] * 2,
             f"simulated failing flash: exit {rc}, report {report}")
    return errors
