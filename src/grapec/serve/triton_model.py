"""A grapec bundle served by Triton Inference Server's Python backend (written by
`grapec export-triton` as REPO/<name>/1/model.py; grapec must be installed in the server's Python).

Each instance loads the bundle once: on the GPU Triton gives it (KIND_GPU: one instance per GPU and
count), or on the CPU backend (KIND_CPU). On the GPU it builds every size's CUDA graph as it loads
(parameter grapec_build_graphs, "true" unless set to "false"). A request's inputs are fed to `Session.run` as they come;
an input grapec refuses (a wrong shape, a token id outside the vocabulary) fails that request with
grapec's message, and the other requests of the batch still run.
"""
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import grapec
        from grapec.errors import GrapecError
        self.GrapecError = GrapecError
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        backend = params.get("grapec_backend", "cpu")
        path = os.path.join(args["model_repository"], args["model_version"], params.get("grapec_bundle", "model.grape"))
        device = int(args.get("model_instance_device_id") or 0) if backend == "cuda" else 0
        self.session = grapec.load(path, backend=backend, device=device)
        if params.get("grapec_build_graphs", "true").lower() == "true":
            self.session.build_graphs()   # a range bundle's sizes: built now, not at their first request
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [o["name"] for o in config["output"]]
        # scalars travel as [1] (Triton has no rank 0 without batching): reshaped on the way in and out
        self.scalars = {i.name for i in self.session.get_inputs() if i.shape == []}
        self.scalars |= {f for f, v in self.session.fixed_inputs.items() if v.ndim == 0}

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                feeds = {}
                for name in self.inputs:
                    tensor = pb_utils.get_input_tensor_by_name(request, name)
                    if tensor is not None:
                        a = tensor.as_numpy()
                        feeds[name] = a.reshape(()) if name in self.scalars and a.size == 1 else a
                outs = self.session.run(feeds)
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor(name, np.ascontiguousarray(outs[name]).reshape(np.shape(outs[name]) or (1,)))
                     for name in self.outputs]))
            except self.GrapecError as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
            except Exception as e:  # noqa: BLE001 - the request fails with a message; the server stays up
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"internal error: {type(e).__name__}: {e}")))
        return responses

    def finalize(self):
        self.session.close()
