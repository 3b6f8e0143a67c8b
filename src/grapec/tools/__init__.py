"""What users run: the `grapec` command line (cli.py) and what it drives: check (against
onnxruntime), bench (against the peers), show/inspect, calibrate (a device profile), and the ONNX
backend-test adapter (onnx_backend.py). The top floor: nothing below imports it."""
