#!/usr/bin/env bash
# Kernel-level test of the node agent, in two modes:
#   hack/test-vm.sh        the stub module, the scenarios below (hack/vm/init)
#   hack/test-vm.sh real   the real tt-kmd on emulated Wormhole and Blackhole
#                          cards (testkit's ttdrv-ttcard on QEMU's
#                          x-pci-proxy-dev), the scenarios of hack/vm/init-cards
#                          (docs/development.md#the-real-driver-on-emulated-cards)
#
# Stub mode: boots Debian's kernel (linux-image-amd64)
# under qemu-system-x86_64 with software emulation (TCG) into an initramfs that
# holds a statically linked ttdrv-agent, the stub `tenstorrent` module built on
# this machine for that kernel (2.7.0, 2.8.0, and a broken 2.9.0), a PCI
# driver that binds the guest's one emulated Wormhole (testkit's
# ttdrv-ttcard, as in real mode) as tt-kmd would, and a script
# that runs these scenarios against the real kernel, each printing
# "VMTEST PASS: ..." or "VMTEST FAIL: ...":
#
#   1. fresh load of 2.7.0 from a source build (cache miss)
#   2. `ready` passes for 2.7.0 (and not for 2.8.0)
#   3. upgrade to 2.8.0: unload + build + load; `ready` passes for 2.8.0
#   4. a process holding /dev/tenstorrent/0 pins the module (refcnt 1); the
#      agent refuses to downgrade and names that PID; the module stays
#   5. with --force-unload the holder is SIGKILLed and 2.7.0 is loaded, from
#      the cache (its second load)
#   6. back to 2.8.0, again from the cache
#   7. a broken release (2.9.0, whose init fails) does not load; the agent
#      puts 2.8.0 back from the cache and fails naming both
#   7b. a release that loads but probes no card (2.9.1) fails validation
#      (the card 2.8.0 served is gone); the agent rolls back to 2.8.0 from
#      the cache, the card is served again, and it fails with
#      ValidationFailed; the log's rollback_ms is printed
#   8. without the go-ahead a loaded module stays, even with nothing holding it
#   9. a poisoned cache: the 2.7.0 entry replaced by a module whose vermagic
#      names another kernel (with a record that matches its hash) is evicted
#      before any load, rebuilt and loaded
#  10. a process that mapped /dev/tenstorrent/0 and closed its fd pins the
#      module; the agent names it from /proc/<pid>/maps and refuses
#  11. --force-unload kills that mapping holder too
#  12. module signing (--signing-key/--signing-cert): the unsigned cached
#      2.7.0 is not served but rebuilt and signed, and the signed module
#      loads where signatures are not enforced (its key is unknown to the
#      kernel); back to the unsigned 2.8.0 from the cache
#  13. with module.sig_enforce turned on, the unsigned module is refused
#      before anything is unloaded
#  14. with sig_enforce on, a module signed with a key the kernel does not
#      trust is refused before anything is unloaded: the agent offers it to
#      the kernel while 2.8.0 is loaded (EKEYREJECTED, not EEXIST)
# and, after 2, the interface the stub models on tt-kmd's: the tenstorrent
# class device with tt_asic_id under a parent with device 0x401e, tt-kmd's
# parameters, and its dependency (crc7) loaded by the agent first; then the
# VFIO binder (ttdrv-vfio-manage --once, also static) on a real emulated PCI
# function (QEMU's pci-serial, on the kernel's built-in 8250_pci driver):
#  15. it loads vfio-pci (modprobe) and binds the function: its driver is
#      vfio-pci and /dev/vfio/<group> appears
#  16. a second run with --restore-on-exit finds it recorded in the state
#      file and puts it back on its driver, driver_override cleared
# The machine is q35 with QEMU's emulated IOMMU (intel-iommu, intel_iommu=on):
# Debian's kernel has no vfio no-IOMMU mode (CONFIG_VFIO_NOIOMMU is not set),
# so the no-IOMMU paths are covered by the binder's unit tests only.
#
# Inside the VM there is no compiler: `git` and `make` are small shims that
# serve the trees and modules built here by the real `git clone` and
# `make -C /lib/modules/<kver>/build M=... modules`, so the agent's own
# clone/build/cache code path runs unchanged. The build itself is covered
# for real by `cargo test -p ttdrv-agent` (tests/real_build.rs). So is the
# signing: the VM's `scripts/sign-file` is a shim serving the module signed
# here by the headers' real sign-file with the same key pair.
#
# Needs: hack/agent-deps.sh --vm (qemu-system-x86, linux-image-amd64,
# linux-headers-amd64, busybox-static, cpio, musl-tools, git, make, gcc, kmod)
# and the Rust target x86_64-unknown-linux-musl (rustup target add); `real`
# also the agent image's tt-smi (hack/images/tt-smi.sh: mmdebstrap, root and
# the pip index, or its cache from `make images`).
#
# Env: VM_TIMEOUT (seconds, default 600), VM_ACCEL (default tcg),
#      VM_AGENT_LIBC=glibc to link the agent statically against glibc instead
#      of musl (also the automatic fallback when the musl target is missing),
#      CARGO_TARGET_DIR (default <repo>/target), KEEP_VM_WORKDIR=1 to keep files.
# Exits non-zero on any failure and prints how long the VM run took.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
timeout_s="${VM_TIMEOUT:-600}"
accel="${VM_ACCEL:-tcg}"
target_dir="${CARGO_TARGET_DIR:-$repo/target}"
hint="run hack/agent-deps.sh --vm"

