"""grapec: compile ONNX models into CUDA-graph bundles, and run them.

    bundle = grapec.compile("model.onnx", shapes={"input_ids": (1, 128)})
    bundle.write("model.grape")
    session = grapec.load("model.grape", backend="cpu")      # or "cuda"
    outputs = session.run({"input_ids": ids})                  # name -> numpy array

    # a decoder (input_ids, attention_mask, past_key_values.*): its whole generation, one launch
    bundle = grapec.compile("decoder.onnx", dims={"batch": 1, "prompt": 64}, generate=128)
    grapec.generate(grapec.load(bundle), [[1, 15, 8]], eos_token_id=2).tokens
"""
__version__ = "0.1.0"


def compile(model, shapes=None, dims=None, **options):
    """Compile an ONNX model (path or ModelProto) into a Bundle. See grapec.compiler.compile_model."""
    from . import compiler
    return compiler.compile_model(model, shapes=shapes, dims=dims, **options)


def load(bundle, backend: str = "cpu", device: int = 0, max_graphs: int | None = None,
         graph_memory: int | None = None, concurrency: int = 1):
    """Load a bundle (path, bytes or Bundle) into a Session that runs it, on GPU `device` (its
    ordinal) for the CUDA backend. concurrency: runs in flight at once from several threads, each
    with its own arena (and on the GPU its own stream and graphs) over one copy of the weights; more
    threads than that wait their turn (runtime/session.py). CUDA backend: the buckets of one launch
    structure share one instantiated graph (runtime/cuda/shared_exec.py), at most `max_graphs` of
    them if given; buckets that cannot share keep instantiated graphs for at most `max_graphs`
    buckets per runner [default 8], within `graph_memory` bytes if given, and a run of another bucket
    patches the least recently run one's graph (runtime/cuda/runner.py)."""
    from .runtime.session import Session
    return Session.load(bundle, backend=backend, device=device, max_graphs=max_graphs, graph_memory=graph_memory,
                        concurrency=concurrency)


def generate(session, prompts, max_new_tokens=None, eos_token_id=None, temperature=None, top_p=None, seed=None):
    """Generation with a bundle compiled from a decoder with --generate N (one launch for the whole
    loop): prompts (lists of token ids) in, a Generation whose .tokens holds each row's new ids. Greedy,
    or sampled (temperature, top_p, seed) where it was compiled with --top-k. See grapec.runtime.generation."""
    from .runtime.generation import generate as run_generation
    return run_generation(session, prompts, max_new_tokens, eos_token_id, temperature, top_p, seed)


def stream(session, prompts, max_new_tokens=None, eos_token_id=None, temperature=None, top_p=None, seed=None):
    """generate(), its tokens handed over as the one launch makes them: an iterator of lists, one per
    prompt, of each row's new ids since the last item; its .result is generate()'s Generation once it
    has ended. See grapec.runtime.generation.stream."""
    from .runtime.generation import stream as run_stream
    return run_stream(session, prompts, max_new_tokens, eos_token_id, temperature, top_p, seed)
