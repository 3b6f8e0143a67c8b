"""A soak run on the GPU: one session replayed N times (default 10**6) with the same inputs. Device
memory, host memory (RSS) and the outputs must stay the same from the first checkpoint to the last.

    python benchmarks/soak.py [--model models/tiny/gpt2.onnx] [--dim batch=1,seq=8] [--precision fp32]
                              [--replays 1000000] [--every 20000] [--out DIR]

Each replay is a whole `sess.run` (inputs copied in, graph launched, outputs copied out). Every
--every replays it records the host RSS, the device's free memory and whether the outputs equal the
first run's bit for bit. Prints the first and last checkpoints and exits 1 if the outputs ever
differed or memory grew (host by more than 16 MiB, the device by anything); writes DIR/soak.json.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
MIB = 2 ** 20
HOST_SLACK = 16 * MIB   # allocator noise: Python's and numpy's free lists settle within this


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "tiny", "gpt2.onnx"))
    ap.add_argument("--dim", default="batch=1,seq=8")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--replays", type=int, default=10 ** 6)
    ap.add_argument("--every", type=int, default=20000)
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "soak"))
    a = ap.parse_args()
    import grapec
    from grapec.bundle.inputs import bundle_inputs
    dims = {k: int(v) for k, v in (kv.split("=") for kv in a.dim.split(","))}
    bundle = grapec.compile(a.model, dims=dims, precision=a.precision)
    feeds = bundle_inputs(bundle.manifest, 0, seed=1)
    sess = grapec.load(bundle, backend="cuda")
    dev = sess._runner.dev
    first = sess.run(feeds)
    checkpoints, differed = [], 0
    t0 = time.perf_counter()
    for i in range(1, a.replays + 1):
        out = sess.run(feeds)
        if i % a.every == 0 or i == a.replays:
            same = all(np.array_equal(out[k], first[k]) for k in first)
            differed += not same
            checkpoints.append({"replays": i, "seconds": time.perf_counter() - t0, "rss_mib": rss_bytes() / MIB,
                                "device_free_mib": dev.mem_info()[0] / MIB, "outputs_same": same})
    start, end = checkpoints[0], checkpoints[-1]
    host_growth = (end["rss_mib"] - start["rss_mib"]) * MIB
    device_growth = (start["device_free_mib"] - end["device_free_mib"]) * MIB
    ok = not differed and host_growth <= HOST_SLACK and device_growth <= 0
    res = {"model": os.path.basename(a.model), "dims": dims, "precision": a.precision, "device": dev.name,
           "replays": a.replays, "us_per_run": 1e6 * end["seconds"] / a.replays, "checkpoints": checkpoints,
           "checkpoints_differing": differed, "ok": ok}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "soak.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{a.replays} runs of {res['model']} {a.dim} {a.precision} on {dev.name}: {res['us_per_run']:.1f} us per run")
    print("| checkpoint | replays | host RSS MiB | device free MiB | outputs as the first run |")
    print("|---|---|---|---|---|")
    for label, c in (("first", start), ("last", end)):
        print(f"| {label} | {c['replays']} | {c['rss_mib']:.1f} | {c['device_free_mib']:.1f} | {c['outputs_same']} |")
    print(f"checkpoints with other outputs: {differed} of {len(checkpoints)}; host grew {host_growth / MIB:.2f} MiB, "
          f"device {device_growth / MIB:.2f} MiB: {'flat' if ok else 'NOT FLAT'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
