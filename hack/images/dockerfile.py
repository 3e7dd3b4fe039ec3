#!/usr/bin/env python3
"""What a Dockerfile's final stage says about its image, and the package list.

Used by hack/images.sh (make images) to give the images it builds the same
config as the Dockerfiles (entrypoint, cmd, env, user, ports, files copied from
the build stages) and by hack/test-images.sh to check that the Dockerfiles,
hack/images/packages.txt and the built archives agree.

    dockerfile.py final-stage DOCKERFILE       JSON of the final stage
    dockerfile.py packages IMAGE               the packages of IMAGE (one a line)

A final stage with a RUN that pip-installs (flasher/Dockerfile's venv) gets
"pip_run": that command with the stage's ARGs substituted, which make images
runs in its Debian root (hack/images/pyvenv.sh); stages without one have no
such key (their JSON, and so their cache keys, stay as they were).

Only the instructions the project's Dockerfiles use are understood; anything
else in the final stage is an error, so a new instruction cannot be silently
left out of `make images`.
"""
import json
import os
import re
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGES = os.path.join(HERE, "packages.txt")

# What the base images of the final stages bring themselves (their own image
# config), and how make images reproduces their file system from Debian
# packages. The Debian release is the one the image name carries.
BASES = {
    "debian:bookworm-slim": {
        "suite": "bookworm",
        "variant": "minbase",
        "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        "user": "",
        "workdir": "",
    },
    "gcr.io/distroless/static-debian12:nonroot": {
        "suite": "bookworm",
        "variant": "extract",
        "env": [
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
        ],
        "user": "65532",
        "workdir": "/home/nonroot",
    },
}


def packages(image):
    """The packages of IMAGE in hack/images/packages.txt."""
    found = None
    for raw in open(PACKAGES):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, rest = line.partition(":")
        if not sep:
            raise SystemExit(f"{PACKAGES}: line without 'image:': {raw.strip()}")
        if name.strip() == image:
            if found is not None:
                raise SystemExit(f"{PACKAGES}: two lines for {image}")
            found = rest.split()
    if not found:
        raise SystemExit(f"{PACKAGES}: no packages for {image}")
    return found


def instructions(path):
    """(INSTRUCTION, rest) pairs, continuation lines joined, comments dropped."""
    out, cur = [], ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if not cur and (line.lstrip().startswith("#") or not line.strip()):
            continue
        if cur and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


def subst(text, args):
    def one(m):
        name = m.group(1) or m.group(2)
        return args.get(name, "")
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", one, text)


def exec_form(rest):
    rest = rest.strip()
    if rest.startswith("["):
        return json.loads(rest)
    return ["/bin/sh", "-c", rest]


def final_stage(path):
    global_args, stages = {}, []
    for word, rest in instructions(path):
        if word == "FROM":
            m = re.match(r"(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?$", rest, re.I)
            stages.append({"from": subst(m.group(1), global_args), "name": m.group(2),
                           "args": {}, "ins": []})
        elif word == "ARG" and not stages:
            k, _, v = rest.partition("=")
            global_args[k] = v
        elif stages:
            stages[-1]["ins"].append((word, rest))
    last = stages[-1]
    args = {}
    st = {"from": last["from"], "env": [], "entrypoint": None, "cmd": None, "user": None,
          "workdir": None, "expose": [], "copies": [], "run": [], "shell": None}
    for word, rest in last["ins"]:
        if word == "ARG":
            k, _, v = rest.partition("=")
            args[k] = v if v else global_args.get(k, "")
        elif word == "ENV":
            for tok in shlex.split(rest):
                k, _, v = tok.partition("=")
                st["env"].append(f"{k}={subst(v, args)}")
        elif word == "ENTRYPOINT":
            st["entrypoint"] = exec_form(rest)
        elif word == "CMD":
            st["cmd"] = exec_form(rest)
        elif word == "USER":
            st["user"] = rest
        elif word == "WORKDIR":
            st["workdir"] = rest
        elif word == "EXPOSE":
            st["expose"] += [p if "/" in p else p + "/tcp" for p in rest.split()]
        elif word == "COPY":
            toks = rest.split()
            frm = next((t.split("=", 1)[1] for t in toks if t.startswith("--from=")), None)
            paths = [t for t in toks if not t.startswith("--")]
            st["copies"].append({"from": frm, "src": paths[:-1], "dest": paths[-1]})
        elif word == "RUN":
            st["run"].append(rest)
        elif word == "SHELL":
            st["shell"] = json.loads(rest)
        else:
            raise SystemExit(f"{path}: final stage: {word} is not understood by hack/images/dockerfile.py")
    pips = [r for r in st["run"] if "pip install" in r]
    if len(pips) > 1:
        raise SystemExit(f"{path}: final stage: {len(pips)} RUNs with pip install, make images runs one")
    if pips:
        missing = [n for n in re.findall(r"\$\{(\w+)\}|\$(\w+)", pips[0]) if (n[0] or n[1]) not in args]
        if missing:
            raise SystemExit(f"{path}: final stage: the pip RUN uses ARGs without a value: {missing}")
        st["pip_run"] = subst(pips[0], args)
    if st["from"] not in BASES:
        raise SystemExit(f"{path}: final stage FROM {st['from']}: make images knows only {sorted(BASES)}")
    st["base"] = BASES[st["from"]]
    return st


def main(argv):
    if len(argv) == 3 and argv[1] == "final-stage":
        json.dump(final_stage(argv[2]), sys.stdout, indent=1)
        print()
    elif len(argv) == 3 and argv[1] == "packages":
        print("\n".join(packages(argv[2])))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
