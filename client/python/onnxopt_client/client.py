"""onnxopt_client.Client: the calls an MLOps pipeline makes, over the generated gRPC stubs.

    client = Client("127.0.0.1:50051")
    result = client.optimize("bert.onnx", "out/bert.onnx", {"preset": "auto"}, labels={"team": "search"})
    result.report["parity"]["passed"]                      # out/bert.onnx(.data, .report.json) written

optimize() is the whole round trip, and survives a server restart; the steps it is made of are there too:

    model = client.upload_model("bert.onnx")               # and its external data; resumable, SHA-256 checked
    job = client.create_job(model, {"preset": "auto"})    # the config as a dict (protobuf JSON names)
    job = client.wait(job.name, on_event=print)            # streams progress until the job ends
    client.download(job.name, "model.optimized.onnx")      # and "report.json"; checked against the job

Errors are OnnxoptError with the gRPC status code name ("INVALID_ARGUMENT") and the server's message,
which starts with a stable reason ("MODEL_PARSE_FAILED: ...").
"""
import dataclasses
import hashlib
import io
import json
import os
import random
import secrets
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Union

import grpc
from google.protobuf import json_format

from onnxopt.v1 import config_pb2, errors_pb2, report_pb2, service_pb2, service_pb2_grpc
from onnxopt_client import onnx_wire

try:  # where it exists: one process at a time resumes a partial download
    import fcntl
except ImportError:  # Windows
    fcntl = None

CHUNK_BYTES = 1 << 20  # what the server's docs call a good size
UPLOAD_ATTEMPTS = 3    # an upload that broke off is resumed this many times (upload_file)
MAX_RESUBMISSIONS = 100  # a request that failed is run again under the next id of its series, this often
# Without an overall timeout, calls that reconnect give up after the server was unreachable this long.
RECONNECT_PATIENCE_S = 300.0
TERMINAL = (service_pb2.SUCCEEDED, service_pb2.FAILED, service_pb2.CANCELLED)
MODEL_FILE = "model.onnx"  # the optimized model's artifact: what download() fetches by default
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}  # google.rpc.Code -> "NOT_FOUND"

# What optimize()'s `inputs` takes: a folder as the CLI's --inputs reads it, one sample as a dict,
# or several; a value is a numpy array, a serialized TensorProto (bytes) or the path of a .pb file.
InputValue = Any
Inputs = Union[str, os.PathLike, Mapping[str, InputValue], Sequence[Mapping[str, InputValue]]]


