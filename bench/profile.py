#!/usr/bin/env python3
"""Where a node cycle's time goes, one node at a time: the benchmark's
timeline (what its watches saw, timeline-<tag>.jsonl) against the controller's
requests as the API server's audit log recorded them (audit-<tag>.jsonl, with
the time each request came in and the time its response went out).

    python3 bench/profile.py /tmp/ttdrv-bench/timeline-1000-0ms-1.jsonl /tmp/ttdrv-bench/audit-1000-0ms-1.jsonl [SPLIT]

With SPLIT (seconds), the hand-offs before and after that time from the
controller's first request are also shown apart (e.g. while build-ahead
replaces the fleet's installer pods, and after).

For each node B that took the slot node A freed, the chain the controller is
on (all times as the API server or the benchmark's watch saw them):

  A's agent done (its kmd-version label and its pod Ready both seen)
    -> the controller sends A's uncordon + Done       (detect: watch + pass)
    -> the API server answers                          (write 1)
    -> the controller sends B's cordon + Draining      (hand-off: plan, next round)
    -> the API server answers                          (write 2)
    -> the controller sends B's go-ahead (Upgrading)   (echo + pass)
    -> the API server answers                          (write 3)

The controller's time is what is between the API server's answer and its next
request; the writes are the API server's.
"""
import json
import statistics
import sys
from datetime import datetime


def ts(s):
    # RFC 3339 with up to nanoseconds; Python takes microseconds.
    s = s.rstrip("Z")
    if "." in s:
        head, frac = s.split(".", 1)
        s = f"{head}.{frac[:6].ljust(6, '0')}"
    return datetime.fromisoformat(s).timestamp()


def load_timeline(path):
    seen = []
    with open(path) as f:
        for line in f:
            e = json.loads(line)
            seen.append((ts(e["t"]), e["node"], e["what"], e.get("target", "")))
    seen.sort()
    return seen


def load_audit(path):
    reqs = []
    with open(path) as f:
        for line in f:
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            if e.get("stage") != "ResponseComplete":
                continue
            ref = e.get("objectRef") or {}
            reqs.append(
                (
                    ts(e["requestReceivedTimestamp"]),
                    ts(e["stageTimestamp"]),
                    e.get("verb"),
                    ref.get("resource"),
                    ref.get("name"),
                )
            )
    reqs.sort()
    return reqs


def first(items, pred):
    return next((x for x in items if pred(x)), None)


def handoffs(timeline, audit):
    """The target, and (time of A's Done, {step: seconds}) per hand-off."""
    target = max((t for _, _, _, t in timeline if t), default="")
    done = [(t, n) for t, n, w, tg in timeline if w == "Done" and tg == target]
    patches = [r for r in audit if r[2] == "patch" and r[3] == "nodes"]
    deletes = [r for r in audit if r[2] == "delete" and r[3] == "pods"]
    out = []
    for (ta, a), (_, b) in zip(done, done[1:]):
        up_a = first(timeline, lambda e: e[1] == a and e[2] == "Upgrading" and e[3] == target)
        if not up_a:
            continue
        loaded = first(timeline, lambda e: e[1] == a and e[2] == "Loaded" and e[0] >= up_a[0])
        ready = first(timeline, lambda e: e[1] == a and e[2] == "Ready" and e[0] >= up_a[0])
        if not loaded or not ready:
            continue
        agent_done = max(loaded[0], ready[0])
        w1 = first(patches, lambda r: r[4] == a and r[0] >= up_a[0] and r[0] >= agent_done - 0.5)
        if not w1:
            continue
        w2 = first(patches, lambda r: r[4] == b and r[0] >= w1[0])
        if not w2:
            continue
        w3 = first(patches, lambda r: r[4] == b and r[0] > w2[0])
        seen_dr = first(timeline, lambda e: e[1] == b and e[2] == "Draining" and e[0] >= w2[0])
        if not w3 or not seen_dr:
            continue
        row = {
            "detect": w1[0] - agent_done,
            "write 1 (A Done)": w1[1] - w1[0],
            "hand-off": w2[0] - w1[1],
            "write 2 (B Draining)": w2[1] - w2[0],
            "echo + pass": w3[0] - w2[1],
            "write 3 (B Upgrading)": w3[1] - w3[0],
            "watch lag (B Draining)": seen_dr[0] - w2[1],
        }
        d = first(deletes, lambda r: w3[1] <= r[0] <= w3[1] + 1.0)
        if d:
            row["installer pod delete"] = d[1] - d[0]
        out.append((ta, row))
    return target, out


STEPS = ["detect", "write 1 (A Done)", "hand-off", "write 2 (B Draining)",
         "echo + pass", "write 3 (B Upgrading)", "installer pod delete",
         "watch lag (B Draining)"]


def table(title, rows):
    print(f"{title}: {len(rows)} node hand-offs")
    print("| step | mean | p50 | p95 |")
    print("|---|---:|---:|---:|")
    total = writes = 0.0
    for k in STEPS:
        v = sorted(r[k] * 1000 for _, r in rows if k in r)
        if not v:
            continue
        mean = statistics.mean(v)
        if not k.startswith(("installer", "watch")):
            total += mean
            writes += mean if k.startswith("write") else 0.0
        p95 = v[min(len(v) - 1, int(len(v) * 0.95))]
        print(f"| {k} | {mean:.1f} ms | {statistics.median(v):.1f} ms | {p95:.1f} ms |")
    print(f"| agent done -> B's go-ahead answered | {total:.1f} ms (writes {writes:.1f} ms) | | |")


def main():
    timeline, audit = load_timeline(sys.argv[1]), load_audit(sys.argv[2])
    target, rows = handoffs(timeline, audit)
    table(f"to {target}", rows)
    if len(sys.argv) > 3 and audit:
        split = audit[0][0] + float(sys.argv[3])
        table(f"first {sys.argv[3]} s", [r for r in rows if r[0] < split])
        table(f"after {sys.argv[3]} s", [r for r in rows if r[0] >= split])


if __name__ == "__main__":
    main()