die() { echo "test-vm: FAIL: $*" >&2; exit 1; }
say() { echo "test-vm: $*"; }

# No NEEDED entries in the dynamic section: nothing to load from the initramfs.
is_static() { ! readelf -d "$1" 2>/dev/null | grep -q '(NEEDED)'; }

for tool in qemu-system-x86_64 cpio gzip git make modinfo readelf openssl; do
    command -v "$tool" >/dev/null || die "$tool not found: $hint"
done
busybox=""
for b in /bin/busybox /usr/bin/busybox; do
    if [[ -x $b ]] && is_static "$b"; then busybox=$b; break; fi
done
[[ -n $busybox ]] || die "no statically linked busybox: $hint (busybox-static)"

# The newest kernel that has both an image and headers installed.
kver=""
for k in $(ls /boot 2>/dev/null | sed -n 's/^vmlinuz-//p' | sort -V); do
    if [[ -f /lib/modules/$k/build/Makefile ]]; then kver=$k; fi
done
[[ -n $kver ]] || die "no kernel with both /boot/vmlinuz-<kver> and /lib/modules/<kver>/build: $hint (linux-image-amd64, linux-headers-amd64)"
kernel_img="/boot/vmlinuz-$kver"
[[ -r $kernel_img ]] || die "$kernel_img is not readable"
say "kernel $kver"

work="$(mktemp -d /tmp/ttdrv-vm.XXXXXX)"
cleanup() { if [[ -z ${KEEP_VM_WORKDIR:-} ]]; then rm -rf "$work"; else say "kept $work"; fi; }
trap cleanup EXIT

# --- the agent, statically linked -------------------------------------------
musl=x86_64-unknown-linux-musl
if [[ ${VM_AGENT_LIBC:-musl} == musl ]] && ! rustup target list --installed 2>/dev/null | grep -qx "$musl"; then
    say "adding Rust target $musl"
    rustup target add "$musl" >/dev/null 2>&1 || true
fi
t0=$(date +%s)
if [[ ${VM_AGENT_LIBC:-musl} == musl ]] && rustup target list --installed 2>/dev/null | grep -qx "$musl"; then
    say "building ttdrv-agent for $musl"
    CARGO_TARGET_DIR="$target_dir" cargo build -q -p ttdrv-agent --bin ttdrv-agent -p ttdrv-vfio --bin ttdrv-vfio-manage --target "$musl"
    agent_bin="$target_dir/$musl/debug/ttdrv-agent"
