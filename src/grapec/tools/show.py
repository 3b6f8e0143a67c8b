"""What `grapec inspect` shows of a bundle: inputs, outputs, buckets with their memory and regions,
the planner's fusion report, the stream scheduler's account (cli.py parses the command)."""
from __future__ import annotations

import json
from collections import Counter

import click


from ..errors import GrapecError
from ..ir.selection import hidden_output, output_counts


def show_bundle(bundle: str, b, as_json: bool, fusion: bool, schedule: bool):
    """`grapec inspect`: the summary, or (fusion) the planner's account, or (schedule) the stream
    scheduler's, as text or JSON."""
    m = b.manifest
    if schedule:
        if as_json:
            click.echo(json.dumps([bk.get("schedule") for bk in m.get("buckets", [])], indent=1))
        else:
            from ..cost.timeline import schedule_text
            click.echo(schedule_text(b))
        return
    if fusion:
        print_fusion_report(m, as_json)
        return
    summary = {k: m.get(k) for k in ("grapec_version", "format_version", "model", "opset", "targets", "weights_bytes",
                                      "kernels", "dynamic", "range_compile")}
    summary["storage"] = b.storage()
    structures = launch_structures(b)
    if structures:
        summary["launch_structures"] = structures
    execs = shared_execs(b)
    if execs is not None:
        summary["gpu_execs"] = execs
    on_gpu = range_on_gpu_of(b)
    if on_gpu is not None:
        summary["range_on_gpu"] = {k: v for k, v in vars(on_gpu).items()}
    shown = range(len(m["buckets"])) if as_json or len(m["buckets"]) <= 16 else \
        [0, 1, 2, len(m["buckets"]) - 2, len(m["buckets"]) - 1]
    plans = [{"shapes": m["buckets"][i]["shapes"], "steps": m["buckets"][i]["steps"], "library_ops": library_ops(p),
              "regions": describe_regions(p.steps), "arena_bytes": p.arena_bytes, **p.memory}
             for i, p in ((i, b.plans[i]) for i in shown)]
    if as_json:
        click.echo(json.dumps({**summary, "inputs": m["inputs"], "outputs": m["outputs"], "buckets": plans,
                               "onnx_ops": m.get("onnx_ops"), "notes": m.get("notes", []),
                               "mixed_precision": m.get("mixed_precision")}, indent=1))
        return
    click.echo(f"{bundle}: grapec bundle v{m['format_version']} (grapec {m['grapec_version']}), model {m['model']} (opset {m['opset']})")
    click.echo(f"  targets: {', '.join(m['targets']) or 'none (CPU backend only)'}")
    click.echo(f"  weights: {m['weights_bytes'] / 2**20:.2f} MiB; kernels: {m['kernels']} distinct")
    account = m.get("range_compile")
    if account:   # a range compiled per launch structure (compiler/structures.py)
        click.echo(f"  range compile: {account['summary']}")
        if account.get("floors"):
            click.echo(f"  range formulas' floors of the dims: {', '.join(account['floors'])}")
    for i in m["inputs"]:
        click.echo(f"  input  {i['name']}: {i['dtype']}{i['dims']}")
    counts = output_counts(o["name"] for o in m["outputs"])   # a data-dependent axis's count is an output of its own
    for o in m["outputs"]:
        if hidden_output(o["name"]):
            continue
        axes = {a for a, _ in counts.get(o["name"], ())}
        dims = ", ".join(f"<={d}" if a in axes else str(d) for a, d in enumerate(o["dims"]))
        click.echo(f"  output {o['name']}: {o['dtype']}[{dims}]")
    st = summary["storage"]
    if m.get("dynamic"):
        click.echo("  dynamic: " + ", ".join(f"{d}={lo}:{hi}" for d, (lo, hi) in m["dynamic"].items())
                   + f" ({len(m['buckets'])} sizes, each with its own plan; one arena of "
                   f"{b.largest_arena() / 2**20:.2f} MiB serves them all)")
    click.echo(f"  plans: {st['plans']} in {st['plan_templates']} templates (launch structures), {st['plan_bytes'] / 1024:.1f} KiB stored "
               f"({st['plan_bytes'] / 1024 / max(1, st['plans']):.2f} KiB per plan); kernels {st['kernel_bytes'] / 1024:.1f} KiB")
    for st in structures[:MAX_STRUCTURES_SHOWN]:
        grid = 1
        for v in st["sizes"].values():
            grid *= len(v)
        sizes = " x ".join(f"{d} {compress_ints(v)}" for d, v in st["sizes"].items())
        n = len(st["buckets"])
        diff = ", ".join(f"{v} {k}" for k, v in st["differences"].items() if v)
        click.echo(f"    template {st['template']}: {n} size(s), " + (sizes if n == grid else f"{n} of the {grid} in {sizes}")
                   + (f"; steps between its sizes: {diff}" if n > 1 else ""))
    if len(structures) > MAX_STRUCTURES_SHOWN:
        click.echo(f"    ... {len(structures) - MAX_STRUCTURES_SHOWN} more templates (--json lists them all)")
    if execs is not None:
        click.echo(f"  GPU: {execs['execs']} instantiated graph(s) for {len(m['buckets'])} sizes, one per launch structure "
                   f"(a template with the same kernel functions) and band of sizes (their kernels' blocks within "
                   f"{execs['band_ratio']}x: GRAPEC_BAND_RATIO); {execs['sized_steps']} kernel steps of execs of several sizes read their sizes "
                   "from device memory")
        if on_gpu is not None:
            click.echo("    " + on_gpu.text())
        for sw in execs["switches"]:
            ops = ", ".join(f"{n} {op}" for op, n in sw["ops"].items())
            click.echo(f"    a switch between its {len(sw['buckets'])} sizes from bucket {sw['buckets'][0]} sets "
                       f"{len(sw['steps'])} node(s) besides the loader ({ops}: their launch differs by size)")
    for i, p in zip(shown, plans):
        if len(shown) < len(m["buckets"]) and i == shown[-2]:
            click.echo(f"  ... {len(m['buckets']) - len(shown)} more buckets (--json lists them all)")
        shp = ", ".join(f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in p["shapes"].items())
        click.echo(f"  bucket {i} ({shp}): steps {p['steps']}, library {p['library_ops']}")
        if "live_lower_bound_bytes" in p:
            click.echo(f"    arena {p['arena_bytes'] / 2**20:.3f} MiB; sum of intermediates {p['sum_intermediate_bytes'] / 2**20:.3f} MiB; "
                       f"live-set lower bound {p['live_lower_bound_bytes'] / 2**20:.3f} MiB ({p['ratio_to_lower_bound']}x; "
                       f"peak in the schedule's own order {p['schedule_order_peak_bytes'] / 2**20:.3f} MiB)")
        else:   # a range compiled per launch structure keeps no memory report per size (compiler/structures.py)
            click.echo(f"    arena {p['arena_bytes'] / 2**20:.3f} MiB (the structure's layout; no memory report per size)")
        for r in p["regions"]:
            click.echo(f"    {'  ' * r['depth']}{r['text']}")
        for b in m.get("bounds", []) if i == shown[0] else ():
            click.echo(f"    --bound {b['value']}={b['bound']}: read by {', '.join(b['read_by'])}; a run where it is "
                       f"outside 0..{b['bound']} is refused")
        for d in m["buckets"][i].get("predicated", []):
            click.echo(f"    data-dependent size: dim {d['axis']} of '{d['output']}' ({d['op']} '{d['node']}'), at most "
                       f"{d['bound']}: {d['source']}; the rest is padding past a count kept on the device")
    mixed = m.get("mixed_precision")
    if mixed:
        click.echo(f"  {mixed['precision']}: calibrated on {mixed['calibration']['samples']}; output error "
                   + ", ".join(f"{k} {v:.1e}" if isinstance(v, float) else f"{k} {v}" for k, v in mixed["output_rel_err"].items()))
        for k in mixed["kept_fp32"]:
            click.echo(f"    float32: '{k['node']}' ({k['op']}): {k['why']}")
    ops = m.get("onnx_ops") or {}
    click.echo("  onnx ops: " + ", ".join(f"{k} {v}" for k, v in ops.items()))
    for n in m.get("notes", []):
        click.echo(f"  note: {n}")


