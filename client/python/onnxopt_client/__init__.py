"""Python client of onnxopt-server: upload a model (resumable, SHA-256 checked), run a job, watch it,
download the result. The gRPC stubs are generated from proto/ at build time into build/python
(put it on PYTHONPATH next to this package)."""
from onnxopt_client.client import Client, OnnxoptError, UploadResult

__all__ = ["Client", "OnnxoptError", "UploadResult"]