else
    say "building ttdrv-agent statically linked against glibc (+crt-static; VM_AGENT_LIBC=${VM_AGENT_LIBC:-musl}, musl target unavailable or not wanted)"
    gnu=x86_64-unknown-linux-gnu
    CARGO_TARGET_DIR="$target_dir" RUSTFLAGS="-C target-feature=+crt-static" \
        cargo build -q -p ttdrv-agent --bin ttdrv-agent -p ttdrv-vfio --bin ttdrv-vfio-manage --target "$gnu"
    agent_bin="$target_dir/$gnu/debug/ttdrv-agent"
fi
vfio_bin="$(dirname "$agent_bin")/ttdrv-vfio-manage"
say "building ttdrv-ttcard (the emulated cards, run on this machine)"
CARGO_TARGET_DIR="$target_dir" cargo build -q -p ttdrv-testkit --bin ttdrv-ttcard
ttcard_bin="$target_dir/debug/ttdrv-ttcard"
is_static "$agent_bin" || die "$agent_bin is dynamically linked"
is_static "$vfio_bin" || die "$vfio_bin is dynamically linked"
say "agent built in $(( $(date +%s) - t0 ))s"

# --- the module at each version, built for the VM's kernel -----------------
# `hack/test-vm.sh` (stub): the stub module (tests/fixtures/stub-module) and
# the scenarios of hack/vm/init. `hack/test-vm.sh real`: the real tt-kmd at
# the releases of hack/versions.env (TTKMD_TEST_VERSIONS, older first), each
# from the commit chart/values.yaml pins it to (checked against the tag),
# plus a release derived from the newer one that knows neither card
# (TTKMD_BROKEN_VERSION: its ID table changed, nothing else), on emulated
# cards (ttdrv-ttcard) with the scenarios of hack/vm/init-cards. The real
# driver's source: TTDRV_TTKMD_SOURCE (a path or URL), else the bundle in
# ../shared/data beside the repository (CI has no network), else
# github.com/tenstorrent/tt-kmd.
t0=$(date +%s)
root="$work/root"
mkdir -p "$root"/{bin,sbin,proc,sys,dev,tmp,run,etc,lib,opt/prebuilt,opt/tt-smi,usr/local/bin,var/cache,lib/modules/"$kver"/build}
mode="${1:-stub}"
case $mode in
stub)
    kmd_repo="$work/tt-kmd.git"
    "$repo/tests/fixtures/stub-module/make-repo.sh" "$kmd_repo" 2.7.0 2.8.0 2.9.0:fail-init 2.9.1:probe-none
    versions=(2.7.0 2.8.0 2.9.0 2.9.1)
    init_script="$repo/hack/vm/init"
    expected=21
    what="stub module"
    ;;
