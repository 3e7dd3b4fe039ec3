#!/usr/bin/env bash
# Checks that the Dockerfiles, the package list and the images of `make images`
# agree (a stage of `make test`, before the real-node test uses the images):
#
#  1. agent/, vfio/ and flasher/Dockerfile's final stages install their packages
#     from hack/images/packages.txt (`agent:`, `vfio:`, `flasher:`) and name none;
#     the controller Dockerfile's base is the one `controller:` describes
#  2. hack/images.sh builds the archives (cached: seconds when nothing changed)
#  3. each archive's config equals the Dockerfile's final stage (ENTRYPOINT,
#     CMD, ENV, USER, EXPOSE over the base image's own), the files it copies
#     from its build stages are there, executable and static (but tt-smi, 7)
#  4. the agent and vfio images' dpkg databases hold every listed package,
#     installed, and the binder runs (--help) in the vfio image's root, as
#     does its modprobe; the controller image holds the listed packages'
#     files, the distroless users (nonroot 65532), /tmp, the CA bundle, and
#     no shell
#  5. the check of 1 refuses a Dockerfile that lists packages of its own
#  6. flasher: in its root the real tt-flash and tt-smi answer, at the pinned
#     versions, and a simulated flash reports (hack/images/flasher_check.py)
#  7. agent: /opt/tt-smi/tt-smi is the real tt-smi, the PyInstaller one-file
#     build of agent/Dockerfile's tt-smi stage (hack/images/tt_smi_check.py):
#     in the image's root --version prints the pinned version, --help and -ls
#     (no driver) run; every library it needs is bundled but glibc's; its
#     glibc floor (highest GLIBC_ version of the bootloader and the bundled
#     objects, objdump -p) is not above the documented 2.36. The same check
#     refuses a shell stand-in and a binary whose floor is too high
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log() { printf '[test-images] %s\n' "$*" >&2; }
images=$(mktemp)
trap 'rm -f "$images"' EXIT
bash hack/images.sh >"$images"
python3 - "$images" <<'PY'
import io, json, os, re, subprocess, sys, tarfile, tempfile
sys.path.insert(0, "hack/images")
import dockerfile as df

errors = []
def check(cond, msg):
    if not cond:
        errors.append(msg)

def installs_from_list(path, image):
    """The final stage installs exactly the list's packages, and no others."""
    st = df.final_stage(path)
    runs = [r for r in st["run"] if "apt-get install" in r]
    problems = []
    if len(runs) != 1:
        problems.append(f"{path}: {len(runs)} apt-get install in the final stage, want 1")
    for r in runs:
        if "/tmp/packages.txt" not in r or f"s/^{image}://p" not in r:
            problems.append(f"{path}: the final stage's apt-get install does not read the {image}: line of hack/images/packages.txt")
        after = r.split("--no-install-recommends", 1)[-1].split("&&")[0]
        named = [w for w in after.split() if re.fullmatch(r"[a-z0-9][a-z0-9+.-]+", w) and not w.startswith("-")]
        if named:
            problems.append(f"{path}: the final stage installs packages of its own: {' '.join(named)} (add them to hack/images/packages.txt)")
    if not any(c["from"] is None and c["src"] == ["hack/images/packages.txt"] for c in st["copies"]):
        problems.append(f"{path}: the final stage does not COPY hack/images/packages.txt")
    return problems

# 1
errors += installs_from_list("agent/Dockerfile", "agent")
errors += installs_from_list("vfio/Dockerfile", "vfio")
errors += installs_from_list("flasher/Dockerfile", "flasher")
ctl = df.final_stage("Dockerfile")
check(ctl["base"]["variant"] == "extract" and ctl["from"].startswith("gcr.io/distroless/static-debian12"),
      f"Dockerfile: base {ctl['from']} is not the distroless image hack/images/packages.txt's controller: line describes")
check(not ctl["run"], "Dockerfile: the final stage runs commands make images does not")

# 5: a Dockerfile with packages of its own is refused
text = open("agent/Dockerfile").read()
bad = text.replace("--no-install-recommends \\\n && rm", "--no-install-recommends curl \\\n && rm")
check(bad != text, "self-check: could not make a diverging Dockerfile")
with tempfile.NamedTemporaryFile("w", suffix=".Dockerfile", delete=False) as f:
    f.write(bad)
check(installs_from_list(f.name, "agent"), "self-check: a Dockerfile installing curl itself was not refused")
os.unlink(f.name)

# 2-4
built = {l.split()[0]: l.split()[1:] for l in open(sys.argv[1]) if l.strip()}
def layers(archive):
    t = tarfile.open(archive)
    manifest = json.load(t.extractfile("manifest.json"))[0]
    cfg = json.load(t.extractfile(manifest["Config"]))
    files = {}
    for name in manifest["Layers"]:
        lt = tarfile.open(fileobj=t.extractfile(name))
        for m in lt.getmembers():
            files[os.path.normpath(m.name).lstrip("./") if m.name not in (".", "./") else ""] = (lt, m)
    return manifest, cfg, files

def read(files, path):
    lt, m = files[path]
    return lt.extractfile(m).read()

def run_in_root(files, *cmd):
    """cmd's output, run chrooted into the image's files (device nodes left out)."""
    with tempfile.TemporaryDirectory() as d:
        for lt, m in files.values():
            if not m.isdev():
                lt.extract(m, d, filter="tar")
        userns = [] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user"]
        r = subprocess.run(userns + ["chroot", d, *cmd], capture_output=True, text=True)
        return r.stdout + r.stderr

