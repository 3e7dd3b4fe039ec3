#!/usr/bin/env python3
"""The parts of an image that hack/images.sh (make images) adds to a final
stage read by dockerfile.py.

    stage.py labels IMAGE STAGE_JSON VERSION REVISION CREATED
        adds the OCI labels to the stage: what the image is, which commit
        and version it was built from
    stage.py layer STAGE_JSON LAYER_DIR BINDIR [TT_SMI]
        writes into LAYER_DIR the files the final stage copies from its
        build stages (the static binaries from BINDIR; for agent/Dockerfile's
        COPY --from=tt-smi, the PyInstaller one-file tt-smi at TT_SMI, which
        hack/images/tt-smi.sh builds from that stage's own RUN)
    stage.py build-stage DOCKERFILE NAME
        JSON of the build stage NAME: its FROM, WORKDIR and RUNs with the
        ARGs substituted (hack/images/tt-smi.sh runs its pip RUN as written)
"""
import json
import os
import re
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


def layer(stage_path, layer, bindir, tt_smi=None):
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
                # The one-file build of the tt-smi stage (hack/images/tt-smi.sh),
                # copied as it is: stripping would cut off its appended archive.
                if not tt_smi:
                    sys.exit("stage.py layer: the stage copies /out/tt-smi, give its build (TT_SMI)")
                shutil.copyfile(tt_smi, dest)
            else:
                sys.exit(f"make images does not know COPY --from={c['from']} {src}")
            os.chmod(dest, 0o755)


def build_stage(path, name):
    """FROM, WORKDIR and RUNs of the build stage NAME, its ARGs substituted."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import dockerfile as df
    global_args, stage, found = {}, None, None
    for word, rest in df.instructions(path):
        if word == "FROM":
            m = re.match(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?$", rest, re.I)
            stage = m.group(2)
            if stage == name:
                found = {"from": df.subst(m.group(1), global_args), "workdir": None, "run": [], "args": {}}
        elif word == "ARG" and stage is None:
            k, _, v = rest.partition("=")
            global_args[k] = v
        elif found is not None and stage == name:
            if word == "ARG":
                k, _, v = rest.partition("=")
                found["args"][k] = v if v else global_args.get(k, "")
            elif word == "WORKDIR":
                found["workdir"] = rest
            elif word == "RUN":
                found["run"].append(df.subst(rest, found["args"]))
            elif word != "SHELL":
                sys.exit(f"{path}: stage {name}: {word} is not understood by stage.py build-stage")
    if found is None:
        sys.exit(f"{path}: no stage {name}")
    json.dump(found, sys.stdout, indent=1)
    print()


def main(argv):
    if len(argv) == 7 and argv[1] == "labels":
        labels(*argv[2:])
    elif len(argv) in (5, 6) and argv[1] == "layer":
        layer(*argv[2:])
    elif len(argv) == 4 and argv[1] == "build-stage":
        build_stage(*argv[2:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