real)
    # shellcheck source=versions.env
    . "$repo/hack/versions.env"
    source_repo="${TTDRV_TTKMD_SOURCE:-}"
    if [[ -z $source_repo ]]; then
        # shellcheck source=shared-data.sh
        source "$repo/hack/shared-data.sh"
        source_repo=$(shared_data "$repo" tt-kmd.bundle)
        [[ -n $source_repo ]] || source_repo=https://github.com/tenstorrent/tt-kmd.git
    fi
    kmd_repo="$work/tt-kmd.git"
    say "real tt-kmd from $source_repo"
    git clone -q --bare "$source_repo" "$kmd_repo" 2>/dev/null || die "cloning tt-kmd from $source_repo (set TTDRV_TTKMD_SOURCE to a clone or URL)"
    versions=(); : >"$work/pins"
    for v in $TTKMD_TEST_VERSIONS; do
        # The chart's pin: what a cluster builds for this version.
        c=$(sed -n "s/^    \"${v//./\\.}\": \([0-9a-f]\{40\}\)\$/\1/p" "$repo/chart/values.yaml")
        [[ -n $c ]] || die "chart/values.yaml pins no commit for $v (driver.sourceCommits)"
        got=$(git -C "$kmd_repo" rev-parse "ttkmd-$v^{commit}" 2>/dev/null) || die "tag ttkmd-$v not in $source_repo"
        [[ $got == "$c" ]] || die "tag ttkmd-$v names $got in $source_repo, the chart pins $c (driver.sourceCommits)"
        versions+=("$v"); echo "$v $c" >>"$work/pins"
    done
    # The release that knows neither card: the newer one, its device IDs
    # changed (so the module loads and probes nothing), committed and tagged.
    newer=${versions[-1]}; broken=$TTKMD_BROKEN_VERSION
    b="$work/broken-src"
    git -c advice.detachedHead=false clone -q --branch "ttkmd-$newer" "$kmd_repo" "$b"
    sed -i 's/^\(#define PCI_DEVICE_ID_WORMHOLE\s*\)0x401E/\10x401F/; s/^\(#define PCI_DEVICE_ID_BLACKHOLE\s*\)0xB140/\10xB14F/' "$b/enumerate.h"
    sed -i "s/^#define TENSTORRENT_DRIVER_VERSION_PATCH .*/#define TENSTORRENT_DRIVER_VERSION_PATCH ${broken##*.}/" "$b/module.h"
    [[ $(git -C "$b" diff --stat | tail -n1) == *"2 files changed"* ]] || die "deriving $broken from $newer changed nothing (enumerate.h or module.h moved?)"
    git -C "$b" -c user.name=test -c user.email=test@localhost commit -qam "test: $broken, a release that knows neither card"
    git -C "$b" tag "ttkmd-$broken"
    git -C "$b" push -q "$kmd_repo" "ttkmd-$broken"
    versions+=("$broken"); echo "$broken $(git -C "$b" rev-parse HEAD)" >>"$work/pins"
    init_script="$repo/hack/vm/init-cards"
    expected=15
    what="real tt-kmd"
    ;;
*) die "usage: hack/test-vm.sh [stub|real]" ;;
esac
# TTDRV_VM_MEASURE=1: each build (the agent's own commands) measured from a
# dropped page cache in a memory cgroup (v1): its peak charge, the largest
# process's RSS; for docs/benchmarks.md and the installer pod's limits.
cg=/sys/fs/cgroup/memory/ttdrv-test-vm-$$
for v in "${versions[@]}"; do
    src="$work/src-$v"
    timer=()
    if [[ ${TTDRV_VM_MEASURE:-0} == 1 ]]; then
        command -v /usr/bin/time >/dev/null || die "TTDRV_VM_MEASURE=1 needs GNU time (apt-get install time)"
        timer=(/usr/bin/time -f %M -o "$work/rss-$v")
        [[ -d /sys/fs/cgroup/memory ]] && mkdir -p "$cg"; sync; echo 3 >/proc/sys/vm/drop_caches
    fi
    tb=$(date +%s.%N)
    ( [[ -d $cg ]] && echo "$BASHPID" >"$cg/tasks"
      git -c advice.detachedHead=false clone -q --depth 1 --branch "ttkmd-$v" -- "file://$(cd "$kmd_repo" && pwd)" "$src" &&
      "${timer[@]}" make -s -j2 -C "/lib/modules/$kver/build" M="$src" modules >"$work/make-$v.log" 2>&1 ) \
        || { cat "$work/make-$v.log"; die "building the $what $v for $kver failed"; }
    got="$(modinfo -F version "$src/tenstorrent.ko")"
    [[ $got == "$v" ]] || die "$what for $v reports version '$got'"
    mem=""
    [[ -d $cg ]] && { mem=", peak cgroup charge $(( $(cat "$cg/memory.max_usage_in_bytes") >> 20 )) MiB, largest RSS $(( $(cat "$work/rss-$v") >> 10 )) MiB"; rmdir "$cg"; }
    say "$what $v: clone and make -j2 in $(awk -v a="$tb" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')s$mem, tenstorrent.ko $(( $(stat -c %s "$src/tenstorrent.ko") >> 10 )) KiB, depends '$(modinfo -F depends "$src/tenstorrent.ko")'"
    dest="$root/opt/prebuilt/ttkmd-$v"
    mkdir -p "$dest"
    (cd "$src" && tar --exclude=./.git -cf - .) | tar -xf - -C "$dest"
    git -C "$src" rev-parse HEAD >"$dest/.commit"
    mv "$dest/tenstorrent.ko" "$dest/.prebuilt.ko"
