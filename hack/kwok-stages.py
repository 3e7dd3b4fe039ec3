#!/usr/bin/env python3
"""kwok's default stages for the test cluster (hack/cluster.sh), with two
changes: a node labelled sim.ttdrv.io/not-ready is left alone (no heartbeat,
no re-initialisation to Ready), so tests can make it NotReady; and pods of
our installer DaemonSets (labelled driver.tenstorrent.com/policy) are left
for the simulated agent to make Ready, as on a real node the agent's
readiness depends on the loaded module; and pods of flash Jobs (labelled
firmware.tenstorrent.com/cr) are left for the simulated flasher to finish,
as on a real node their outcome is the flash's; and pods labelled
sim.ttdrv.io/ready-after are left for the test kit's late starter, which
makes them Ready that many seconds after they start (a stack agent that is
slow to serve); and pods labelled sim.ttdrv.io/ready-when-published are left
for the simulated DRA plugin, which makes them Ready once it has published.

    kwok-stages.py KWOK_STAGE_DIR OUT
"""
import sys
src, out = sys.argv[1], sys.argv[2]
parts = []
for f in ["node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
          "pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml"]:
    text = open(f"{src}/{f}").read()
    if f.startswith("node/"):
        anchor = "  selector:\n    matchExpressions:\n"
        assert anchor in text, "kwok node stage changed shape"
        text = text.replace(anchor, anchor + "    - key: '.metadata.labels[\"sim.ttdrv.io/not-ready\"]'\n      operator: 'DoesNotExist'\n", 1)
    if f.endswith("pod-ready.yaml") or f.endswith("pod-complete.yaml"):
        anchor = "    - key: '.metadata.deletionTimestamp'\n      operator: 'DoesNotExist'\n"
        assert anchor in text, f"kwok {f} stage changed shape"
        keys = ["firmware.tenstorrent.com/cr"]
        if f.endswith("pod-ready.yaml"):
            keys[:0] = ["driver.tenstorrent.com/policy", "sim.ttdrv.io/ready-after",
                         "sim.ttdrv.io/ready-when-published"]
        extra = "".join(f"    - key: '.metadata.labels[\"{k}\"]'\n      operator: 'DoesNotExist'\n" for k in keys)
        text = text.replace(anchor, anchor + extra, 1)
    parts.append(text.strip() + "\n")
open(out, "w").write("---\n".join(parts))