class OnnxoptError(Exception):
    """A call the server refused or could not serve: `code` is the gRPC status name. For a job that
    ended FAILED or CANCELLED, `job` is that job (its error's reason starts the message)."""

    def __init__(self, code: str, message: str, job: Optional[service_pb2.Job] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.job = job


@dataclasses.dataclass
class UploadResult:
    sha256: str
    size: int
    resumed_from: int  # bytes the server already held for this upload session (0: a fresh upload)


@dataclasses.dataclass(repr=False)
class OptimizeResult:
    job: service_pb2.Job      # the finished job (labels, result: nodes, parity, speedup, artifacts)
    model: str                # the optimized model: `out`
    files: Dict[str, str]     # every artifact's name -> the path it was written to
    report: Dict              # report.json, parsed (the benchmark's raw latency samples included)

    @property
    def report_path(self) -> str:
        return self.files["report.json"]

    def __repr__(self) -> str:
        # What the CLI prints after `onnxopt submit`; the report (possibly 100,000 latency samples) stays
        # one attribute away.
        result = self.job.result
        parity = "passed" if result.parity_passed else "not checked"
        return (f"OptimizeResult({self.job.name}: {self.model}, report {self.files.get('report.json', '-')}, "
                f"nodes {result.nodes_before} -> {result.nodes_after}, parity {parity}, "
                f"speedup {result.speedup:.3f}x)")


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


def _parse_config(config: Optional[Dict]) -> config_pb2.OptimizationConfig:
    parsed = config_pb2.OptimizationConfig()
    try:
        json_format.ParseDict(config or {}, parsed)
    except json_format.ParseError as e:
        raise OnnxoptError("INVALID_ARGUMENT", f"CONFIG_INVALID: {e}") from None
    return parsed


class _Retry:
    """Calls again after UNAVAILABLE (server restarting, connection lost; and what `codes` adds), with
    exponential backoff and jitter, until the overall deadline (`timeout` seconds from now), `attempts`
    tries, or RECONNECT_PATIENCE_S of unbroken failure, then raises the last error."""

    def __init__(self, timeout: Optional[float] = None, attempts: Optional[int] = None):
        self._at = None if timeout is None else time.monotonic() + timeout
        self._attempts = attempts
        self.reset()

    def reset(self) -> None:
        """Progress was made: the next failure starts a fresh backoff."""
        self._delay, self._failures, self._failing_since = 0.2, 0, None

    def remaining(self) -> Optional[float]:
        """Seconds left for the next call (its gRPC timeout); None without a deadline."""
        if self._at is None:
            return None
        left = self._at - time.monotonic()
        if left <= 0:
            raise OnnxoptError("DEADLINE_EXCEEDED", "the call's timeout passed")
        return left

    def wait(self, error: Optional[grpc.RpcError],
             codes: Iterable[grpc.StatusCode] = (grpc.StatusCode.UNAVAILABLE,)) -> None:
        """Returns after a backoff if `error` (None: a stream that ended early) may be retried, else raises it."""
        failure = _error(error) if error is not None else OnnxoptError("UNAVAILABLE", "the stream ended early")
        if error is not None and error.code() not in codes:
            raise failure from None
        if error is not None and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED and self._at is not None \
                and time.monotonic() >= self._at:
            raise failure from None  # our own deadline, not one stream's
        now = time.monotonic()
        self._failing_since = self._failing_since or now
        self._failures += 1
        if (self._attempts is not None and self._failures >= self._attempts) or \
                (self._at is None and now - self._failing_since > RECONNECT_PATIENCE_S):
            raise failure from None
        pause = self._delay * random.uniform(0.5, 1.0)
        if self._at is not None and now + pause >= self._at:
            raise failure from None
        time.sleep(pause)
        self._delay = min(self._delay * 2, 5.0)

    def call(self, method, request, codes=(grpc.StatusCode.UNAVAILABLE,)):
        """A unary call, retried."""
        while True:
            try:
                return method(request, timeout=self.remaining())
            except grpc.RpcError as e:
                self.wait(e, codes)


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
    `token` (else $ONNXOPT_TOKEN) is sent as a bearer token, for servers with --auth-tokens-file."""

    def __init__(self, address: Optional[str] = None, channel: Optional[grpc.Channel] = None,
                 tls_ca: Optional[str] = None, tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 token: Optional[str] = None):
        address = address or os.environ.get("ONNXOPT_SERVER", "127.0.0.1:50051")
        tls_ca = tls_ca or os.environ.get("ONNXOPT_TLS_CA")
        tls_cert = tls_cert or os.environ.get("ONNXOPT_TLS_CERT")
        tls_key = tls_key or os.environ.get("ONNXOPT_TLS_KEY")
        if bool(tls_cert) != bool(tls_key):
            raise OnnxoptError("INVALID_ARGUMENT", "a client certificate needs its key: give tls_cert and tls_key")
        # gRPC's own reconnect backoff grows to 2 minutes; capped, a restarted server is found within
        # seconds by the calls that retry (optimize, wait, download).
        options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.initial_reconnect_backoff_ms", 200),
                   ("grpc.min_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 2000)]
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

    # The whole round trip ---------------------------------------------------------------------------

    def optimize(self, model: str, out: str, config: Optional[Dict] = None, inputs: Optional[Inputs] = None,
                 labels: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
                 request_id: Optional[str] = None,
                 on_event: Optional[Callable[[service_pb2.Job], None]] = None) -> OptimizeResult:
        """Optimizes the model at `model` (its external data files found and uploaded with it) and writes
        the result as the CLI's `onnxopt submit MODEL -o OUT` does: the model to `out`, its data file
        to OUT.data (the model rewritten to name it), an adapter to OUT-without-extension.onnx_adapter,
        the report to OUT.report.json, other artifacts beside `out` under their own names. Every file
        is checked against the job's size and SHA-256 and appears only whole; the model last.

        `inputs`: real inputs for validation (see Inputs). `labels`: the job's labels. `timeout`:
        seconds for the whole call. The job's request_id defaults to a digest of everything that
        makes the request (model, data files, inputs, config, labels), so calling optimize() again
        after a crash or a timeout attaches to the same job instead of starting another; pass another
        `request_id` to run the same request anew. Connection loss and server restarts are ridden out
        with backoff (uploads and downloads resume where they stopped). A job that ends FAILED or
        CANCELLED raises OnnxoptError with its code and reason, the job attached."""
        retry = _Retry(timeout)
        reference = self._upload_model(model, (), None, retry)
        tensors = self._upload_inputs(inputs, retry) if inputs is not None else []
        parsed = _parse_config(config)
        labels = dict(labels or {})
        request = service_pb2.CreateJobRequest(model=reference, config=parsed, inputs=tensors, labels=labels,
                                               request_id=request_id or "")
        if request_id:
            job = retry.call(self._stub.CreateJob, request)
        else:
            # The same request again finds its job, queued, running or succeeded; one that failed or was
            # cancelled is run again under the next id of the series (as the CLI does).
            base = _request_id(reference, parsed, tensors, labels)
            for attempt in range(1, MAX_RESUBMISSIONS + 1):
                request.request_id = base if attempt == 1 else f"{base}-{attempt}"
                job = retry.call(self._stub.CreateJob, request)
                if job.state not in (service_pb2.FAILED, service_pb2.CANCELLED):
                    break
        job = self._watch(job.name, on_event, retry)
        if job.state != service_pb2.SUCCEEDED:
            state = service_pb2.JobState.Name(job.state)
            code = _CODE_NAMES.get(job.error.code, "UNKNOWN") if job.HasField("error") else state
            reason = (f"{errors_pb2.ErrorReason.Reason.Name(job.error.reason)}: {job.error.message}"
                      if job.HasField("error") else f"the job ended {state}")
            raise OnnxoptError(code, f"{job.name} {state}: {reason}", job=job)
        files = self._download_result(job, out, retry)
        by_role = {artifact.role: files[artifact.name] for artifact in job.result.artifacts}
        report: Dict = {}
        if report_pb2.ARTIFACT_REPORT in by_role:
            with open(by_role[report_pb2.ARTIFACT_REPORT], encoding="utf-8") as f:
                report = json.load(f)
        return OptimizeResult(job=job, model=by_role.get(report_pb2.ARTIFACT_MODEL, os.path.abspath(out)), files=files,
                              report=report)

    # Uploads ---------------------------------------------------------------------------------------

    def upload_file(self, path: str, upload_id: Optional[str] = None,
                    progress: Optional[Callable[[int, int], None]] = None) -> UploadResult:
        """Uploads one blob. The session `upload_id` (random unless given) lets this call, or a later
        one with the same id, resume from what the server holds (GetUploadStatus)."""
        return self._upload(path, upload_id, progress, _Retry(attempts=UPLOAD_ATTEMPTS))

    def _upload(self, source: Union[str, bytes], upload_id: Optional[str],
                progress: Optional[Callable[[int, int], None]], retry: _Retry) -> UploadResult:
        """`source`: a path, or the bytes themselves."""
        if isinstance(source, bytes):
            digest, total = hashlib.sha256(source).hexdigest(), len(source)
        else:
            digest, total = sha256_of_file(source), os.path.getsize(source)
        upload_id = upload_id or secrets.token_urlsafe(24)
        resumed_from: Optional[int] = None
        # Connection lost, or the server still holds the broken stream of this session (ABORTED): wait, resume.
        codes = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED)
        while True:
            status = retry.call(self._stub.GetUploadStatus,
                                service_pb2.GetUploadStatusRequest(sha256=digest, upload_id=upload_id), codes)
            if status.complete:
                return UploadResult(digest, total, total if resumed_from is None else resumed_from)
            offset = status.committed_size if status.committed_size <= total else 0
            resumed_from = offset if resumed_from is None else resumed_from
            try:
                self._stub.UploadBlob(self._chunks(source, digest, total, upload_id, offset, progress),
                                      timeout=retry.remaining())
                return UploadResult(digest, total, resumed_from)
            except grpc.RpcError as e:
                retry.wait(e, codes)

    @staticmethod
    def _chunks(source: Union[str, bytes], digest: str, total: int, upload_id: str, offset: int,
                progress: Optional[Callable[[int, int], None]]) -> Iterator[service_pb2.UploadBlobRequest]:
        with (io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")) as f:
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
        """Uploads a model and the external data files its tensors name (found in the model itself:
        relative paths inside the model's folder; absolute ones, "..", and links are refused).
        `external_data` may add files the model does not name (paths inside its folder)."""
        return self._upload_model(path, external_data, progress, _Retry(attempts=UPLOAD_ATTEMPTS))

    def _upload_model(self, path: str, external_data: Iterable[str],
                      progress: Optional[Callable[[int, int], None]], retry: _Retry) -> service_pb2.ModelRef:
        with open(path, "rb") as f:
            content = f.read()
        try:
            locations = onnx_wire.external_data_locations(content)
        except onnx_wire.WireError as e:
            raise OnnxoptError("INVALID_ARGUMENT", f"MODEL_PARSE_FAILED: {path} is not an ONNX model ({e})") from None
        folder = os.path.dirname(os.path.abspath(path))
        files: Dict[str, str] = {}
        for location in locations:
            try:
                files[location] = onnx_wire.check_location(folder, location)
            except ValueError as e:
                raise OnnxoptError("INVALID_ARGUMENT", f"{path}: {e}") from None
        for data_path in external_data:
            name = os.path.relpath(os.path.abspath(data_path), folder)
            if name.startswith(".."):
                raise OnnxoptError("INVALID_ARGUMENT", f"{data_path} is not inside the model's folder")
            files.setdefault(name.replace(os.sep, "/"), data_path)
        reference = service_pb2.ModelRef(display_name=os.path.basename(path))
        # Data first, as the CLI does: the server sees the model only once what it names is there.
        for name, data_path in sorted(files.items()):
            reference.external_data.add(name=name, sha256=self._upload(data_path, None, progress, retry).sha256)
        reference.sha256 = self._upload(content, None, progress, retry).sha256
        return reference

    def _upload_inputs(self, inputs: Inputs, retry: _Retry) -> List[service_pb2.InputTensor]:
        tensors = []
        for sample, tensor_set in enumerate(_input_sets(inputs)):
            for name, serialized in sorted(tensor_set.items()):
                digest = self._upload(serialized, None, None, retry).sha256
                tensors.append(service_pb2.InputTensor(sample=sample, name=name, sha256=digest))
        return tensors

    # Jobs -------------------------------------------------------------------------------------------

    def create_job(self, model: service_pb2.ModelRef, config: Optional[Dict] = None,
                   request_id: str = "", labels: Optional[Dict[str, str]] = None,
                   inputs: Iterable[service_pb2.InputTensor] = ()) -> service_pb2.Job:
        """Queues a job; `config` is an OptimizationConfig as a dict in protobuf JSON form. `labels`
        (at most 32; keys of a-z 0-9 - _ . /) are kept on the job and find it with list_jobs."""
        return self._call(self._stub.CreateJob,
                          service_pb2.CreateJobRequest(model=model, config=_parse_config(config), request_id=request_id,
                                                       labels=labels or {}, inputs=list(inputs)))

    def get_job(self, name: str) -> service_pb2.Job:
        return self._call(self._stub.GetJob, service_pb2.GetJobRequest(name=name))

    def cancel_job(self, name: str) -> service_pb2.Job:
        return self._call(self._stub.CancelJob, service_pb2.CancelJobRequest(name=name))

    def delete_job(self, name: str) -> service_pb2.DeleteJobResponse:
        """Deletes a finished job, its artifacts and the blobs no other job uses."""
        return self._call(self._stub.DeleteJob, service_pb2.DeleteJobRequest(name=name))

    def list_jobs(self, page_size: int = 0, page_token: str = "", labels: Optional[Dict[str, str]] = None,
                  state: int = service_pb2.JOB_STATE_UNSPECIFIED) -> service_pb2.ListJobsResponse:
        """A page of jobs, newest first; only those carrying every one of `labels` (and in `state`)."""
        return self._call(self._stub.ListJobs, service_pb2.ListJobsRequest(page_size=page_size, page_token=page_token,
                                                                           labels=labels or {}, state=state))

    def wait(self, name: str, on_event: Optional[Callable[[service_pb2.Job], None]] = None,
             timeout: Optional[float] = None) -> service_pb2.Job:
        """Streams the job's changes until it ends; returns the final job. Reconnects (with backoff)
        when the server goes away, for `timeout` seconds in all, else RECONNECT_PATIENCE_S per outage."""
        return self._watch(name, on_event, _Retry(timeout))

    def _watch(self, name: str, on_event: Optional[Callable[[service_pb2.Job], None]],
               retry: _Retry) -> service_pb2.Job:
        # A stream also ends with DEADLINE_EXCEEDED where a proxy limits its life: watch again.
        codes = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        while True:
            try:
                for event in self._stub.WatchJob(service_pb2.WatchJobRequest(name=name), timeout=retry.remaining()):
                    retry.reset()
                    if on_event:
                        on_event(event.job)
                    if event.job.state in TERMINAL:
                        return event.job
                retry.wait(None)  # the stream ended before the job did (a server shutting down)
            except grpc.RpcError as e:
                retry.wait(e, codes)

    def report(self, name: str):
        return self._call(self._stub.GetReport, service_pb2.GetReportRequest(name=name))

    # Downloads --------------------------------------------------------------------------------------

    def download(self, name: str, path: str, artifact: str = MODEL_FILE, timeout: Optional[float] = None) -> str:
        """Writes one artifact of a finished job to `path` and returns its SHA-256. The bytes go to a
        hidden file beside `path`, resumed from where it stopped after a lost connection (also by a
        later call), renamed to `path` once size and SHA-256 match."""
        part = _part_path(path, "")
        digest = self._fetch(name, artifact, part, None, "", _Retry(timeout))
        os.replace(part, path)
        return digest

    def _fetch(self, name: str, artifact: str, part: str, size: Optional[int], sha256: str, retry: _Retry) -> str:
        """Makes `part` hold the artifact, appending to what it already holds (DownloadRequest.offset);
        `size` and `sha256` as the job lists them (None, "": learnt from the stream). Returns the SHA-256."""
        os.makedirs(os.path.dirname(part), exist_ok=True)
        try:
            return self._fetch_into(name, artifact, part, size, sha256, retry)
        except BaseException:
            if os.path.exists(part) and os.path.getsize(part) == 0:
                os.remove(part)  # nothing worth resuming
            raise

    def _fetch_into(self, name: str, artifact: str, part: str, size: Optional[int], sha256: str,
                    retry: _Retry) -> str:
        with open(part, "ab") as f:
            if fcntl is not None:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    raise OnnxoptError("ABORTED", f"another process is downloading {part}") from None
            # Bytes held from before this call may be stale (another job's, a changed artifact): on a
            # mismatch they are dropped and the download starts over once.
            restart_allowed = f.tell() > 0
            while True:
                held = f.tell()
                if size is not None and held > size:
                    f.truncate(0)
                    f.seek(0)
                    continue
                total = self._stream_into(f, name, artifact, held, retry)
                size = size if size is not None else total.get("size")
                sha256 = sha256 or total.get("sha256", "")
                f.flush()
                got = sha256_of_file(part)
                if (size is None or f.tell() == size) and (not sha256 or got == sha256):
                    return got
                if not restart_allowed:
                    break
                restart_allowed = False
                f.truncate(0)
                f.seek(0)
        os.remove(part)
        raise OnnxoptError("DATA_LOSS", f"CHECKSUM_MISMATCH: downloaded {artifact} of {name} does not match its "
                                        f"size ({size}) and SHA-256 ({sha256})")

    def _stream_into(self, f, name: str, artifact: str, held: int, retry: _Retry) -> Dict:
        """Appends the artifact from offset `held` on, reconnecting after UNAVAILABLE; returns the
        size and SHA-256 the server announced."""
        announced: Dict = {}
        while True:
            request = service_pb2.DownloadRequest(name=name, artifact=artifact, offset=held)
            try:
                for chunk in self._stub.Download(request, timeout=retry.remaining()):
                    if chunk.offset != held:
                        raise OnnxoptError("DATA_LOSS",
                                           f"download of {artifact}: chunk at {chunk.offset}, expected {held}")
                    announced["size"] = chunk.total_size
                    if chunk.sha256:
                        announced["sha256"] = chunk.sha256
                    f.write(chunk.data)
                    held += len(chunk.data)
                    retry.reset()
                return announced
            except grpc.RpcError as e:
                f.flush()
                if e.code() == grpc.StatusCode.OUT_OF_RANGE and held > 0:
                    return announced  # more bytes held than the artifact has: the caller starts over
                if e.code() == grpc.StatusCode.DATA_LOSS:
                    f.truncate(0)  # the server says these bytes are bad (ARTIFACT_CORRUPT): nothing to resume
                retry.wait(e, (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED))

    def _download_result(self, job: service_pb2.Job, out: str, retry: _Retry) -> Dict[str, str]:
        """The job's artifacts where the CLI puts them (see optimize), placed by role, every one verified
        before any is renamed into place, the model last. Returns each artifact's name -> its path."""
        out = os.path.abspath(out)
        folder, base = os.path.dirname(out), os.path.basename(out)
        os.makedirs(folder, exist_ok=True)
        placed = {
            report_pb2.ARTIFACT_MODEL: out,
            report_pb2.ARTIFACT_MODEL_DATA: os.path.join(folder, base + ".data"),
            report_pb2.ARTIFACT_ADAPTER: os.path.join(folder, os.path.splitext(base)[0] + ".onnx_adapter"),
            report_pb2.ARTIFACT_REPORT: out + ".report.json",
        }
        targets: Dict[str, str] = {}
        for artifact in job.result.artifacts:
            if artifact.name != os.path.basename(artifact.name) or artifact.name in ("", ".", ".."):
                raise OnnxoptError("DATA_LOSS", f"{job.name} lists an artifact with a path: '{artifact.name}'")
            targets[artifact.name] = placed.get(artifact.role, os.path.join(folder, artifact.name))
        parts = {}
        for artifact in job.result.artifacts:
            part = _part_path(targets[artifact.name], artifact.sha256)
            self._fetch(job.name, artifact.name, part, artifact.size, artifact.sha256, retry)
            parts[artifact.name] = part
        by_role = {artifact.role: artifact.name for artifact in job.result.artifacts}
        model = by_role.get(report_pb2.ARTIFACT_MODEL)
        for name, part in parts.items():
            if name != model:
                os.replace(part, targets[name])
        if model is not None:
            data = by_role.get(report_pb2.ARTIFACT_MODEL_DATA)
            if data is not None and os.path.basename(targets[data]) != data:
                # The model names its data file; the data file was renamed, so the model is rewritten.
                with open(parts[model], "rb") as f:
                    relocated = onnx_wire.relocate_external_data(f.read(), data, os.path.basename(targets[data]))
                with open(parts[model], "wb") as f:
                    f.write(relocated)
            os.replace(parts[model], out)
        return targets

    def server_info(self) -> service_pb2.ServerInfo:
        return self._call(self._stub.GetServerInfo, service_pb2.GetServerInfoRequest())

    @staticmethod
    def _call(method, request):
        try:
            return method(request)
        except grpc.RpcError as e:
            raise _error(e) from None


def _part_path(target: str, sha256: str) -> str:
    """Where a download of `target` collects (hidden, beside it, so the rename stays on one disk), named
    as the CLI names it (client.cc's PartialDownloadPath): the artifact's digest in the name keeps
    partial files of different contents apart; one whose digest is not known yet is "unlisted"."""
    folder, base = os.path.split(os.path.abspath(target))
    return os.path.join(folder, f".{base}.{(sha256 or 'unlisted')[:16]}.partial")


def _request_id(model: service_pb2.ModelRef, config: config_pb2.OptimizationConfig,
                inputs: Sequence[service_pb2.InputTensor], labels: Dict[str, str]) -> str:
    """The same request gives the same id: the server then returns the job it made the first time. The
    CLI's own scheme (client.cc's DefaultRequestId), byte for byte, so that the CLI and this client
    sending the same request get the same job: length-prefixed fields, the config in protobuf's
    deterministic encoding (how a dict was written does not matter)."""
    material = bytearray()

    def add(field: bytes) -> None:
        material.extend(b"%d:%s;" % (len(field), field))

    add(b"onnxopt-request-v1")
    add(model.sha256.encode())
    for name, digest in sorted({(f.name.encode(), f.sha256.encode()) for f in model.external_data}):
        material.extend(b"d%d:%s%s;" % (len(name), name, digest))
    for sample, name, digest in sorted({(t.sample, t.name.encode(), t.sha256.encode()) for t in inputs}):
        material.extend(b"i%d:%d:%s%s;" % (sample, len(name), name, digest))
    for key, value in sorted((k.encode(), v.encode()) for k, v in labels.items()):
        material.extend(b"l%d:%s%d:%s;" % (len(key), key, len(value), value))
    add(config.SerializeToString(deterministic=True))
    return "auto-" + hashlib.sha256(bytes(material)).hexdigest()[:32]


def _input_sets(inputs: Inputs) -> List[Dict[str, bytes]]:
    """optimize()'s `inputs` as serialized TensorProtos per sample."""
    if isinstance(inputs, (str, os.PathLike)):
        return [{name: _read(path) for name, path in tensor_set.items()} for tensor_set in find_input_files(inputs)]
    samples = [inputs] if isinstance(inputs, Mapping) else list(inputs)
    sets = []
    for sample in samples:
        tensor_set = {}
        for name, value in sample.items():
            if isinstance(value, bytes):
                tensor_set[name] = value
            elif hasattr(value, "SerializeToString"):  # an onnx.TensorProto
                tensor_set[name] = value.SerializeToString()
            elif isinstance(value, (str, os.PathLike)):
                tensor_set[name] = _read(os.fspath(value))
            else:  # an array
                try:
                    tensor_set[name] = onnx_wire.encode_tensor(name, value)
                except ValueError as e:
                    raise OnnxoptError("INVALID_ARGUMENT", str(e)) from None
        sets.append(tensor_set)
    return sets


def find_input_files(folder: Union[str, os.PathLike]) -> List[Dict[str, str]]:
    """The CLI's --inputs layout: DIR/NAME.pb (one sample; a tensor's own name, else the file's stem)
    and DIR/test_data_set_N/input_K.pb (a sample each; the tensor must be named). Input name -> path
    per sample, the loose files first."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise OnnxoptError("INVALID_ARGUMENT", f"INPUTS_INVALID: {folder} is not a folder")

    def name_of(path: str, stem_allowed: bool) -> str:
        try:
            name = onnx_wire.tensor_name(_read(path))
        except onnx_wire.WireError:
            raise OnnxoptError("INVALID_ARGUMENT", f"INPUTS_INVALID: {path} is not an ONNX TensorProto") from None
        if name or not stem_allowed:
            if not name:
                raise OnnxoptError("INVALID_ARGUMENT", f"INPUTS_INVALID: the tensor in {path} has no name, "
                                                       "so it matches no input")
            return name
        return os.path.splitext(os.path.basename(path))[0]

    sets, loose = [], {}
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if os.path.isdir(path) and entry.startswith("test_data_set_"):
            tensor_set = {}
            for file in sorted(os.listdir(path)):
                if file.startswith("input_") and file.endswith(".pb"):
                    tensor_set[name_of(os.path.join(path, file), False)] = os.path.join(path, file)
            if tensor_set:
                sets.append(tensor_set)
        elif os.path.isfile(path) and entry.endswith(".pb"):
            loose[name_of(path, True)] = path
    if loose:
        sets.insert(0, loose)
    if not sets:
        raise OnnxoptError("INVALID_ARGUMENT", f"INPUTS_INVALID: no .pb tensors in {folder} "
                                               "(nor test_data_set_N/input_K.pb)")
    return sets


def to_dict(message) -> Dict:
    """A response as a dict with the proto's field names (what `onnxopt ... --json` prints)."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