MAX_STRUCTURES_SHOWN = 16


def launch_structures(b) -> list:
    """A range bundle's sizes by plan template (its launch structures: the sizes of one differ only in
    the plan's numbers): [{"template", "buckets", "sizes": {dim: sorted values}}]; [] for a bundle
    without a range."""
    m = b.manifest
    docs = getattr(b.plans, "docs", None)
    if not m.get("dynamic") or docs is None:
        return []
    axes = [(d, i["name"], a) for i in m["inputs"] for a, d in enumerate(i["dims"] or []) if d in m["dynamic"]]
    seen = {}
    for d, name, a in axes:   # one input axis per dim is enough to read its value
        seen.setdefault(d, (name, a))
    out: dict = {}
    for bucket in range(len(docs)):
        template = docs.template_of(bucket)
        st = out.setdefault(template, {"template": template, "buckets": [], "sizes": {d: set() for d in seen}})
        st["buckets"].append(bucket)
        for d, (name, a) in seen.items():
            st["sizes"][d].add(int(m["buckets"][bucket]["shapes"][name][a]))
    from ..runtime.cuda.shared_exec import sampled
    for st in out.values():
        st["sizes"] = {d: sorted(v) for d, v in st["sizes"].items()}
        st["differences"] = launch_differences(b, sampled(st["buckets"]))
    return [out[k] for k in sorted(out)]


