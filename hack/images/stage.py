#!/usr/bin/env python3
"""The parts of an image that hack/images.sh (make images) adds to a final
stage read by dockerfile.py.

    stage.py labels IMAGE STAGE_JSON VERSION REVISION CREATED
        adds the OCI labels to the stage: what the image is, which commit
        and version it was built from
    stage.py layer STAGE_JSON LAYER_DIR BINDIR
        writes into LAYER_DIR the files the final stage copies from its
        build stages (the static binaries from BINDIR)
"""
import json
import os
import shutil
import subprocess
import sys

WHAT = {
    "controller": "Kubernetes controller that rolls tt-kmd out across Tenstorrent nodes",
    "agent": "Node agent of the tt-kmd driver manager: builds, loads and reports the kernel module",
    "vfio": "VFIO binder of the tt-kmd driver manager: binds Tenstorrent PCI functions to vfio-pci for VM passthrough",
    "flasher": "Firmware flasher of the tt-kmd driver manager: the firmware policy's flash Job (tt-flash, tt-smi readback)",
}
REPO = "https://github.com/tenstorrent/tt-k8s-driver-manager-rs"


def labels(image, path, version, revision, created):
    stage = json.load(open(path))
    p = "org.opencontainers.image."
    stage["labels"] = {
        p + "title": f"ttdrv-{image}", p + "description": WHAT[image], p + "version": version,
        p + "revision": revision, p + "created": created,
        p + "source": REPO, p + "url": REPO,
        p + "licenses": "Apache-2.0", p + "vendor": "Tenstorrent",
        p + "base.name": stage.get("from") or "",
    }
    json.dump(stage, open(path, "w"))


def layer(stage_path, layer, bindir):
    stage = json.load(open(stage_path))
    for c in stage["copies"]:
        if c["from"] is None:
            # Build-context files of the final stage: only the package list, which
            # its RUN consumes and deletes (the base layer holds the packages).
            if c["src"] != ["hack/images/packages.txt"]:
                sys.exit(f"make images does not know the context COPY {c['src']}")
            continue
        for src in c["src"]:
            dest = os.path.join(layer, c["dest"].lstrip("/"))
            if c["dest"].endswith("/"):
                dest = os.path.join(dest, os.path.basename(src))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            name = os.path.basename(src)
            if c["from"] == "build" and src.startswith("/out/"):
                shutil.copyfile(os.path.join(bindir, name), dest)
                subprocess.run(["strip", "--strip-debug", dest], check=True)
            elif c["from"] == "tt-smi" and src == "/out/tt-smi":
                # tt-smi's place: a stand-in that answers like the real one would.
                env = dict(e.split("=", 1) for e in stage["env"])
                with open(dest, "w") as f:
                    f.write("#!/bin/sh\n# stand-in for tt-smi (make images; the release image bundles the\n"
                            "# PyInstaller build of agent/Dockerfile's tt-smi stage)\n"
                            f"echo \"tt-smi {env.get('TT_SMI_VERSION', '0.0.0')} (stand-in)\"\n")
            else:
                sys.exit(f"make images does not know COPY --from={c['from']} {src}")
            os.chmod(dest, 0o755)


def main(argv):
    if len(argv) == 7 and argv[1] == "labels":
        labels(*argv[2:])
    elif len(argv) == 5 and argv[1] == "layer":
        layer(*argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
