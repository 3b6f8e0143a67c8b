"""What a range's family execs make a size pay for its band (no GPU: the bundle's formulas alone).
A family's sizes run in one exec per band (runtime/cuda/family_exec.py): library steps at the band's widest
shapes, sized kernels at its largest grid. For each size asked, and a band ratio or several (GRAPEC_BAND_RATIO),
the library work its exec does over its own (output elements x reduction, per step, summed) and the blocks its
kernels launch over its own (blocks past a size's grid return at once: cheaper than its own).
The last line of each ratio: the mean over every size of every family that runs so (uniform traffic over them).
usage: band_waste.py BUNDLE S1,S2,.. [R1,R2,..]"""
import os, sys
import numpy as np
from grapec.bundle.format import Bundle


def work(shapes_out) -> int:
    args, out = shapes_out
    red = args[0][-1] if args and args[0] else 1   # A's last dim (a GEMM's K), x's channels for a convolution
    if len(args) > 1 and args[1] and len(args[1]) == 4:   # conv weight [K, R, S, C]
        red = int(np.prod(args[1][1:]))
    return int(np.prod(out)) * int(red)


def main():
    b = Bundle.read(sys.argv[1])
    asked = [tuple(int(v) for v in s.split("x")) for s in sys.argv[2].split(",")]
    ratios = sys.argv[3].split(",") if len(sys.argv) > 3 else ["1.5"]
    families = b.plans.docs.families
    sized = set(b.manifest["cuda"].get("sized") or [])
    for ratio in ratios:
        os.environ["GRAPEC_BAND_RATIO"] = ratio
        from grapec.runtime.cuda.family_plan import plan_family
        print(f"\n## band ratio {ratio}")
        print("| size | family | band members | execs of the family | library work / own | blocks / own | variant steps |")
        print("|---|---|---|---|---|---|---|")
        everyone, total_execs = [], 0
        for n, fam in enumerate(families):
            fp = plan_family(fam, sized)
            if fp.reason is not None:
                continue
            index = {tuple(int(v) for v in s): i for i, s in enumerate(fp.sizes)}
            for s in asked:
                m = index.get(s)
                if m is None:
                    continue
                members = fp.members(int(fp.bands[m]))
                own_w = run_w = 0
                for p, form in fp.library.items():
                    own = fp.unflatten(p, fp.shapes(p, [m])[0])
                    ran = fp.widest(p, members) if form.kind == "widest" else own
                    own_w += work(own)
                    run_w += work(ran)
                variants = sum(form.kind == "variant" for form in fp.library.values())
                print(f"| {'x'.join(map(str, s))} | {n} | {len(members)} | {len(set(fp.bands.tolist()))} | "
                      f"{run_w / max(own_w, 1):.3f} | {fp.blocks[members].max() / max(fp.blocks[m], 1):.3f} | {variants} |")
            ratios, execs = every_member(fp)
            everyone.append(ratios)
            total_execs += execs
        allr = np.concatenate(everyone)
        print(f"every size of the families ({len(allr)}): library work / own, mean {allr.mean():.3f}, "
              f"p99 {np.percentile(allr, 99):.3f}; {total_execs} execs")


def every_member(fp) -> tuple:
    """(each member's library work in its band exec over its own, the family's execs), vectorized over members."""
    every = np.arange(len(fp.sizes))
    own = np.zeros(len(every))
    ran = np.zeros(len(every))
    for p, form in fp.library.items():
        table = fp.shapes(p, every).astype(np.float64)
        cols, at = [], 0
        for shape in form.shapes:
            cols.append(None if shape is None else list(range(at, at + len(shape))))
            at += 0 if shape is None else len(shape)
        out, a = cols[0], cols[1] if len(cols) > 1 else None
        w = cols[2] if len(cols) > 2 else None
        red = table[:, a[-1]] if a else 1.0
        if w is not None and len(w) == 4:
            red = np.prod(table[:, w[1:]], axis=1)
        mine = np.prod(table[:, out], axis=1) * red
        own += mine
        if form.kind != "widest":
            ran += mine
            continue
        for band in np.unique(fp.bands):
            members = np.nonzero(fp.bands == band)[0]
            ran[members] += work(fp.widest(p, members))
    return ran / np.maximum(own, 1), len(np.unique(fp.bands))


main()