def range_on_gpu_of(b):
    """How a bundle with range families runs on the GPU (runtime/cuda/family_plan.py RangeOnGpu), or None."""
    families = getattr(getattr(b.plans, "docs", None), "families", None)   # a range's (bundle/families.py BucketDocs)
    cuda = b.manifest.get("cuda")
    if not families or not cuda:
        return None
    from ..runtime.cuda.family_plan import range_on_gpu
    return range_on_gpu(families, set(cuda.get("sized") or []), len(b.plans))


def shared_execs(b) -> dict | None:
    """What the CUDA backend instantiates for a bundle of several sizes (runtime/cuda/shared_exec.py):
    {"execs": launch structures times their bands of sizes (shared_exec.exec_key), "sized_steps": kernel
    steps of execs of several sizes that run as sized twins}; None where it keeps an exec per bucket (one bucket, no GPU code, no sized twins)."""
    cuda = b.manifest.get("cuda")
    if not cuda or len(b.plans) < 2 or not cuda.get("sized"):
        return None
    from ..runtime.cuda.shared_exec import band_ratio, exec_keys, sampled
    from ..runtime.cuda.size_record import sized_steps
    by_structure: dict = {}
    for i, key in enumerate(exec_keys(b)):
        by_structure.setdefault(key, []).append(i)
    steps = sum(len(sized_steps(b, {i: b.plans[i] for i in sampled(members)}, set(cuda["sized"]))[0])
                for members in by_structure.values() if len(members) > 1)
    return {"execs": len(by_structure), "sized_steps": steps, "switches": switch_report(b), "band_ratio": band_ratio()}


def switch_report(b) -> list:
    """Per launch structure of several sizes whose switches set more than the loader: its sizes'
    buckets and the steps (by op) whose launch differs between them, as the CUDA runner sets them at
    each switch (a node update each: about 3 us of host time on an H200)."""
    from ..plan import LibraryStep
    from ..runtime.cuda.shared_exec import switch_sets
    out = []
    for members, positions in switch_sets(b):
        if positions:
            plan = b.plans[members[0]]
            ops = Counter(st.attrs.get("op", "library") if isinstance(st, LibraryStep) else "kernel"
                          for st in (plan.steps[p] for p in positions))
            out.append({"buckets": members, "steps": positions, "ops": dict(ops)})
    return out