done
echo "${versions[*]}" >"$root/opt/versions"
[[ $mode == real ]] && cp "$work/pins" "$root/opt/pins"
say "$what ${versions[*]} built for $kver in $(( $(date +%s) - t0 ))s"

# The module the stub depends on (crc7, as tt-kmd on hwmon where
# CONFIG_HWMON=m), in a modules tree of its own for the agent to find, and
# vfio-pci with its dependencies for the binder's modprobe.
mods="$root/lib/modules/$kver"
cp /lib/modules/"$kver"/modules.{order,builtin,builtin.modinfo} "$mods/"
modprobe -S "$kver" --show-depends -a crc7 vfio-pci | awk '$1 == "insmod" {print $2}' | while read -r f; do
    mkdir -p "$root$(dirname "$f")" && cp "$f" "$root$f"
done
depmod -b "$root" "$kver"
grep -q 'crc7' "$mods/modules.dep" || die "crc7 is not in the VM's modules.dep"

# A holder that only maps the device (tests/fixtures/map-hold), static.
gcc -static -O2 -o "$root/usr/local/bin/map-hold" "$repo/tests/fixtures/map-hold/map-hold.c" \
    || die "building map-hold (gcc -static; libc6-dev)"
is_static "$root/usr/local/bin/map-hold" || die "map-hold is dynamically linked"

if [[ $mode == stub ]]; then
# The poisoned 2.7.0: its vermagic's kernel release changed (same length, so
# the ELF stays whole), and a record that matches its hash, as if an attacker
# or a stale host left it; only the vermagic check can catch it.
poison="$root/opt/poisoned"
mkdir -p "$poison"
fake_kver="$(printf '%s' "$kver" | sed 's/.$/X/')"
KVER="$kver" FAKE="$fake_kver" perl -0777 -pe 's/vermagic=\Q$ENV{KVER}\E/vermagic=$ENV{FAKE}/' \
    "$root/opt/prebuilt/ttkmd-2.7.0/.prebuilt.ko" >"$poison/tenstorrent.ko"
poison_vermagic="$(modinfo -F vermagic "$poison/tenstorrent.ko" | sed 's/ *$//')"
[[ $poison_vermagic == "$fake_kver "* ]] || die "poisoning the vermagic failed: '$poison_vermagic'"
printf '{"version":"2.7.0","kernelRelease":"%s","vermagic":"%s","sha256":"%s","size":%s}\n' \
    "$kver" "$poison_vermagic" "$(sha256sum "$poison/tenstorrent.ko" | cut -d' ' -f1)" \
    "$(stat -c %s "$poison/tenstorrent.ko")" >"$poison/tenstorrent.ko.json"
poison_sha="$(sha256sum "$poison/tenstorrent.ko" | cut -d' ' -f1)"

