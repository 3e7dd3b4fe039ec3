#!/usr/bin/env python3
"""Writes an image archive in the `docker save` layout (manifest.json, the
config, one tar per layer), which `ctr images import` and `docker load` read.
No registry and no daemon are involved.

    archive.py --ref NAME:TAG --stage STAGE.json [--layer-tar ROOTFS.tar]...
               [--layer-dir DIR]... OUT.tar

STAGE.json is `dockerfile.py final-stage` output: the image config (Env,
Entrypoint, Cmd, User, WorkingDir, ExposedPorts) is the base image's,
overridden by the Dockerfile's final stage, as `docker build` would make it.
Layers are stacked in the order given (all --layer-tar first); a --layer-dir
is packed with uid/gid 0 and mtime 0, so the same files give the same layer.
"""
import argparse
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pack_dir(src, out):
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as t:
        for root, dirs, files in os.walk(src):
            dirs.sort()
            for n in dirs + sorted(files):
                p = os.path.join(root, n)
                ti = t.gettarinfo(p, arcname=os.path.relpath(p, src))
                ti.uid = ti.gid = 0
                ti.uname = ti.gname = ""
                ti.mtime = 0
                if ti.isreg():
                    with open(p, "rb") as f:
                        t.addfile(ti, f)
                else:
                    t.addfile(ti)


def image_config(stage, diff_ids):
    base = stage["base"]
    env = {}
    for e in base["env"] + stage["env"]:
        k, _, v = e.partition("=")
        env[k] = v
    cfg = {"Env": [f"{k}={v}" for k, v in env.items()]}
    if stage.get("entrypoint"):
        cfg["Entrypoint"] = stage["entrypoint"]
    if stage.get("cmd"):
        cfg["Cmd"] = stage["cmd"]
    user = stage.get("user") or base["user"]
    if user:
        cfg["User"] = user
    workdir = stage.get("workdir") or base["workdir"]
    if workdir:
        cfg["WorkingDir"] = workdir
    if stage.get("expose"):
        cfg["ExposedPorts"] = {p: {} for p in stage["expose"]}
    if stage.get("labels"):
        cfg["Labels"] = stage["labels"]
    return {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + d for d in diff_ids]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "hack/images.sh"} for _ in diff_ids],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ref", required=True)
    ap.add_argument("--stage", required=True)
    ap.add_argument("--layer-tar", action="append", default=[])
    ap.add_argument("--layer-dir", action="append", default=[])
    ap.add_argument("out")
    a = ap.parse_args()
    stage = json.load(open(a.stage))
    tmp = tempfile.mkdtemp(prefix="ttdrv-archive.")
    try:
        layers = list(a.layer_tar)
        for i, d in enumerate(a.layer_dir):
            p = os.path.join(tmp, f"dir{i}.tar")
            pack_dir(d, p)
            layers.append(p)
        diff_ids = [sha256_file(p) for p in layers]
        cfg = json.dumps(image_config(stage, diff_ids), sort_keys=True).encode()
        cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
        names = [d + "/layer.tar" for d in diff_ids]
        manifest = json.dumps([{"Config": cfg_name, "RepoTags": [a.ref], "Layers": names}]).encode()
        part = a.out + ".part"
        with tarfile.open(part, "w") as t:
            def add_bytes(name, data):
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                t.addfile(ti, io.BytesIO(data))
            add_bytes(cfg_name, cfg)
            for name, p in zip(names, layers):
                ti = tarfile.TarInfo(name)
                ti.size = os.path.getsize(p)
                with open(p, "rb") as f:
                    t.addfile(ti, f)
            add_bytes("manifest.json", manifest)
        os.replace(part, a.out)
        print(f"{a.ref} {a.out} layers={len(layers)} config=sha256:{cfg_name[:-5]}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