def launch_differences(b, buckets: list) -> dict:
    """What a switch between the sizes of one launch structure would have to change, counted over the
    plan's top-level steps (issue 33: a step the same in every size costs a switch nothing):
        same        the same launch in every size
        sizes       the same kernel but for its numbers (sizes, strides, grid): one function takes them
                    as arguments (codegen/module.py), so only the arguments and the grid differ
        buffers     another buffer address (a per-size constant, or an arena offset the layout did
                    not share)
        kernel      another kernel (its code differs beyond numbers)
        library     a library call (GEMM, convolution) of other shapes or attributes
        control     an If/Loop region or scan store that differs"""
    from ..bundle import templates
    from ..plan import KernelStep, LibraryStep
    plans = [b.plans[i] for i in buckets]
    names = (b.manifest.get("cuda") or {}).get("kernels")
    code = {}

    def kernel_code(k):
        """The GPU function that runs kernel k; without GPU code, its IR with the numbers taken out
        (what would share a function, but for the kinds that never merge: codegen/module.py)."""
        if names:
            return names[k]
        if k not in code:
            code[k] = json.dumps(templates.split(b.kernels[k])[0], sort_keys=True)
        return code[k]
    counts = {"same": 0, "sizes": 0, "buffers": 0, "kernel": 0, "library": 0, "control": 0}
    for steps in zip(*(p.steps for p in plans)):
        first = steps[0]
        if isinstance(first, (KernelStep, LibraryStep)):
            places = {tuple((p.buffers[a].space, p.buffers[a].offset) if a >= 0 else None
                            for a in [st.out] + list(st.args)) for p, st in zip(plans, steps)}
        if isinstance(first, KernelStep):
            if len({st.kernel for st in steps}) == 1 and len(places) == 1:
                counts["same"] += 1
            elif len(places) > 1:
                counts["buffers"] += 1
            elif len({kernel_code(st.kernel) for st in steps}) > 1:
                counts["kernel"] += 1
            else:
                counts["sizes"] += 1
        elif isinstance(first, LibraryStep):
            calls = {(json.dumps(st.attrs, sort_keys=True), tuple(tuple(p.buffers[a].shape) if a >= 0 else ()
                                                                  for a in [st.out] + list(st.args)))
                     for p, st in zip(plans, steps)}
            counts["same" if len(calls) == 1 and len(places) == 1 else "library"] += 1
        else:
            same = len({json.dumps(st.to_json() if hasattr(st, "to_json") else repr(st)) for st in steps}) == 1
            counts["same" if same else "control"] += 1
    return counts


def compress_ints(values: list) -> str:
    """Sorted ints as runs: "1..6, 8..64 step 4, 67"."""
    parts, i = [], 0
    while i < len(values):
        j = i
        step = values[i + 1] - values[i] if i + 1 < len(values) else 1
        while j + 1 < len(values) and values[j + 1] - values[j] == step:
            j += 1
        if j - i >= 2 or (j > i and step == 1):
            parts.append(f"{values[i]}..{values[j]}" + (f" step {step}" if step != 1 else ""))
            i = j + 1
        else:
            parts.append(str(values[i]))
            i += 1
    return ", ".join(parts)


