"""onnxopt_client.Client: the calls an MLOps pipeline makes, over the generated gRPC stubs.

    client = Client("127.0.0.1:50051")
    model = client.upload_model("model.onnx")              # resumable chunks, SHA-256 verified
    job = client.create_job(model, {"preset": "auto"})    # the config as a dict (protobuf JSON names)
    job = client.wait(job.name, on_event=print)            # streams progress until the job ends
    client.download(job.name, "model.optimized.onnx")      # and "report.json"; checked against the job

Errors are OnnxoptError with the gRPC status code name ("INVALID_ARGUMENT") and the server's message,
which starts with a stable reason ("MODEL_PARSE_FAILED: ...").
"""
import dataclasses
import hashlib
import os
import secrets
import time
from typing import Callable, Dict, Iterable, Iterator, List, Optional

import grpc
from google.protobuf import json_format

from onnxopt.v1 import config_pb2, service_pb2, service_pb2_grpc

CHUNK_BYTES = 1 << 20  # what the server's docs call a good size
UPLOAD_ATTEMPTS = 3    # an upload that broke off is resumed this many times


class OnnxoptError(Exception):
    """A call the server refused or could not serve: `code` is the gRPC status name."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclasses.dataclass
class UploadResult:
    sha256: str
    size: int
    resumed_from: int  # bytes the server already held for this upload session (0: a fresh upload)


def sha256_of_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            digest.update(block)
    return digest.hexdigest()


def _error(e: grpc.RpcError) -> OnnxoptError:
    return OnnxoptError(e.code().name, e.details() or "")


def _read(path: Optional[str]) -> Optional[bytes]:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds "authorization: Bearer <token>" to every call."""

    def __init__(self, token: str):
        self._header = ("authorization", "Bearer " + token)

    def _with_token(self, details):
        return _CallDetails(details.method, details.timeout, list(details.metadata or []) + [self._header],
                            details.credentials, getattr(details, "wait_for_ready", None),
                            getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._with_token(details), requests)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression


