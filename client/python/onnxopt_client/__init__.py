"""Python client of onnxopt-server: optimize a model in one call (Client.optimize: upload with its
external data, run a job, ride out server restarts, download the verified result), or step by step.

Install from the repository: `pip install --no-build-isolation ./client/python` (docs/python.md); the
build generates the gRPC stubs from proto/ into the package `onnxopt.v1`."""
from onnxopt_client.client import Client, OnnxoptError, OptimizeResult, UploadResult, find_input_files, to_dict

__all__ = ["Client", "OnnxoptError", "OptimizeResult", "UploadResult", "find_input_files", "to_dict"]