def print_fusion_report(manifest: dict, as_json: bool):
    """Every fusion group of every bucket: its scheme, mapping, estimated time and the mappings that lost."""
    buckets = manifest.get("buckets", [])
    if as_json:
        click.echo(json.dumps([{"shapes": bk["shapes"], "estimated_us": bk.get("estimated_us"),
                                "groups": bk.get("fusion_report", []), "stitches": bk.get("stitches", [])}
                               for bk in buckets], indent=1))
        return
    if not any("fusion_report" in bk for bk in buckets):
        raise GrapecError("this bundle has no fusion report (compiled by a grapec before the cost model); recompile it")
    click.echo(f"fusion {manifest.get('fusion')}, cost model for device profile '{manifest.get('device_profile')}' "
               "(estimates are the model's, not measurements: grapec bench --per-step measures)")
    for i, bk in enumerate(buckets):
        shp = ", ".join(f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in bk["shapes"].items())
        rows = bk.get("fusion_report", [])
        top = [r for r in rows if isinstance(r["step"], int)]
        click.echo(f"bucket {i} ({shp}): {len(top)} groups, estimated {bk.get('estimated_us', 0):.1f} us in all"
                   + (f", and {len(rows) - len(top)} in If/Loop bodies (step a/b: step b of the body of step a)"
                      if len(rows) > len(top) else ""))
        click.echo(f"  {'step':>6}  {'kind':<9} {'ops':>3}  {'estimated':>9}  {'bound':<12} scheme; mapping  <- ONNX nodes")
        for r in rows:
            click.echo(f"  {r['step']!s:>6}  {r['kind']:<9} {r['ops']:>3}  {r['us']:>6.2f} us  {r['bound']:<12} "
                       f"{r['scheme']}; {r['mapping']}  <- {', '.join(r['origin'])}")
            if r["alternatives"]:
                click.echo("          lost: " + "; ".join(f"{a['mapping']} ({a['scheme']}) {a['us']:.2f} us"
                                                     for a in r["alternatives"]))
        for region, (n, us) in _bodies(rows).items():
            click.echo(f"  step {region}: its body, {n} groups, estimated {us:.1f} us a pass (an If branch or a Loop "
                       "iteration; the body's own Ifs and Loops counted once)")
        for st in bk.get("stitches", []):
            first, end = st["steps"]
            saved = st["saved_us"]
            click.echo(f"  steps {first}..{end - 1}: global-barrier stitching, one cooperative kernel of {st['block']} "
                       f"threads a block, {end - first} stages ({st['stages_us']:.2f} us), a grid barrier between each two: "
                       f"estimated {abs(saved):.2f} us {'faster' if saved > 0 else 'slower'} than a node each")


def _bodies(rows: list) -> dict:
    """region label ("2", or "3/then") -> (groups, estimated us) of the steps directly in that Loop body
    or If branch; a Loop's enter and exit copies are left out."""
    out: dict = {}
    for r in rows:
        if isinstance(r["step"], str):
            region = r["step"].rpartition("/")[0]
            if region.rpartition("/")[2] in ("enter", "exit"):
                continue
            n, us = out.get(region, (0, 0.0))
            out[region] = (n + 1, us + r["us"])
    return out


def library_ops(plan) -> dict:
    """Library (cuBLASLt) calls of a plan, by op, bodies included."""
    from ..plan import LibraryStep, walk_steps
    lib: dict = {}
    for st in walk_steps(plan.steps):
        if isinstance(st, LibraryStep):
            lib[st.attrs["op"]] = lib.get(st.attrs["op"], 0) + 1
    return lib


def describe_regions(steps, depth=0) -> list:
    """One line per If/Loop step: how it runs (a conditional node of the graph, or host control)."""
    from ..plan import IfStep, LoopStep
    out = []
    for st in steps:
        if not isinstance(st, (IfStep, LoopStep)):
            continue
        name = ", ".join(st.origin)
        how = "host-driven: " + st.host_reason if not st.graphed else None
        if isinstance(st, IfStep):
            text = (f"If '{name}': {how or 'conditional IF node (then and else bodies)'}; "
                    f"then {len(st.then.steps)} steps, else {len(st.else_.steps)} steps")
            subs = [st.then.steps, st.else_.steps]
        else:
            text = (f"Loop '{name}': {how or 'conditional WHILE node'}; body {len(st.body.steps)} steps"
                    f"{', trip count from buffer ' + str(st.trip) if st.trip >= 0 else ''}")
            subs = [st.body.steps]
        out.append({"depth": depth, "op": st.op, "name": name, "graphed": st.graphed, "text": text})
        for sub in subs:
            out += describe_regions(sub, depth + 1)
    return out