class Client:
    """`tls_ca` (PEM: the CA that signed the server's certificate; else $ONNXOPT_TLS_CA) turns TLS on,
    `tls_cert`/`tls_key` add a client certificate for servers that require one (mutual TLS; else
    $ONNXOPT_TLS_CERT/$ONNXOPT_TLS_KEY). None of them: plaintext. `channel` overrides all of this.
    `token` (else $ONNXOPT_TOKEN) is sent as a bearer token, for servers with --auth_tokens_file."""

    def __init__(self, address: Optional[str] = None, channel: Optional[grpc.Channel] = None,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 token: Optional[str] = None):
        address = address or os.environ.get("ONNXOPT_SERVER", "127.0.0.1:50051")
        tls_ca = tls_ca or os.environ.get("ONNXOPT_TLS_CA")
        tls_cert = tls_cert or os.environ.get("ONNXOPT_TLS_CERT")
        tls_key = tls_key or os.environ.get("ONNXOPT_TLS_KEY")
        if bool(tls_cert) != bool(tls_key):
            raise OnnxoptError("INVALID_ARGUMENT", "a client certificate needs its key: give tls_cert and tls_key")
        options = [("grpc.max_receive_message_length", 64 << 20)]
        if channel is None and (tls_ca or tls_cert):
            credentials = grpc.ssl_channel_credentials(root_certificates=_read(tls_ca), private_key=_read(tls_key),
                                                       certificate_chain=_read(tls_cert))
            channel = grpc.secure_channel(address, credentials, options=options)
        self._channel = channel or grpc.insecure_channel(address, options=options)
        token = token or os.environ.get("ONNXOPT_TOKEN")
        calls = grpc.intercept_channel(self._channel, _BearerToken(token)) if token else self._channel
        self._stub = service_pb2_grpc.OptimizerStub(calls)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # Uploads ---------------------------------------------------------------------------------------

    def upload_file(self, path: str, upload_id: Optional[str] = None,
                    progress: Optional[Callable[[int, int], None]] = None) -> UploadResult:
        """Uploads one blob. The session `upload_id` (random unless given) lets this call, or a later
        one with the same id, resume from what the server holds (GetUploadStatus)."""
        digest = sha256_of_file(path)
        total = os.path.getsize(path)
        upload_id = upload_id or secrets.token_urlsafe(24)
        resumed_from = 0
        last_error: Optional[OnnxoptError] = None
        for attempt in range(UPLOAD_ATTEMPTS):
            try:
                status = self._stub.GetUploadStatus(
                    service_pb2.GetUploadStatusRequest(sha256=digest, upload_id=upload_id))
            except grpc.RpcError as e:
                raise _error(e) from None
            if status.complete:
                return UploadResult(digest, total, total)
            offset = status.committed_size if status.committed_size <= total else 0
            if attempt == 0:
                resumed_from = offset
            try:
                self._stub.UploadBlob(self._chunks(path, digest, total, upload_id, offset, progress))
                return UploadResult(digest, total, resumed_from)
            except grpc.RpcError as e:
                last_error = _error(e)
                # Connection lost, or the server still holds the broken stream: wait, then resume.
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED):
                    raise last_error from None
                time.sleep(0.25 * (attempt + 1))
        raise last_error

    @staticmethod
    def _chunks(path: str, digest: str, total: int, upload_id: str, offset: int,
                progress: Optional[Callable[[int, int], None]]) -> Iterator[service_pb2.UploadBlobRequest]:
        with open(path, "rb") as f:
            f.seek(offset)
            first = True
            while True:
                data = f.read(CHUNK_BYTES)
                request = service_pb2.UploadBlobRequest(offset=offset, data=data,
                                                        finish_write=offset + len(data) >= total)
                if first:
                    request.sha256, request.total_size, request.upload_id = digest, total, upload_id
                    first = False
                yield request
                offset += len(data)
                if progress:
                    progress(offset, total)
                if offset >= total or not data:
                    return

    def upload_model(self, path: str, external_data: Iterable[str] = (),
                     progress: Optional[Callable[[int, int], None]] = None) -> service_pb2.ModelRef:
        """Uploads a model and the external data files it names (paths; the model refers to them by
        their path relative to its own folder)."""
        reference = service_pb2.ModelRef(display_name=os.path.basename(path))
        reference.sha256 = self.upload_file(path, progress=progress).sha256
        folder = os.path.dirname(os.path.abspath(path))
        for data_path in external_data:
            name = os.path.relpath(os.path.abspath(data_path), folder)
            if name.startswith(".."):
                raise OnnxoptError("INVALID_ARGUMENT", f"{data_path} is not inside the model's folder")
            reference.external_data.add(name=name, sha256=self.upload_file(data_path).sha256)
        return reference

    # Jobs -------------------------------------------------------------------------------------------

    def create_job(self, model: service_pb2.ModelRef, config: Optional[Dict] = None,
                   request_id: str = "") -> service_pb2.Job:
        """Queues a job; `config` is an OptimizationConfig as a dict in protobuf JSON form."""
        parsed = config_pb2.OptimizationConfig()
        try:
            json_format.ParseDict(config or {}, parsed)
        except json_format.ParseError as e:
            raise OnnxoptError("INVALID_ARGUMENT", f"CONFIG_INVALID: {e}") from None
        return self._call(self._stub.CreateJob,
                          service_pb2.CreateJobRequest(model=model, config=parsed, request_id=request_id))

    def get_job(self, name: str) -> service_pb2.Job:
        return self._call(self._stub.GetJob, service_pb2.GetJobRequest(name=name))

    def cancel_job(self, name: str) -> service_pb2.Job:
        return self._call(self._stub.CancelJob, service_pb2.CancelJobRequest(name=name))

    def delete_job(self, name: str) -> service_pb2.DeleteJobResponse:
        """Deletes a finished job, its artifacts and the blobs no other job uses."""
        return self._call(self._stub.DeleteJob, service_pb2.DeleteJobRequest(name=name))

    def list_jobs(self, page_size: int = 0, page_token: str = "") -> service_pb2.ListJobsResponse:
        return self._call(self._stub.ListJobs, service_pb2.ListJobsRequest(page_size=page_size, page_token=page_token))

    def wait(self, name: str, on_event: Optional[Callable[[service_pb2.Job], None]] = None) -> service_pb2.Job:
        """Streams the job's changes until it ends; returns the final job."""
        last = None
        try:
            for event in self._stub.WatchJob(service_pb2.WatchJobRequest(name=name)):
                last = event.job
                if on_event:
                    on_event(last)
        except grpc.RpcError as e:
            raise _error(e) from None
        return last if last is not None else self.get_job(name)

    def report(self, name: str):
        return self._call(self._stub.GetReport, service_pb2.GetReportRequest(name=name))

    def download(self, name: str, path: str, artifact: str = "model.onnx") -> str:
        """Writes one artifact of a finished job to `path` (through a temporary file, renamed once its
        SHA-256 matches); returns the SHA-256."""
        temporary = f"{path}.part-{os.getpid()}"
        digest, expected = hashlib.sha256(), ""
        try:
            with open(temporary, "wb") as f:
                for chunk in self._stub.Download(service_pb2.DownloadRequest(name=name, artifact=artifact)):
                    expected = expected or chunk.sha256
                    digest.update(chunk.data)
                    f.write(chunk.data)
            if expected and digest.hexdigest() != expected:
                raise OnnxoptError("DATA_LOSS", f"{artifact}: sha256 {digest.hexdigest()} != {expected}")
            os.replace(temporary, path)
        except grpc.RpcError as e:
            raise _error(e) from None
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
        return digest.hexdigest()

    def server_info(self) -> service_pb2.ServerInfo:
        return self._call(self._stub.GetServerInfo, service_pb2.GetServerInfoRequest())

    @staticmethod
    def _call(method, request):
        try:
            return method(request)
        except grpc.RpcError as e:
            raise _error(e) from None


def to_dict(message) -> Dict:
    """A response as a dict with the proto's field names (what `onnxopt ... --json` prints)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
