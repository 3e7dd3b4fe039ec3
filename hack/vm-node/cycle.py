#!/usr/bin/env python3
"""One rollout cycle of the VM-node test (hack/test-vm-node.sh), read back
from its two records: the timeline (host clock; one line per change of the
Node, the policy's node record and the installer pod, each line one API
snapshot) and the guest console (the installer pods' log lines, each with
the agent's own timestamp, guest clock).

  cycle.py loader TIMELINE T0 VERSION    < console
      the installer pod whose agent loaded VERSION after T0
  cycle.py check TIMELINE T0 VERSION MODE < console
      MODE ahead: the cordon window holds no build (build-ahead): the node
        carried kmd-prepared=VERSION from its cordon to the go-ahead, the pod that loaded VERSION
        existed before the cordon and no pod was created inside the window,
        and that pod's log is: [cache miss, build] or cache hit, then waiting
        for the go-ahead, then the go-ahead, unload, load, with no build after
        it began to wait.
      MODE inside: prepare off, the build falls inside the window: the pod
        that loaded VERSION was created after the cordon and built VERSION.
      Prints the figures (one line, key=value); exits 1 with the reason when
      an assertion fails.

The assertions are structural (the order of API snapshots, the order of one
agent's log lines), never a comparison of durations; the figures printed
beside them mix the host and guest clocks and are only reported.
"""
import datetime
import re
import sys

AGENT = re.compile(r"^VMNODE \S+ agent (\S+) (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z\s+(.*)$")


def timeline(path, t0):
    out = []
    for line in open(path):
        parts = line.split()
        if not parts or float(parts[0]) < t0:
            continue
        kv = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        kv["t"] = float(parts[0])
        kv["installer"] = set(filter(None, kv.get("installer", "").split(",")))
        out.append(kv)
    return out


def agent_lines(t0):
    """(pod name, agent time, text) of every agent line at or after T0."""
    out = []
    for line in sys.stdin:
        m = AGENT.match(line.rstrip("\n"))
        if not m:
            continue
        t = datetime.datetime.fromisoformat(m.group(2)[:26]).replace(tzinfo=datetime.timezone.utc).timestamp()
        if t < t0:
            continue
        # /var/log/pods/<namespace>_<pod>_<uid>
        parts = m.group(1).split("_")
        pod = parts[1] if len(parts) >= 3 else m.group(1)
        out.append((pod, t, m.group(3)))
    return out


def loader(lines, version):
    """The pod whose agent logged the installed summary of VERSION."""
    for pod, _, text in lines:
        if "summary: result=installed version=%s " % version in text:
            return pod
    return None


def first(log, pattern, start=0):
    for i in range(start, len(log)):
        if re.search(pattern, log[i][2]):
            return i
    return None


def fail(msg):
    print("cycle check: " + msg, file=sys.stderr)
    sys.exit(1)


def check(path, t0, version, mode):
    tl = timeline(path, t0)
    lines = agent_lines(t0)
    pod = loader(lines, version)
    if pod is None:
        fail("no installer pod logged the installed summary of %s" % version)
    log = [l for l in lines if l[0] == pod]
    c = next((i for i, s in enumerate(tl) if s.get("cordoned") == "true"), None)
    if c is None:
        fail("the node was never cordoned after the change to %s" % version)
    u = next((i for i in range(c, len(tl)) if tl[i].get("cordoned") == "false"), None)
    if u is None:
        fail("the node was never uncordoned after the change to %s" % version)
    window = tl[c:u]
    before = set().union(*(s["installer"] for s in tl[:c])) if c else set()
    in_window = set().union(*(s["installer"] for s in window))

    miss = first(log, r"cache miss")
    build = first(log, r'step="build"')
    hit = first(log, r"cache hit \(verified\)")
    wait = first(log, r"waiting for the controller's go-ahead")
    go = first(log, r"the controller's go-ahead is on the node")
    unload = first(log, r'step="unload"')
    load = first(log, r'step="load"')
    if None in (unload, load):
        fail("pod %s logged no unload or no load step" % pod)

    if mode == "ahead":
        # until the go-ahead (the label is not the agent's to keep after that)
        for s in window:
            if s.get("go-ahead") == "yes":
                break
            if s.get("prepared") != version:
                fail("cordoned at %.1f while the node's kmd-prepared was %r, not %s"
                     % (s["t"], s.get("prepared"), version))
        if pod not in before:
            fail("the pod that loaded %s (%s) was not on the node before its cordon" % (version, pod))
        if in_window - before:
            fail("installer pod(s) created inside the cordon window: %s" % ",".join(sorted(in_window - before)))
        if wait is None or go is None:
            fail("pod %s never waited for the go-ahead (waiting=%s go-ahead=%s)" % (pod, wait, go))
        if hit is None and (miss is None or build is None):
            fail("pod %s neither found %s in its cache nor built it" % (pod, version))
        got = build if hit is None else hit
        if not got < wait < go < unload < load:
            fail("pod %s's log out of order: module obtained #%s, waiting #%s, go-ahead #%s, unload #%s, load #%s"
                 % (pod, got, wait, go, unload, load))
        late = first(log, r'cache miss|step="build"|step="rebuild"', wait)
        if late is not None:
            fail("pod %s built after it began to wait for the go-ahead: %s" % (pod, log[late][2][:200]))
    elif mode == "inside":
        if pod in before:
            fail("prepare off, yet the pod that loaded %s (%s) was on the node before its cordon" % (version, pod))
        if miss is None or build is None:
            fail("prepare off, yet pod %s did not build %s" % (pod, version))
    else:
        fail("unknown mode " + mode)

    def at(cond):
        return next((s["t"] for s in tl if cond(s)), None)

    t_cord, t_uncord = tl[c]["t"], tl[u]["t"]
    t_upg = at(lambda s: s.get("state") == "Upgrading")
    t_done = next((s["t"] for s in tl if t_upg is not None and s["t"] >= t_upg and s.get("state") == "Done"), None)
    fig = {
        "pod": pod,
        "source": "cache" if hit is not None else "build",
        "out_of_service_s": "%.1f" % (t_uncord - t_cord),
        "phase_s": "%.1f" % (t_done - t0) if t_done else "-",
        "cordon_after_change_s": "%.1f" % (t_cord - t0),
    }
    # the window's parts: the drain (host clock), then the agent's side
    t_go = next((s["t"] for s in window if s.get("go-ahead") == "yes"), None)
    if t_go is not None:
        fig["cordon_to_go_ahead_s"] = "%.1f" % (t_go - t_cord)
        fig["go_ahead_to_load_s"] = "%.1f" % (log[load][1] - t_go)
    fig["load_to_uncordon_s"] = "%.1f" % (t_uncord - log[load][1])
    if build is not None:
        m = re.search(r"duration_ms=(\d+)", log[build][2])
        fig["build_s"] = "%.1f" % (int(m.group(1)) / 1000) if m else "-"
        # guest clock against host clock: a figure, not an assertion
        fig["build_start_vs_cordon_s"] = "%+.1f" % (log[miss][1] - t_cord) if miss is not None else "-"
        fig["build_end_vs_cordon_s"] = "%+.1f" % (log[build][1] - t_cord)
    print(" ".join("%s=%s" % kv for kv in fig.items()))


def main():
    cmd, path, t0, version = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    if cmd == "loader":
        print(loader(agent_lines(t0), version) or "")
    elif cmd == "check":
        check(path, t0, version, sys.argv[5])
    else:
        fail("unknown command " + cmd)


if __name__ == "__main__":
    main()
