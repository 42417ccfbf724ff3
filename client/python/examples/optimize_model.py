#!/usr/bin/env python3
"""Optimize a model through onnxopt-server from Python: Client.optimize uploads it with its external
data (resumable chunks, SHA-256), queues a job, follows it through server restarts, and downloads the
optimized model, its data file and its report, verified, as `onnxopt submit MODEL -o OUTPUT` does.

    python3 -m venv --system-site-packages .venv
    .venv/bin/pip install --no-build-isolation ./client/python
    .venv/bin/python client/python/examples/optimize_model.py model.onnx out/model.onnx --label team=search

Prints one JSON object at the end: the job's name and state, the files written, nodes, speedup.
Exit codes as the CLI's: 0 ok, 1 job failed, 3 server error, 4 cancelled, 5 input rejected.
"""
import argparse
import json
import os
import sys

from onnxopt_client import Client, OnnxoptError
from onnxopt.v1 import service_pb2

REJECTED = {"INVALID_ARGUMENT", "NOT_FOUND", "DATA_LOSS", "FAILED_PRECONDITION", "OUT_OF_RANGE", "ALREADY_EXISTS"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="the .onnx file; the external data files it names are uploaded with it")
    parser.add_argument("output", help="the optimized model (OUTPUT.data, OUTPUT.report.json beside it)")
    parser.add_argument("--server", default=os.environ.get("ONNXOPT_SERVER", "127.0.0.1:50051"))
    parser.add_argument("--preset", default="auto")
    parser.add_argument("--dim", action="append", default=[], help="NAME=N, a dynamic dimension for validation")
    parser.add_argument("--inputs", help="real inputs: DIR/NAME.pb or DIR/test_data_set_N/input_K.pb (TensorProtos)")
    parser.add_argument("--label", action="append", default=[], help="KEY=VALUE, kept on the job")
    parser.add_argument("--timeout", type=float, help="seconds for the whole round trip")
    parser.add_argument("--request-id", default=None, help="default: derived from the request, so a rerun "
                                                            "attaches to the same job")
    args = parser.parse_args()

    config = {"preset": args.preset}
    for dim in args.dim:
        name, _, value = dim.partition("=")
        if not name or not value.isdigit() or int(value) < 1:
            parser.error(f"--dim {dim}: use NAME=N with N >= 1")
        config.setdefault("validation", {}).setdefault("dimValues", {})[name] = int(value)
    labels = {}
    for label in args.label:
        key, equals, value = label.partition("=")
        if not equals:
            parser.error(f"--label {label}: use KEY=VALUE")
        labels[key] = value

    def show(job):
        state = service_pb2.JobState.Name(job.state)
        phase = service_pb2.JobPhase.Name(job.progress.phase)
        print(f"{job.name} {state} {phase} {job.progress.current_pass}", file=sys.stderr)

    try:
        with Client(args.server) as client:
            result = client.optimize(args.model, args.output, config, inputs=args.inputs, labels=labels,
                                     timeout=args.timeout, request_id=args.request_id, on_event=show)
    except OnnxoptError as e:
        print(f"onnxopt: {e}", file=sys.stderr)
        if e.job is not None:  # the job ran and ended FAILED or CANCELLED
            print(json.dumps({"job": e.job.name, "state": service_pb2.JobState.Name(e.job.state),
                              "error": e.message}, indent=1))
            return 4 if e.job.state == service_pb2.CANCELLED else 1
        return 5 if e.code in REJECTED else 3
    except OSError as e:  # a model or data file that cannot be read
        print(f"onnxopt: {e}", file=sys.stderr)
        return 5
    job = result.job
    print(json.dumps({"job": job.name, "state": service_pb2.JobState.Name(job.state), "model": result.model,
                      "files": result.files, "report": result.report_path, "labels": dict(job.labels),
                      "nodes_before": job.result.nodes_before, "nodes_after": job.result.nodes_after,
                      "parity_passed": job.result.parity_passed, "speedup": job.result.speedup}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
