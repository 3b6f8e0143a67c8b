"""The CUDA backend: plans replayed as CUDA graphs (runner.py) over the driver API (driver.py), GEMMs
through cuBLASLt (blas.py)."""
