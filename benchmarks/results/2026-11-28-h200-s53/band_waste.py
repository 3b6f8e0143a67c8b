"""What a range's family execs make a size pay for its band (no GPU: the bundle's formulas alone).
A family's sizes run in one exec per band (runtime/cuda/family_exec.py): library steps at the band's widest
shapes, sized kernels at its largest grid. For each size asked, and a band ratio or several (GRAPEC_BAND_RATIO),
the library work its exec does over its own (output elements x reduction, per step, summed) and the blocks its
kernels launch over its own (blocks past a size's grid return at once: cheaper than its own).
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


main()