# The key pair of the signing scenarios, and each module signed with it by
# the real sign-file of the kernel's headers, for the VM's sign-file shim.
sign_file="/lib/modules/$kver/build/scripts/sign-file"
[[ -x $sign_file ]] || die "$sign_file not found: $hint (linux-headers-amd64)"
mkdir -p "$root/opt/signing" "$root/lib/modules/$kver/build/scripts"
openssl req -new -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=ttdrv test-vm signing" \
    -addext extendedKeyUsage=codeSigning -keyout "$root/opt/signing/tls.key" \
    -outform DER -out "$root/opt/signing/tls.crt" 2>/dev/null || die "making the signing key pair (openssl)"
for v in "${versions[@]}"; do
    d="$root/opt/prebuilt/ttkmd-$v"
    cp "$d/.prebuilt.ko" "$d/.prebuilt.signed.ko"
    "$sign_file" sha256 "$root/opt/signing/tls.key" "$root/opt/signing/tls.crt" "$d/.prebuilt.signed.ko" \
        || die "signing the stub $v with $sign_file"
    [[ $(modinfo -F sig_id "$d/.prebuilt.signed.ko") == "PKCS#7" ]] || die "the stub $v is not signed"
done
install -m 0755 "$repo/hack/vm/sign-file" "$root/lib/modules/$kver/build/scripts/sign-file"
fi

# --- initramfs ---------------------------------------------------------------
cp "$busybox" "$root/bin/busybox"
cp "$agent_bin" "$root/bin/ttdrv-agent"
cp "$vfio_bin" "$root/bin/ttdrv-vfio-manage"
strip "$root/bin/ttdrv-agent" "$root/bin/ttdrv-vfio-manage" 2>/dev/null || true
if [[ $mode == real ]]; then
    # The agent image's tt-smi (the PyInstaller one-file build of
    # agent/Dockerfile's tt-smi stage, hack/images/tt-smi.sh, cached) where
    # the agent finds it bundled: the agent installs it as the host's
    # /usr/local/bin/tt-smi. What it needs from a host: glibc (this machine's,
    # bookworm's 2.36) and zlib; /tmp (tmpfs) to unpack into.
    tt_smi=$(bash "$repo/hack/images/tt-smi.sh") || die "building tt-smi (hack/images/tt-smi.sh)"
    install -m 0755 "$tt_smi" "$root/opt/tt-smi/tt-smi"
    python3 "$repo/hack/images/stage.py" build-stage "$repo/agent/Dockerfile" tt-smi \
        | python3 -c 'import json,re,sys; print(re.findall(r"tt-smi==([0-9][^\"'"'"' ]*)", " ".join(json.load(sys.stdin)["run"]))[0])' \
        >"$root/opt/tt-smi.version" || die "reading the tt-smi pin of agent/Dockerfile"
    mkdir -p "$root/lib64" "$root/lib/x86_64-linux-gnu"
    cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"
    for l in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libutil.so.1 libz.so.1; do
        cp -L "/lib/x86_64-linux-gnu/$l" "$root/lib/x86_64-linux-gnu/" || die "copying $l for tt-smi into the guest"
    done
else
    printf '#!/bin/sh\necho "tt-smi (test stub)"\n' >"$root/opt/tt-smi/tt-smi"
    chmod 0755 "$root/opt/tt-smi/tt-smi"
fi
# An (empty) header directory: the shimmed make only checks it exists.
echo "# headers stand-in for the VM test" >"$root/lib/modules/$kver/build/Makefile"

# The shims and the scenarios the guest runs: files of hack/vm/ (busybox sh).
install -m 0755 "$repo/hack/vm/git" "$repo/hack/vm/make" "$root/usr/local/bin/"

install -m 0755 "$init_script" "$root/init"
install -m 0644 "$repo/hack/vm/lib.sh" "$root/lib/vm.sh"
sed -i "s/@POISON_SHA@/${poison_sha:-none}/g" "$root/init"
chmod 0755 "$root/init"

