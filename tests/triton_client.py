"""Requests to a Triton server over HTTP with tritonclient, run in the Triton venv (numpy<2):

    python triton_client.py URL MODEL REQUESTS.npz RESULTS.npz

REQUESTS.npz holds arrays named "<request>/<input>"; the requests are all sent before the first
answer is read (async_infer: the client's connection pool sends them at once). RESULTS.npz gets "<request>/<output>" for each answer, and "<request>/error" (the server's
message) for each refusal; "config" holds the model's config as the server reports it (JSON).
"""
import json
import sys

import numpy as np
import tritonclient.http as http
from tritonclient.utils import InferenceServerException, np_to_triton_dtype


def main(url, model, requests_path, results_path):
    data = np.load(requests_path)
    requests: dict = {}
    for key in data.files:
        req, name = key.split("/", 1)
        requests.setdefault(req, {})[name] = data[key]
    client = http.InferenceServerClient(url, concurrency=len(requests))
    config = client.get_model_config(model)
    outputs = [o["name"] for o in config["output"]]
    results = {"config": np.array(json.dumps(config))}
    pending = {}
    for req, feeds in requests.items():
        inputs = []
        for name, a in feeds.items():
            i = http.InferInput(name, list(a.shape), np_to_triton_dtype(a.dtype))
            i.set_data_from_numpy(a, binary_data=True)
            inputs.append(i)
        pending[req] = client.async_infer(model, inputs,
                                          outputs=[http.InferRequestedOutput(o, binary_data=True) for o in outputs])
    for req, p in pending.items():
        try:
            r = p.get_result()
            results.update({f"{req}/{o}": r.as_numpy(o) for o in outputs})
        except InferenceServerException as e:
            results[f"{req}/error"] = np.array(e.message())
    np.savez(results_path, **results)


if __name__ == "__main__":
    main(*sys.argv[1:])
