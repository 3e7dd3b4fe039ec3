#!/usr/bin/env bash
# mmdebstrap --extract-hook of the controller's base layer (hack/images.sh):
# gcr.io/distroless/static-debian12 made from Debian packages. ROOT holds the
# unpacked packages of `controller:` in hack/images/packages.txt and the
# dependencies apt pulled in; this keeps exactly the listed packages' files
# (no shell, no libc, no package manager) and adds what distroless adds.
#
#   distroless.sh ROOT PACKAGE...
set -euo pipefail
r=$1; shift
keep=" $* "
for deb in "$r"/var/cache/apt/archives/*.deb; do
  pkg=$(dpkg-deb -f "$deb" Package)
  case $keep in *" $pkg "*) continue ;; esac
  # A dependency: its files (not its directories) go.
  dpkg-deb --fsys-tarfile "$deb" | tar -t | while IFS= read -r f; do
    f=${f#./}
    [ -n "$f" ] || continue
    if [ -L "$r/$f" ] || [ -f "$r/$f" ]; then rm -f "$r/$f"; fi
  done
done
# Directories left empty by that, deepest first: only in the root's own file
# system (mmdebstrap has the machine's /proc, /sys and /dev mounted in there).
find "$r" -xdev -mindepth 1 -depth -type d -empty \
  ! -path "$r/tmp" ! -path "$r/proc" ! -path "$r/sys" ! -path "$r/dev" ! -path "$r/dev/*" \
  ! -path "$r/var/cache/apt/archives*" -delete
# What distroless adds: users root, nonroot (65532) and nobody; /home/nonroot;
# /tmp; the CA bundle that ca-certificates' maintainer script would make.
mkdir -p "$r/etc/ssl/certs"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$r/etc/passwd"
printf 'root:x:0:\nnobody:x:65534:\ntty:x:5:\nstaff:x:50:\nnonroot:x:65532:\n' >"$r/etc/group"
install -d -m 0700 -o 65532 -g 65532 "$r/home/nonroot"
install -d -m 0700 "$r/root"
install -d -m 1777 "$r/tmp"
cat "$r"/usr/share/ca-certificates/mozilla/*.crt >"$r/etc/ssl/certs/ca-certificates.crt"