(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$work/initramfs.gz"
say "initramfs $(du -h "$work/initramfs.gz" | cut -f1)"

# --- boot ----------------------------------------------------------------------
log="$work/console.log"
say "booting $kernel_img under qemu (accel=$accel, timeout ${timeout_s}s)"
start=$(date +%s.%N)
set +e
if [[ $mode == real ]]; then
    # Two Wormholes and a Blackhole answered by ttdrv-ttcard over
    # x-pci-proxy-dev. The proxy needs the guest's RAM in a memfd; every BAR
    # is 32-bit and must fit SeaBIOS's ~1 GiB window, hence the Wormholes'
    # BAR0 shrunk to 64 MiB (tt-kmd maps only BAR2 and BAR4 of a Wormhole).
    # -cpu max: tt-smi's tt-umd is built with AVX (VEX instructions in its
    # static initialisers); under TCG's default qemu64 it dies of SIGILL.
    machine=(-cpu max -machine q35,memory-backend=ram -object memory-backend-memfd,id=ram,size=1G,share=on
             -device intel-iommu,intremap=off -device @TTCARD@ -device @TTCARD@ -device @TTCARD@)
    wrap=("$ttcard_bin" --cards wh,wh,bh --wh-bar0-mb 64 --log "$work/cards.log" --)
    # modprobe would apply it; so must the agent's loads (init-cards C1).
    cmdline_extra=" tenstorrent.max_devices=8"
else
    # One emulated Wormhole, which the stub binds as its PCI driver; and
    # QEMU's pci-serial for the VFIO binder (15-16).
    machine=(-machine q35,memory-backend=ram -object memory-backend-memfd,id=ram,size=1G,share=on
             -device intel-iommu,intremap=off -device pci-serial -device @TTCARD@)
    wrap=("$ttcard_bin" --cards wh --wh-bar0-mb 64 --log "$work/cards.log" --)
fi
boot_vm() {
    timeout "$timeout_s" "${wrap[@]}" qemu-system-x86_64 \
        -accel "$accel" -smp 1 "${machine[@]}" \
        -kernel "$kernel_img" -initrd "$work/initramfs.gz" \
        -append "console=ttyS0 rdinit=/init panic=-1 quiet loglevel=3 intel_iommu=on${cmdline_extra:-}" \
        -nographic -no-reboot -monitor none -serial stdio -nodefaults \
        </dev/null >"$log" 2>&1
}
boot_vm
qrc=$?
# QEMU itself killed by a signal (its experimental x-pci-proxy-dev has
# segfaulted during SeaBIOS's PCI scan) before the guest's init said
# anything: that run tested nothing of ours. Shown, then booted once more.
if [[ $qrc -gt 128 && $qrc -ne 137 ]] && ! grep -q 'VMTEST' "$log"; then
    tr -d '\r' <"$log" | grep -v '^\s*$' | sed 's/^/vm (crashed)| /'
    say "QEMU died of signal $((qrc - 128)) before the guest's init ran; booting once more"
    rm -f "$work/cards.log"
    boot_vm
    qrc=$?
fi
set -e
end=$(date +%s.%N)
elapsed=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')

tr -d '\r' <"$log" | sed 's/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g' | grep -v '^\s*$' | sed 's/^/vm| /'
[[ -f $work/cards.log ]] && sed 's/^/cards| /' "$work/cards.log"
say "VM run took ${elapsed}s (qemu exit $qrc)"

passes=$(tr -d '\r' <"$log" | grep -c '^VMTEST PASS' || true)
fails=$(tr -d '\r' <"$log" | grep -c '^VMTEST FAIL' || true)
if [[ $qrc -eq 124 ]]; then die "VM timed out after ${timeout_s}s"; fi
if ! tr -d '\r' <"$log" | grep -q '^VMTEST DONE failed=0'; then
    die "VM scenarios failed ($passes passed, $fails failed)"
fi
if [[ $passes -ne $expected || $fails -ne 0 ]]; then
    die "expected $expected VMTEST PASS lines and no FAIL, got $passes passed, $fails failed"
fi
echo "test-vm: $passes passed, 0 failed"
