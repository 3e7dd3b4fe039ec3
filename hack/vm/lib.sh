# Shared by the VM's scenario scripts (hack/vm/init, hack/vm/init-cards),
# sourced as /lib/vm.sh: mounts, the agent's environment, and the helpers
# that print "VMTEST PASS/FAIL" lines.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
export PATH=/usr/local/bin:/bin:/sbin
export TT_KMD_SOURCE_REPOSITORY=/opt/tt-kmd.git
export TT_SMI_VERSION=0.0.0-test
export TTDRV_UNLOAD_TIMEOUT_SECONDS=20
export RUST_LOG=info
failed=0
n=0
pass() { echo "VMTEST PASS: $*"; }
fail() { echo "VMTEST FAIL: $*"; failed=$((failed+1)); }
# agent LOGNAME ARGS...: runs the agent, keeps its log, prints its summary
agent() {
    name="$1"; shift
    # No Kubernetes in this VM: nobody can give the go-ahead, so runs that
    # replace a loaded module use the by-hand switch (refused under NODE_NAME).
    if [ "$1" = run ]; then shift; set -- run --swap-without-go-ahead "$@"; fi
    n=$((n+1))
    ttdrv-agent "$@" >"/tmp/$name.log" 2>&1
    rc=$?
    grep 'summary:' "/tmp/$name.log" | sed "s/^/[$name rc=$rc] /"
    return $rc
}
show() { echo "----- /tmp/$1.log"; cat "/tmp/$1.log"; echo "-----"; }
loaded() { cat /sys/module/tenstorrent/version 2>/dev/null || echo none; }
refcnt() { cat /sys/module/tenstorrent/refcnt 2>/dev/null || echo none; }