TOOLS = {"agent": ("usr/bin/git", "usr/bin/make", "usr/bin/gcc", "usr/bin/kmod", "opt/tt-smi/tt-smi"),
         "vfio": ("usr/bin/kmod", "usr/sbin/modprobe"),
         "flasher": ("usr/bin/curl", "usr/bin/lspci", "usr/local/bin/tt-flash", "usr/local/bin/tt-smi", "opt/tt/bin/python3")}
for image, dockerfile in (("controller", "Dockerfile"), ("agent", "agent/Dockerfile"), ("vfio", "vfio/Dockerfile"),
                          ("flasher", "flasher/Dockerfile")):
    ref, archive = built[image]
    st = df.final_stage(dockerfile)
    manifest, cfg, files = layers(archive)
    c = cfg["config"]
    check(manifest["RepoTags"] == [ref], f"{image}: RepoTags {manifest['RepoTags']}")
    check(c.get("Entrypoint") == st["entrypoint"], f"{image}: Entrypoint {c.get('Entrypoint')} != {st['entrypoint']}")
    check(c.get("Cmd") == st["cmd"], f"{image}: Cmd {c.get('Cmd')} != {st['cmd']}")
    for e in st["env"]:
        check(e in c.get("Env", []), f"{image}: ENV {e} missing from the image config")
    check(c.get("User", "") == (st["user"] or st["base"]["user"]), f"{image}: User {c.get('User')!r}")
    check(sorted(c.get("ExposedPorts", {})) == sorted(st["expose"]), f"{image}: ExposedPorts {c.get('ExposedPorts')}")
    labels = c.get("Labels") or {}
    for k in ("title", "description", "version", "revision", "created", "source", "licenses", "vendor"):
        check(labels.get(f"org.opencontainers.image.{k}"), f"{image}: OCI label org.opencontainers.image.{k} missing")
    for cp in st["copies"]:
        if cp["from"] is None:
            continue
        dest = cp["dest"].lstrip("/")
        check(dest in files, f"{image}: {cp['dest']} (COPY --from={cp['from']}) missing")
        if dest in files:
            m = files[dest][1]
            check(m.mode & 0o111, f"{image}: {cp['dest']} not executable")
            data = read(files, dest)
            # (tt-smi is a PyInstaller build on the host's glibc: checked in 7)
            if data[:4] == b"\x7fELF" and cp["from"] != "tt-smi":
                check(b"/lib64/ld-linux" not in data[:4096] and b"ld-musl" not in data[:4096], f"{image}: {cp['dest']} is dynamically linked")
    want = df.packages(image)
    if image in TOOLS:
        status = read(files, "var/lib/dpkg/status").decode()
        installed = set(re.findall(r"(?m)^Package: (\S+)\nStatus: install ok installed", status))
        missing = [p for p in want if p not in installed]
        check(not missing, f"{image}: listed packages not installed in the image: {missing}")
        for tool in TOOLS[image]:
            check(tool in files, f"{image}: {tool} missing")
        if image == "vfio":
            out = run_in_root(files, st["entrypoint"][0], "--help")
            check("--hotplug-stub-driver" in out and "--restore-on-exit" in out, f"vfio: --help in the image: {out[-300:]}")
            out = run_in_root(files, "/usr/sbin/modprobe", "--version")
            check("kmod version" in out, f"vfio: modprobe --version in the image: {out[-300:]}")
        if image == "flasher":
            import flasher_check
            errors += flasher_check.check(files, st)
        if image == "agent":
            import tt_smi_check
            errs, summary = tt_smi_check.check(files, st)
            errors += errs
            print(f"[test-images] agent: {summary}", file=sys.stderr)
            # 7: the check can fail: a stand-in script, and a floor below the binary's
            with tempfile.TemporaryDirectory() as d:
                fake = os.path.join(d, "tt-smi")
                open(fake, "w").write('#!/bin/sh\necho "tt-smi 6.8.0 (stand-in)"\n')
                check(tt_smi_check.binary_problems(fake)[0], "self-check: a stand-in tt-smi script was not refused")
                real = os.path.join(d, "real")
                open(real, "wb").write(read(files, tt_smi_check.PATH))
                floor = tt_smi_check.GLIBC_FLOOR
                tt_smi_check.GLIBC_FLOOR = (2, 17)
                check(any("above the documented floor" in p for p in tt_smi_check.binary_problems(real)[0]),
                      "self-check: a tt-smi needing more than GLIBC_2.17 passed a floor of 2.17")
                tt_smi_check.GLIBC_FLOOR = floor
    else:
        passwd = read(files, "etc/passwd").decode()
        check("nonroot:x:65532:65532:" in passwd, "controller: no nonroot (65532) in /etc/passwd")
        check(len(read(files, "etc/ssl/certs/ca-certificates.crt")) > 100000, "controller: CA bundle missing or short")
        check("tmp" in files and files["tmp"][1].mode & 0o1777 == 0o1777, "controller: /tmp is not 1777")
        check("etc/services" in files, "controller: netbase's /etc/services missing")
        check("usr/share/zoneinfo/UTC" in files or "usr/share/zoneinfo/Etc/UTC" in files, "controller: tzdata missing")
        check("usr/lib/os-release" in files, "controller: base-files' os-release missing")
        for sh in ("bin/sh", "usr/bin/sh", "bin/bash", "usr/bin/bash", "usr/bin/dash", "bin/dash"):
            check(sh not in files, f"controller: a shell in the image: /{sh}")
    print(f"[test-images] {image}: {ref} agrees with {dockerfile} and hack/images/packages.txt "
          f"({len(want)} packages, {len(files)} paths)", file=sys.stderr)

if errors:
    print("\n".join("  " + e for e in errors), file=sys.stderr)
    print("test-images: 0 passed, 1 failed")
    sys.exit(1)
print("test-images: 1 passed, 0 failed")
PY
